package main

import (
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/neuron-tai/meshp2p/internal/testbin"
	"github.com/neuron-tai/meshp2p/p2p"
)

// readmeCommand is one command of a ```sh block of the README, with the
// machine the text says it runs on ("" before any "On machine X").
type readmeCommand struct {
	line    int // 1-based, of its first line
	text    string
	machine string
}

var onMachine = regexp.MustCompile(`\bOn machine ([A-Z])\b`)

// readmeCommands are the commands of the README's ```sh blocks (lines
// ending in \ joined; blank and comment lines left out).
func readmeCommands(t *testing.T, readme string) []readmeCommand {
	t.Helper()
	var cmds []readmeCommand
	machine, inBlock, cont, first := "", false, "", 0
	for i, l := range strings.Split(readme, "\n") {
		switch {
		case strings.HasPrefix(l, "```"):
			inBlock = l == "```sh"
			continue
		case !inBlock:
			if m := onMachine.FindStringSubmatch(l); m != nil {
				machine = m[1]
			}
			continue
		}
		t := strings.TrimSpace(l)
		if cont == "" && (t == "" || strings.HasPrefix(t, "#")) {
			continue
		}
		if cont == "" {
			first = i + 1
		}
		if s, ok := strings.CutSuffix(t, `\`); ok {
			cont += strings.TrimSpace(s) + " "
			continue
		}
		cmds = append(cmds, readmeCommand{line: first, text: cont + t, machine: machine})
		cont = ""
	}
	return cmds
}

// readmeRun is the README's quickstart being run: a work directory with
// bin/meshp2p and models/stories260K.gguf as a clone has them, a data
// directory and listen port per machine, the processes left running.
type readmeRun struct {
	t       *testing.T
	root    string // the repository
	bin     string
	work    string
	ports   map[string]int
	bootA   string // machine A's address on loopback
	token   string // the join token invite printed on machine A
	procs   []*bgProc
	outputs map[string]string // by command kind: what it printed
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// prepare turns a README command into what runs here: the machines'
// listen address 0.0.0.0:4001 is one loopback port per machine, the
// API's 8080 a free port.
func (r *readmeRun) prepare(c readmeCommand) *exec.Cmd {
	s := c.text
	if c.machine != "" {
		if r.ports[c.machine] == 0 {
			r.ports[c.machine] = freePort(r.t)
		}
		s = strings.ReplaceAll(s, "/ip4/0.0.0.0/tcp/4001", "/ip4/127.0.0.1/tcp/"+strconv.Itoa(r.ports[c.machine]))
	}
	if r.ports["api"] == 0 {
		r.ports["api"] = freePort(r.t)
	}
	s = strings.ReplaceAll(s, "127.0.0.1:8080", "127.0.0.1:"+strconv.Itoa(r.ports["api"]))
	cmd := exec.Command("sh", "-c", "exec "+s)
	cmd.Dir = r.work
	home := filepath.Join(r.work, "home-"+c.machine)
	cmd.Env = append(os.Environ(), "HOME="+home, "MESHP2P_DATA_DIR="+filepath.Join(home, ".meshp2p"), "J="+r.token, joinEnv+"=",
		"XDG_CACHE_HOME="+filepath.Join(home, ".cache"))
	return cmd
}

// bgProc is a command running in the background.
type bgProc struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when it exited
}

// background starts a command that serves until stopped (start, serve)
// and waits for its "ready" line.
func (r *readmeRun) background(c readmeCommand) string {
	cmd := r.prepare(c)
	out, log := &syncBuf{}, &syncBuf{}
	cmd.Stdout, cmd.Stderr = out, log
	if err := cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	p := &bgProc{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	r.procs = append(r.procs, p)
	for deadline := time.Now().Add(90 * time.Second); !regexp.MustCompile(`(?m)^ready`).MatchString(out.String()); time.Sleep(50 * time.Millisecond) {
		exited := false
		select {
		case <-p.done:
			exited = true
		default:
		}
		if time.Now().After(deadline) || exited {
			r.t.Fatalf("README line %d (%s): not ready\nstdout:\n%s\nstderr:\n%s", c.line, c.text, out.String(), log.String())
		}
	}
	return out.String()
}

// foreground runs a command to its end; it must exit 0.
func (r *readmeRun) foreground(c readmeCommand) (stdout, stderr string) {
	cmd := r.prepare(c)
	var out, errb syncBuf
	cmd.Stdout, cmd.Stderr = &out, &errb
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			r.t.Fatalf("README line %d (%s): %v\nstdout:\n%s\nstderr:\n%s", c.line, c.text, err, out.String(), errb.String())
		}
	case <-time.After(3 * time.Minute):
		_ = cmd.Process.Kill() // ours, by PID
		r.t.Fatalf("README line %d (%s): still running after 3 min\nstdout:\n%s\nstderr:\n%s", c.line, c.text, out.String(), errb.String())
	}
	return out.String(), errb.String()
}

func (r *readmeRun) stop() {
	for _, p := range r.procs {
		_ = p.cmd.Process.Signal(syscall.SIGTERM) // ours, by PID
	}
	for _, p := range r.procs {
		select {
		case <-p.done:
		case <-time.After(15 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
}

// Issue 41 item 5: the README opens with make demo and make test, its
// quickstart is at most 120 lines, and every command in it runs here as
// written (the machines' 0.0.0.0:4001 becoming loopback ports, A and B
// data directories of their own, one work directory standing for both
// clones), with what each must show: the demo's check, the swarm's story
// equal to --local, status naming the model, and the OpenAI and
// Anthropic replies of the gateway, ChatML-templated. Only the two
// install lines that need root and the network are not run (make build
// is the build this test runs).
func TestReadmeQuickstart(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the README's swarm")
	}
	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatal("the README's API calls need curl (its install line installs it)")
	}
	root, _ := filepath.Abs(filepath.Join("..", ".."))
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	lines := strings.Split(readme, "\n")
	if len(lines) < 6 || lines[2] != "```sh" || !strings.HasPrefix(lines[3], "make demo ") || !strings.HasPrefix(lines[4], "make test ") {
		t.Fatalf("the README does not open with make demo and make test:\n%s", strings.Join(lines[:min(6, len(lines))], "\n"))
	}
	if n := strings.Count(readme, "\n"); n > 120 {
		t.Fatalf("the README is %d lines: the quickstart should be at most ~120, the reference in docs/", n)
	}
	cmds := readmeCommands(t, readme[strings.Index(readme, "## Quickstart"):])
	r := &readmeRun{t: t, root: root, bin: testbin.CLI(t), work: t.TempDir(), ports: map[string]int{}, outputs: map[string]string{}}
	defer r.stop()
	for _, link := range [][2]string{{r.bin, "bin/meshp2p"}, {filepath.Join(root, "models", "stories260K.gguf"), "models/stories260K.gguf"}} {
		if err := os.MkdirAll(filepath.Join(r.work, filepath.Dir(link[1])), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(link[0], filepath.Join(r.work, link[1])); err != nil {
			t.Fatal(err)
		}
	}
	var notRun []string
	for _, c := range cmds {
		start := time.Now()
		kind := r.runReadme(c, &notRun)
		t.Logf("README line %d, machine %q, %s: %s (%v)", c.line, c.machine, kind, c.text, time.Since(start).Round(time.Millisecond))
	}
	r.checkOutputs(notRun)
}

// runReadme runs one README command and returns what kind it was.
func (r *readmeRun) runReadme(c readmeCommand, notRun *[]string) string {
	t := r.t
	switch f := strings.Fields(c.text); {
	case f[0] == "sudo" || f[0] == "git":
		*notRun = append(*notRun, c.text) // root and the network
		return "not run"
	case c.text == "make build":
		return "built (testbin.CLI: make build's go build)"
	case c.text == "make demo": // what make demo runs after make build
		cmd := exec.Command("sh", "scripts/demo.sh")
		cmd.Dir, cmd.Env = r.root, append(os.Environ(), "BIN="+r.bin, "TMPDIR="+t.TempDir())
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "== OK: the swarm's") {
			t.Fatalf("make demo: %v\n%s", err, out)
		}
		return "demo"
	case strings.HasPrefix(c.text, "J="):
		if !strings.HasPrefix(c.text, "J=mp1_...") || r.token == "" {
			t.Fatalf("README line %d: %q is not the token machine A's invite printed", c.line, c.text)
		}
		return "A's join token"
	case len(f) >= 2 && f[0] == "bin/meshp2p" && f[1] == "invite":
		out, errs := r.foreground(c)
		r.token = strings.TrimSpace(out)
		tok, err := p2p.DecodeJoinToken(r.token)
		if err != nil || len(tok.Bootstrap) != 1 || tok.Bootstrap[0].ID.String() != r.bootA[strings.LastIndex(r.bootA, "/")+1:] ||
			tok.Network != "mynet" || !strings.Contains(errs, "SECRET") {
			t.Fatalf("README line %d: invite printed %q (%v), stderr %q; want a token for A (%s)", c.line, out, err, errs, r.bootA)
		}
		return "A's invite"
	case len(f) > 2 && f[0] == "bin/meshp2p" && (f[1] == "start" || f[1] == "serve") && f[2] != "--help":
		out := r.background(c)
		if c.machine == "A" && f[1] == "start" {
			port := strconv.Itoa(r.ports["A"])
			m := regexp.MustCompile(`(?m)^address:\s+(/ip4/127\.0\.0\.1/tcp/` + port + `/p2p/\S+)$`).FindStringSubmatch(out)
			if m == nil {
				t.Fatalf("machine A printed no address on port %s:\n%s", port, out)
			}
			r.bootA = m[1]
		}
		return "running"
	default:
		out, errs := r.foreground(c)
		key := f[0]
		if len(f) > 2 {
			key += " " + f[1] + " " + f[2]
		}
		r.outputs[key] = out
		r.outputs[key+" stderr"] = errs
		return "ran"
	}
}

// checkOutputs checks what the README's commands printed.
func (r *readmeRun) checkOutputs(notRun []string) {
	t := r.t
	if len(notRun) != 2 {
		t.Fatalf("README commands not run: %q; want only the install's apt-get and git clone", notRun)
	}
	if _, err := os.Stat(filepath.Join(r.work, "swarm.key")); err != nil {
		t.Fatalf("key swarm-gen wrote no swarm.key: %v", err)
	}
	if st := r.outputs["bin/meshp2p status --join"]; !strings.Contains(st, "stories260K") {
		t.Fatalf("status does not show the model:\n%s", st)
	}
	swarm, local := r.outputs["bin/meshp2p generate --model"], r.outputs["bin/meshp2p generate --local"]
	// Quiet: the story on stdout and nothing on stderr.
	if errs := r.outputs["bin/meshp2p generate --model stderr"]; !strings.Contains(swarm, "Lily") || swarm != local || errs != "" {
		t.Fatalf("generate through the swarm printed %q (stderr %q), --local %q", swarm, r.outputs["bin/meshp2p generate --model stderr"], local)
	}
	if talk := r.outputs[`echo "Tell me`]; strings.TrimSpace(talk) == "" {
		t.Fatalf("chat through the swarm printed nothing (stderr %q)", r.outputs[`echo "Tell me stderr`])
	}
	var chat struct {
		Choices []struct {
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal([]byte(r.outputs["curl -s http://127.0.0.1:8080/v1/chat/completions"]), &chat); err != nil || len(chat.Choices) != 1 || chat.Choices[0].Message.Content == "" {
		t.Fatalf("OpenAI chat: %v\n%s", err, r.outputs["curl -s http://127.0.0.1:8080/v1/chat/completions"])
	}
	var msg struct {
		Content []struct{ Type, Text string } `json:"content"`
	}
	if err := json.Unmarshal([]byte(r.outputs["curl -s http://127.0.0.1:8080/v1/messages"]), &msg); err != nil || len(msg.Content) == 0 || msg.Content[0].Text == "" {
		t.Fatalf("Anthropic message: %v\n%s", err, r.outputs["curl -s http://127.0.0.1:8080/v1/messages"])
	}
	if in := r.outputs["bin/meshp2p shard inspect"]; !strings.Contains(in, "architecture  llama") {
		t.Fatalf("shard inspect:\n%s", in)
	}
	if help := r.outputs["bin/meshp2p start --help"]; !strings.HasPrefix(help, "Usage: meshp2p start") || !strings.Contains(help, "\nCommon flags:\n") {
		t.Fatalf("start --help:\n%s", help)
	}
	t.Logf("story %q; OpenAI %q; Anthropic %q", swarm, chat.Choices[0].Message.Content, msg.Content[0].Text)
}
