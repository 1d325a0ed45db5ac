package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/p2p"
)

func runKeyArgs(args ...string) (stdout, stderr string, err error) {
	var o, e bytes.Buffer
	err = runKey(context.Background(), &o, &e, args)
	return o.String(), e.String(), err
}

func TestKeyShow(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "node")
	out1, _, err := runKeyArgs("show", "--data-dir", dir)
	if err != nil {
		t.Fatal(err)
	}
	id, err := peer.Decode(strings.TrimSpace(out1))
	if err != nil {
		t.Fatalf("show printed %q, not a peer id: %v", out1, err)
	}
	st, err := os.Stat(filepath.Join(dir, p2p.IdentityFile))
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("identity mode %v, want 0600", st.Mode().Perm())
	}
	out2, _, err := runKeyArgs("show", "--data-dir", dir)
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(out2) != id.String() {
		t.Fatalf("second show printed %q, want %s", out2, id)
	}
}

var swarmKeyRE = regexp.MustCompile(`^/key/swarm/psk/1\.0\.0/\n/base16/\n[0-9a-f]{64}\n$`)

func TestKeySwarmGen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "swarm.key")
	out, _, err := runKeyArgs("swarm-gen", "-o", path)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !swarmKeyRE.Match(raw) {
		t.Fatalf("swarm.key = %q, wrong format", raw)
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o600 {
		t.Fatalf("swarm.key mode %v, want 0600", st.Mode().Perm())
	}
	if strings.Contains(out, string(raw[len(raw)-65:len(raw)-1])) {
		t.Fatal("swarm-gen printed the key itself")
	}
	if _, _, err := runKeyArgs("swarm-gen", "-o", path); err == nil || errors.Is(err, errUsage) {
		t.Fatalf("second swarm-gen to the same file: err = %v, want a refusal", err)
	}
	if again, _ := os.ReadFile(path); !bytes.Equal(again, raw) {
		t.Fatal("existing swarm.key was overwritten")
	}

	stdout, _, err := runKeyArgs("swarm-gen", "-o", "-")
	if err != nil || !swarmKeyRE.MatchString(stdout) {
		t.Fatalf("swarm-gen -o - printed %q (err %v)", stdout, err)
	}
}

func TestKeyUsage(t *testing.T) {
	for _, args := range [][]string{
		nil,
		{"frobnicate"},
		{"show", "extra"},
		{"show", "--bogus"},
		{"swarm-gen", "-o"},
	} {
		if _, _, err := runKeyArgs(args...); !errors.Is(err, errUsage) {
			t.Errorf("key %q: err = %v, want errUsage", args, err)
		}
	}
}
