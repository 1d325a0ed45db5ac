package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/neuron-tai/meshp2p/internal/testbin"
	"github.com/neuron-tai/meshp2p/internal/testmodels/chatmodel"
)

// chatRun runs `meshp2p chat` with stdin piped and returns stdout.
func chatRun(t *testing.T, bin, stdin string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"chat"}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	var errb strings.Builder
	cmd.Stderr = &errb
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("chat %v: %v\n%s", args, err, errb.String())
	}
	return string(out)
}

// `meshp2p chat` with piped stdin: each line a turn, the history through
// the model's chat template, one reply per line; through a 2-node swarm
// the replies equal `chat --local`'s; /bye ends the chat (the line after
// it gets no reply); a model without a chat template is refused with the
// flag that fixes it, and --chat-template chatml fixes it.
func TestChatCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	bin := testbin.CLI(t)
	model := chatmodel.ChatStories(t)
	dir := t.TempDir()
	net := []string{"--network", "chattest", "--listen", "/ip4/127.0.0.1/tcp/0"}
	head := startCLI(t, bin, filepath.Join(dir, "a"), append([]string{"--model", model, "--layers", "0-3", "--threads", "1"}, net...)...)
	startCLI(t, bin, filepath.Join(dir, "b"), append([]string{"--model", model, "--layers", "3-5", "--threads", "1", "--bootstrap", head.addr}, net...)...)

	const conv = "Tell me a story\nWhat happened next?\n/bye\nnever answered\n"
	flags := []string{"--max-tokens", "24"}
	local := chatRun(t, bin, conv, append([]string{"--local", model}, flags...)...)
	swarm := chatRun(t, bin, conv, append(append([]string{"stories-chat", "--bootstrap", head.addr}, net...), flags...)...)
	if swarm != local {
		t.Fatalf("the swarm's chat differs from --local's:\nswarm %q\nlocal %q", swarm, local)
	}
	// Replies may hold newlines themselves: split by the first turn alone.
	first := chatRun(t, bin, "Tell me a story\n", append([]string{"--local", model}, flags...)...)
	second, ok := strings.CutPrefix(local, first)
	if !ok || second == "" {
		t.Fatalf("the chat does not start with the first turn's reply %q: %q", first, local)
	}
	if both := chatRun(t, bin, "Tell me a story\nWhat happened next?\n", append([]string{"--local", model}, flags...)...); both != local {
		t.Fatalf("the line after /bye was answered: %q, without it %q", local, both)
	}
	// The second reply depends on the first turn: it is not the reply to
	// the second message alone.
	if alone := chatRun(t, bin, "What happened next?\n", append([]string{"--local", model}, flags...)...); second == alone {
		t.Fatalf("the second reply ignores the history: %q", second)
	}
	t.Logf("two turns through the swarm equal --local: %q", local)
	// Each finished session gets one summary line in the hops' logs.
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(head.log.String(), `msg="session ended"`); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no session summary in the head's log:\n%s", head.log.String())
		}
	}

	// Ctrl-C while chat waits for a line (stdin open, nothing typed):
	// it ends at once with status 130.
	idle := exec.Command(bin, "chat", "--local", model)
	stdin, err := idle.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	if err := idle.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)               // loaded, waiting for the first line
	_ = idle.Process.Signal(os.Interrupt) // by PID
	done := make(chan error, 1)
	go func() { done <- idle.Wait() }()
	select {
	case err := <-done:
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != exitInterrupted {
			t.Fatalf("chat interrupted at its prompt: %v, want exit %d", err, exitInterrupted)
		}
	case <-time.After(10 * time.Second):
		_ = idle.Process.Kill()
		t.Fatal("chat kept waiting for a line after Ctrl-C")
	}

	plain := "../../models/stories260K.gguf"
	cmd := exec.Command(bin, "chat", "--local", plain, "--max-tokens", "4")
	cmd.Stdin = strings.NewReader("hi\n")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--chat-template") {
		t.Fatalf("a model without a chat template: %v %s", err, out)
	}
	if got := chatRun(t, bin, "hi\n", "--local", plain, "--max-tokens", "4", "--chat-template", "chatml"); got == "" {
		t.Fatalf("--chat-template chatml: %q", got)
	}
}
