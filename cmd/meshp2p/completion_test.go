package main

import (
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/neuron-tai/meshp2p/internal/testbin"
)

// `meshp2p completion bash` completes commands, subcommands and each
// command's flags in a real bash; the fish script names the same.
func TestCompletion(t *testing.T) {
	bin := testbin.CLI(t)
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	for _, tc := range []struct {
		words []string // the command line so far; the last is the word completed
		want  string
	}{
		{[]string{"gen"}, "generate"},
		{[]string{"chat", "--sys"}, "--system"},
		{[]string{"start", "--prefix-c"}, "--prefix-cache"},
		{[]string{"shard", "sp"}, "split"},
		{[]string{"shard", "split", "--ran"}, "--ranges"},
		{[]string{"completion", "fi"}, "fish"},
		{[]string{"serve", "--chat-t"}, "--chat-template"},
	} {
		words := "meshp2p " + strings.Join(tc.words, " ")
		script := `source <("$BIN" completion bash) && COMP_WORDS=(` + words + `) && COMP_CWORD=` + strconv.Itoa(len(tc.words)) + ` && _meshp2p && echo "${COMPREPLY[@]}"`
		cmd := exec.Command("bash", "-c", script)
		cmd.Env = append(cmd.Environ(), "BIN="+bin)
		out, err := cmd.CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != tc.want {
			t.Fatalf("completing %q: %q (%v), want %q", words, out, err, tc.want)
		}
	}
	out, err := exec.Command(bin, "completion", "fish").Output()
	if err != nil || !strings.Contains(string(out), "complete -c meshp2p -n '__fish_seen_subcommand_from chat' -l system") {
		t.Fatalf("fish script: %v\n%s", err, out)
	}
	if out, err := exec.Command(bin, "completion", "tcsh").CombinedOutput(); err == nil || !strings.Contains(string(out), "bash, zsh or fish") {
		t.Fatalf("an unknown shell: %v %s", err, out)
	}
}
