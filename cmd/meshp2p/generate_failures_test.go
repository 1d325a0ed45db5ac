package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/internal/failfile"
	"github.com/neuron-tai/meshp2p/session"
)

func randomPeer(t *testing.T) peer.ID {
	t.Helper()
	_, pub, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	id, err := peer.IDFromPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// cacheHome points os.UserCacheDir at a temporary directory.
func cacheHome(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	t.Setenv("XDG_CACHE_HOME", dir)
	t.Setenv("HOME", dir)
	got, err := os.UserCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// A peer blamed in one run of generate is avoided by the next: without
// --data-dir the memory lives in the user's cache directory, per network;
// with it, in the data dir.
func TestGenerateFailureMemoryBetweenRuns(t *testing.T) {
	cache := cacheHome(t)
	liar := randomPeer(t)
	run := func(args ...string) (*session.FailureMemory, func()) {
		g, err := parseGenerate(io.Discard, io.Discard, append([]string{"--model", "m", "--prompt", "p"}, args...))
		if err != nil {
			t.Fatal(err)
		}
		dd := t.TempDir() // the temporary data dir of a run without --data-dir
		if g.explicitDD {
			dd = g.nf.dataDir
		}
		return g.failureMemory(dd)
	}

	m, save := run("--network", "failnet")
	if m.Avoided(liar) {
		t.Fatal("a fresh cache avoids a peer")
	}
	m.Blame(liar)
	save()
	if _, err := os.Stat(filepath.Join(cache, "meshp2p", "failnet", failfile.FileName)); err != nil {
		t.Fatalf("no failure file in the cache directory: %v", err)
	}
	if m, _ := run("--network", "failnet"); !m.Avoided(liar) {
		t.Fatal("the next run does not avoid the peer the last one blamed")
	}
	if m, _ := run("--network", "othernet"); m.Avoided(liar) {
		t.Fatal("another network's run avoids the peer")
	}
	// A conviction lasts: the run after one that convicted a peer (an
	// audit caught it) never routes through it (issue 37, row 9).
	convict := randomPeer(t)
	m, save = run("--network", "failnet")
	m.Convict(convict)
	save()
	if m, _ := run("--network", "failnet"); !m.Convicted(convict) {
		t.Fatal("the next run forgot the peer the last one convicted")
	}

	dd := t.TempDir()
	m, save = run("--network", "ddnet", "--data-dir", dd)
	m.Blame(liar)
	save()
	if _, err := os.Stat(filepath.Join(dd, failfile.FileName)); err != nil {
		t.Fatalf("with --data-dir, no failure file there: %v", err)
	}
	if _, err := os.Stat(filepath.Join(cache, "meshp2p", "ddnet")); !os.IsNotExist(err) {
		t.Fatalf("with --data-dir, the cache directory was used: %v", err)
	}
}

// runSwarm loads the file before its node starts and saves it when the
// run fails too: an entry ending beyond the TTL, loaded, is written back
// cut to it.
func TestGenerateSavesFailureMemoryOnError(t *testing.T) {
	cache := cacheHome(t)
	path := filepath.Join(cache, "meshp2p", "failsave", failfile.FileName)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	liar := randomPeer(t)
	far := time.Now().Add(24 * time.Hour).UTC()
	seed, _ := json.Marshal(map[string]any{"version": failfile.Version, "peers": []map[string]any{{"peer": liar.String(), "until": far}}})
	if err := os.WriteFile(path, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// A bootstrap peer nobody runs: the run starts its node, then fails.
	err := runGenerate(ctx, io.Discard, io.Discard, []string{"--network", "failsave", "--listen", "/ip4/127.0.0.1/tcp/0", "--test-mode",
		"--bootstrap", "/ip4/127.0.0.1/tcp/9/p2p/" + randomPeer(t).String(),
		"--model", "0123456789abcdef0123", "--prompt", "p", "--wait", "200ms"})
	if err == nil {
		t.Fatal("a generation without peers succeeded")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Peers []struct {
			Peer  string    `json:"peer"`
			Until time.Time `json:"until"`
		} `json:"peers"`
	}
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	if len(f.Peers) != 1 || f.Peers[0].Peer != liar.String() || !f.Peers[0].Until.Before(time.Now().Add(session.DefaultFailureTTL+time.Minute)) {
		t.Fatalf("after a failed run the file holds %s: want the peer, its end cut to the TTL", b)
	}
}
