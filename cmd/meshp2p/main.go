// Command meshp2p runs large language models split by layers across a
// peer-to-peer mesh of ordinary computers.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// command is one subcommand. run gets the arguments after the subcommand name.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, stdout, stderr io.Writer, args []string) error
}

func commands() []command {
	return []command{
		{"start", "serve a layer range of a model to the swarm", runStart},
		{"generate", "generate text through the swarm (or --local)", runGenerate},
		{"chat", "chat with a model through the swarm (or --local), streaming", runChat},
		{"serve", "serve an OpenAI-compatible HTTP API through the swarm", runServe},
		{"ps", "list the meshp2p nodes and gateways running on this machine", runPS},
		{"status", "show the models, shards and routes the swarm offers", runStatus},
		{"tracker", "run a tracker: relay, DHT server and signed route oracle", runTracker},
		{"shard", "inspect | split | synth | verify | ls | rm: GGUF models, shards and the shard cache", runShard},
		{"invite", "print a join token for this machine's node (a secret: --join TOKEN joins its swarm)", runInvite},
		{"key", "show | swarm-gen: node identity and private-swarm keys", runKey},
		{"proof", "verify: check a fraud proof offline by replaying the hop's layers", runProof},
		{"testnet", "build a network-namespace NAT test network", runTestnet},
		{"completion", "bash | zsh | fish: print a shell completion script", runCompletion},
		{"version", "print version, llama.cpp revision, CPU features, backend libraries and devices", runVersion},
	}
}

// exitInterrupted is the exit status of a command interrupted by Ctrl-C
// or SIGTERM before it finished (128 + SIGINT, as shells report).
const exitInterrupted = 130

// errUsage marks an error caused by bad command-line usage (exit status 2).
var errUsage = errors.New("usage")

func usage(w io.Writer) {
	fmt.Fprintf(w, "meshp2p: run LLMs split by layers across a peer-to-peer mesh\n\nUsage: meshp2p <command> [flags]\n\nCommands:\n")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-9s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "\nRun 'meshp2p <command> --help' for a command's flags (--help-all: every flag).\n")
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && (args[0] == "--version" || args[0] == "-version") {
		args = append([]string{"version"}, args[1:]...)
	}
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stdout)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	for _, c := range commands() {
		if c.name != args[0] {
			continue
		}
		err := c.run(ctx, stdout, stderr, args[1:])
		switch {
		case err == nil:
			return 0
		case errors.Is(err, flag.ErrHelp):
			return 0
		case ctx.Err() != nil && errors.Is(err, context.Canceled):
			// Interrupted (Ctrl-C, SIGTERM): the user knows; the shell's
			// convention for a command ended by SIGINT, no error text.
			return exitInterrupted
		case errors.Is(err, errUsage):
			// The error first, then a short usage: not the flag list.
			path := cmdPath(args)
			fmt.Fprintf(stderr, "meshp2p %s: %v\n%s", path, err, shortUsage(path))
			return 2
		default:
			fmt.Fprintf(stderr, "meshp2p %s: %v\n", c.name, err)
			return 1
		}
	}
	fmt.Fprintf(stderr, "meshp2p: unknown command %q\n\n", args[0])
	usage(stderr)
	return 2
}
