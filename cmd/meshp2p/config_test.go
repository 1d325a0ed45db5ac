package main

import (
	"encoding/json"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/neuron-tai/meshp2p/internal/testbin"
)

// The config file sets the flags the command line leaves unset: the top
// level for every command with the flag, a [command] section over it, the
// command line over both; a section's unknown key and bad syntax are
// errors naming the line.
func TestConfigFile(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		args       []string
		want       map[string]string // flag -> value after parsing
		err        string            // an error containing this
	}{
		{"top level", "bootstrap = \"/ip4/1.2.3.4/tcp/1/p2p/x\"\nother-commands-flag = 3\n", nil,
			map[string]string{"bootstrap": "/ip4/1.2.3.4/tcp/1/p2p/x", "max-tokens": "64"}, ""},
		{"section wins", "max-tokens = 10\n[generate]\nmax-tokens = 20 # comment\n[start]\nmemory = \"1G\"\n", nil,
			map[string]string{"max-tokens": "20"}, ""},
		{"command line wins", "[generate]\nmax-tokens = 20\nmmap = false\n", []string{"--max-tokens", "5"},
			map[string]string{"max-tokens": "5", "mmap": "false"}, ""},
		{"list", "[generate]\nstop = [\"\\n\\n\", \"THE # END\"] # two\n", nil,
			map[string]string{"stop": "\n\n,THE # END"}, ""},
		{"typo in a section", "[generate]\n\nmax-tokes = 3\n", nil, nil, "config.toml:3: meshp2p generate has no flag --max-tokes"},
		{"bad value", "[generate]\nmax-tokens = lots\n", nil, nil, "config.toml:2: max-tokens"},
		{"unterminated", "bootstrap = \"/ip4\n", nil, nil, "line 1: bootstrap: unterminated string"},
		{"no value", "[generate]\nmax-tokens =\n", nil, nil, "line 2: max-tokens: no value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "config.toml")
			if err := os.WriteFile(path, []byte(tc.file), 0o600); err != nil {
				t.Fatal(err)
			}
			fs := flag.NewFlagSet("generate", flag.ContinueOnError)
			fs.String("bootstrap", "", "")
			fs.Int("max-tokens", 64, "")
			fs.Bool("mmap", true, "")
			fs.String("stop", "", "")
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			err := applyConfig(fs, path)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range tc.want {
				if got := fs.Lookup(k).Value.String(); got != v {
					t.Fatalf("--%s = %q, want %q", k, got, v)
				}
			}
		})
	}
	if err := applyConfig(flag.NewFlagSet("generate", flag.ContinueOnError), filepath.Join(t.TempDir(), "none.toml")); err != nil {
		t.Fatalf("a missing config file: %v", err)
	}
}

// Through the binary: $MESHP2P_CONFIG's [generate] max-tokens applies to
// generate --local, and --max-tokens on the command line wins.
func TestConfigFileCLI(t *testing.T) {
	bin := testbin.CLI(t)
	cfg := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(cfg, []byte("[generate]\nmax-tokens = 3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	count := func(args ...string) int {
		cmd := exec.Command(bin, append([]string{"generate", "--local", "--model", "../../models/stories260K.gguf", "--prompt", "Once upon a time", "--json"}, args...)...)
		cmd.Env = append(os.Environ(), configEnv+"="+cfg)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		var res struct{ Tokens []int32 }
		if err := json.Unmarshal(out, &res); err != nil {
			t.Fatal(err)
		}
		return len(res.Tokens)
	}
	if n := count(); n != 3 {
		t.Fatalf("with max-tokens = 3 in the config: %d tokens", n)
	}
	if n := count("--max-tokens", "5"); n != 5 {
		t.Fatalf("--max-tokens 5 over the config's 3: %d tokens", n)
	}
}
