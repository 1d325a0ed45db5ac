package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/neuron-tai/meshp2p/client"
)

const chatUsage = `Usage:
  meshp2p chat MODEL --bootstrap ADDR [flags]
  meshp2p chat --local FILE [flags]
  printf 'first message\nsecond message\n' | meshp2p chat MODEL --bootstrap ADDR

Chats with a model through the swarm (or the whole --local FILE
in-process): each line you type is a user message, the reply streams as
it is generated, and the conversation so far goes through the model's
chat template every turn (a model without one needs --chat-template
chatml or a Jinja file). /bye, Ctrl-D or Ctrl-C ends it (Ctrl-C exits
with status 130). With stdin a pipe or a file, each line is one turn and
only the replies are printed, each followed by a newline; the first
failed turn ends the command with its error. Flags are generate's
(sampling, network, --max-tokens per reply, default 512); --system sets
a system message.
`

// defaultChatMaxTokens is a chat reply's length unless --max-tokens says
// otherwise (as the API's chat default).
const defaultChatMaxTokens = 512

func runChat(ctx context.Context, stdout, stderr io.Writer, args []string) error {
	g, system, err := parseChat(stdout, stderr, args)
	if err != nil {
		return err
	}
	tty := isTerminal(os.Stdin)
	if tty {
		fmt.Fprintf(stderr, "connecting… (model %s)\n", g.model)
	}
	gen, err := g.open(ctx, &genResult{})
	if err != nil {
		return err
	}
	defer gen.close()
	c := &chatLoop{g: g, gen: gen, out: stdout, errOut: stderr, tty: tty}
	if system != "" {
		c.history = append(c.history, client.Message{Role: "system", Content: system})
	}
	if tty {
		fmt.Fprintln(stderr, "type a message; /bye or Ctrl-D ends the chat")
	}
	return c.run(ctx, os.Stdin)
}

// parseChat parses chat's flags: generate's, MODEL as the first argument
// (or --model), --system, and no --prompt.
func parseChat(stdout, stderr io.Writer, args []string) (*genFlags, string, error) {
	g := &genFlags{fs: cmdFlagSet("chat", stdout, chatUsage)}
	system := g.fs.String("system", "", "a system message before the conversation")
	finish := g.register(defaultChatMaxTokens)
	// MODEL may come before, between or after the flags (chat --local
	// FILE --max-tokens 8): the flag package stops at it, so parsing
	// resumes after it.
	var model string
	for {
		if err := parseArgs(g.fs, args); err != nil {
			return nil, "", err
		}
		rest := g.fs.Args()
		if len(rest) == 0 {
			break
		}
		if model != "" {
			return nil, "", fmt.Errorf("%w: unexpected argument %q (one MODEL)", errUsage, rest[0])
		}
		model, args = rest[0], rest[1:]
	}
	if model != "" && g.model == "" {
		g.model = model
	}
	if g.model == "" {
		return nil, "", fmt.Errorf("%w: which model? meshp2p chat MODEL (a name or fingerprint the swarm serves, or a GGUF file with --local)", errUsage)
	}
	if g.prompt != "" {
		return nil, "", fmt.Errorf("%w: chat reads its messages from stdin; --prompt is generate's", errUsage)
	}
	if g.asJSON {
		return nil, "", fmt.Errorf("%w: --json is generate's (chat streams text)", errUsage)
	}
	return g, *system, finish(stderr)
}

// maxChatLine bounds one message read from stdin.
const maxChatLine = maxStdinPrompt

// chatLoop is one conversation.
type chatLoop struct {
	g       *genFlags
	gen     generator
	out     io.Writer
	errOut  io.Writer
	tty     bool
	history []client.Message
}

// run reads messages from in until /bye or its end, answering each; a
// cancelled ctx (Ctrl-C) ends it at once, also while it waits for a line.
func (c *chatLoop) run(ctx context.Context, in io.Reader) error {
	type line struct {
		text string
		err  error
		eof  bool
	}
	lines := make(chan line)
	next := make(chan struct{}, 1)
	go func() { // the reader: one line per request on next
		sc := bufio.NewScanner(in)
		sc.Buffer(make([]byte, 64<<10), maxChatLine)
		for range next {
			if !sc.Scan() {
				lines <- line{err: sc.Err(), eof: true}
				return
			}
			lines <- line{text: sc.Text()}
		}
	}()
	defer close(next)
	for {
		if c.tty {
			fmt.Fprint(c.out, ">>> ")
		}
		next <- struct{}{}
		var l line
		select {
		case <-ctx.Done():
			return ctx.Err()
		case l = <-lines:
		}
		if l.eof {
			if c.tty {
				fmt.Fprintln(c.out)
			}
			if l.err != nil {
				return fmt.Errorf("reading stdin: %w", l.err)
			}
			return nil
		}
		text := strings.TrimSpace(l.text)
		switch {
		case text == "":
			continue
		case text == "/bye":
			return nil
		}
		if err := c.turn(ctx, text); err != nil {
			if !c.tty || ctx.Err() != nil {
				return err
			}
			fmt.Fprintf(c.errOut, "error: %v\n", err) // the conversation goes on without this turn
		}
	}
}

// turn answers one user message, streaming the reply, and keeps both in
// the history when it succeeds.
func (c *chatLoop) turn(ctx context.Context, msg string) error {
	msgs := append(c.history[:len(c.history):len(c.history)], client.Message{Role: "user", Content: msg})
	var reply strings.Builder
	out := &genResult{}
	_, err := c.gen.run(ctx, client.Prompt{Messages: msgs}, func(d string) {
		reply.WriteString(d)
		fmt.Fprint(c.out, d)
	}, out)
	if reply.Len() > 0 || err == nil {
		fmt.Fprintln(c.out)
	}
	if err != nil {
		if errors.Is(err, client.ErrNoChatTemplate) {
			return fmt.Errorf("%w (give one: --chat-template chatml)", err)
		}
		return err
	}
	if c.tty {
		fmt.Fprintln(c.out)
	}
	c.history = append(msgs, client.Message{Role: "assistant", Content: out.Text})
	return nil
}

// isTerminal reports whether f is a character device (a terminal).
func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
