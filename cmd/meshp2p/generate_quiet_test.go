package main

import (
	"errors"
	"os/exec"
	"strings"
	"testing"

	"github.com/neuron-tai/meshp2p/internal/testbin"
	"github.com/neuron-tai/meshp2p/internal/testmodels"
)

// Issue 41 item 6: generate prints the text and nothing else; --stats adds
// the summary on stderr; the prompt comes from stdin with --prompt -, or
// without --prompt when stdin is a pipe (a final newline dropped), and
// gives the text --prompt gives.
func TestGenerateQuietStatsStdin(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the CLI")
	}
	bin := testbin.CLI(t)
	model := testmodels.Path(t, "stories260K.gguf")
	gen := func(stdin *string, args ...string) (stdout, stderr string, code int) {
		c := exec.Command(bin, append([]string{"generate", "--local", "--model", model, "--max-tokens", "12", "--threads", "1"}, args...)...)
		if stdin != nil {
			c.Stdin = strings.NewReader(*stdin) // a pipe
		}
		var out, errb strings.Builder
		c.Stdout, c.Stderr = &out, &errb
		err := c.Run()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return out.String(), errb.String(), code
	}
	text, errs, code := gen(nil, "--prompt", "Once upon a time")
	if code != 0 || strings.TrimSpace(text) == "" || !strings.HasSuffix(text, "\n") || errs != "" {
		t.Fatalf("quiet generate: exit %d, stdout %q, stderr %q (want the text alone)", code, text, errs)
	}
	out, errs, code := gen(nil, "--prompt", "Once upon a time", "--stats")
	if code != 0 || out != text || !strings.HasPrefix(errs, "12 tokens, stop=max_tokens, TTFT ") {
		t.Fatalf("--stats: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	prompt := "Once upon a time\n"
	for _, args := range [][]string{nil, {"--prompt", "-"}} {
		if out, errs, code := gen(&prompt, args...); code != 0 || out != text {
			t.Fatalf("prompt on stdin %q: exit %d, stdout %q (want %q), stderr %q", args, code, out, text, errs)
		}
	}
	empty := ""
	if _, errs, code := gen(&empty, "--prompt", "-"); code != 2 || !strings.HasPrefix(errs, "meshp2p generate: usage: --prompt -: stdin held no prompt\n") {
		t.Fatalf("--prompt - with nothing on stdin: exit %d, stderr %q", code, errs)
	}
	// stdin not a pipe (/dev/null) and no --prompt: the usage error.
	if _, errs, code := gen(nil); code != 2 || !strings.HasPrefix(errs, "meshp2p generate: usage: --model and --prompt are required") {
		t.Fatalf("no prompt: exit %d, stderr %q", code, errs)
	}
	t.Logf("text %q", text)
}
