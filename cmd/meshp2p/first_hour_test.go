package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/multiformats/go-multiaddr"

	"github.com/neuron-tai/meshp2p/client"
	"github.com/neuron-tai/meshp2p/internal/testmodels"
	"github.com/neuron-tai/meshp2p/p2p"
	"github.com/neuron-tai/meshp2p/route"
)

// Issue 41's first hour: the mistakes of a new user, each answered with
// an error that says what is wrong, as soon as that is known. Times are
// logged; bounds are generous (a busy machine must not flake them): what
// they catch is the old behaviour, the whole --wait of 30 s.

// timed runs f and returns its error and how long it took.
func timed(f func() error) (time.Duration, error) {
	start := time.Now()
	err := f()
	return time.Since(start), err
}

// checkErr fails unless err says every one of want; it logs err and took.
func checkErr(t *testing.T, what string, err error, took, bound time.Duration, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: no error", what)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Fatalf("%s: error %q does not say %q", what, err, w)
		}
	}
	t.Logf("%s: after %v: %v", what, took.Round(time.Millisecond), err)
	if took > bound {
		t.Fatalf("%s took %v (bound %v)", what, took, bound)
	}
}

var firstNet = []string{"--network", "firsthour", "--listen", "/ip4/127.0.0.1/tcp/0", "--test-mode"}

// generateErr runs generate with the default --wait (30 s) and returns
// its error and how long it took.
func generateErr(args ...string) (time.Duration, error) {
	return timed(func() error {
		return runGenerate(context.Background(), &syncBuf{}, &syncBuf{}, append(append([]string{"--prompt", "Once", "--max-tokens", "2"}, firstNet...), args...))
	})
}

// A second node on a port in use, or in a data dir in use, fails at once
// and says which port, or which process holds the dir; the first node
// keeps its node.json.
func TestStartCollisionsFail(t *testing.T) {
	model := testmodels.Path(t, "stories260K.gguf")
	dir := t.TempDir()
	addr, _ := startNode(t, filepath.Join(dir, "a"), append([]string{"--model", model, "--layers", "0-5"}, firstNet...)...)
	a, err := multiaddr.NewMultiaddr(addr)
	if err != nil {
		t.Fatal(err)
	}
	port, err := a.ValueForProtocol(multiaddr.P_TCP)
	if err != nil {
		t.Fatal(err)
	}
	info, _ := os.ReadFile(filepath.Join(dir, "a", "node.json"))
	start := func(dataDir string, args ...string) (time.Duration, error) {
		return timed(func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			return runStart(ctx, &syncBuf{}, &syncBuf{}, append([]string{"--model", model, "--layers", "0-5", "--network", "firsthour", "--test-mode", "--data-dir", dataDir}, args...))
		})
	}
	took, err := start(filepath.Join(dir, "b"), "--listen", "/ip4/127.0.0.1/tcp/"+port)
	checkErr(t, "port in use", err, took, 10*time.Second, "port "+port+" is in use", "/ip4/127.0.0.1/tcp/"+port)
	if !errors.Is(err, p2p.ErrPortInUse) {
		t.Fatalf("port in use: %v is not ErrPortInUse", err)
	}
	took, err = start(filepath.Join(dir, "a"), "--listen", "/ip4/127.0.0.1/tcp/0")
	checkErr(t, "data dir in use", err, took, 10*time.Second, fmt.Sprintf("pid %d", os.Getpid()), filepath.Join(dir, "a"))
	if now, _ := os.ReadFile(filepath.Join(dir, "a", "node.json")); string(now) != string(info) {
		t.Fatalf("the second node rewrote node.json:\n%s\nwas\n%s", now, info)
	}
	took, err = start(filepath.Join(dir, "c"), "--layers", "3-2")
	checkErr(t, "--layers 3-2", err, took, 10*time.Second, `--layers "3-2"`, "half-open", "A < B", "0-12 serves layers 0..11")
}

// generate's mistakes against a swarm of one node serving layers 0-3 of
// stories260K's 5: no --bootstrap, a misspelt model, a model whose layers
// 3-5 nobody serves, and a bootstrap address that accepts connections but
// never answers.
func TestGenerateFailsFast(t *testing.T) {
	model := testmodels.Path(t, "stories260K.gguf")
	boot, _ := startNode(t, t.TempDir(), append([]string{"--model", model, "--layers", "0-3"}, firstNet...)...)
	head := boot[strings.LastIndex(boot, "/")+1:]

	took, err := generateErr("--model", "stories260K")
	checkErr(t, "no --bootstrap", err, took, 10*time.Second, "--join and --bootstrap are not set")

	took, err = generateErr("--model", "storie260k", "--bootstrap", boot)
	checkErr(t, "misspelt model", err, took, 10*time.Second, `"storie260k"`, "the swarm serves: stories260K", `did you mean "stories260K"?`, "connected to 1 peer")
	if !errors.Is(err, client.ErrModelNotFound) {
		t.Fatalf("misspelt model: %v is not ErrModelNotFound", err)
	}
	took, err = generateErr("--model", "llama-70b", "--bootstrap", boot)
	checkErr(t, "unknown model", err, took, 10*time.Second, "the swarm serves: stories260K")
	if strings.Contains(err.Error(), "did you mean") {
		t.Fatalf("unknown model: suggests a model nothing like it: %v", err)
	}

	took, err = generateErr("--model", "stories260K", "--bootstrap", boot)
	checkErr(t, "missing layers", err, took, 10*time.Second, "no node serves layers 3-5 of 5 in model stories260K", "served: 0-3 by "+head)
	if !errors.Is(err, route.ErrNoRoute) {
		t.Fatalf("missing layers: %v is not ErrNoRoute", err)
	}

	// A TCP endpoint that accepts and never speaks: known only by waiting
	// out go-libp2p's dial timeout (5 s on loopback, 15 s beyond).
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		var held []net.Conn // accepted, never answered
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	silent := fmt.Sprintf("/ip4/127.0.0.1/tcp/%d", l.Addr().(*net.TCPAddr).Port)
	took, err = generateErr("--model", "stories260K", "--bootstrap", silent+"/p2p/"+randomPeer(t).String())
	checkErr(t, "silent endpoint", err, took, 20*time.Second, "no answer from "+silent)
	if strings.Contains(err.Error(), "swarm key") {
		t.Fatalf("silent endpoint blamed on a swarm key: %v", err)
	}
}

// serveOnce runs `serve` in dir ("": the default data dir) until it is
// ready and returns its peer id; the run ends when stop is called.
func serveOnce(t *testing.T, dir string) (id string, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out, logs := &syncBuf{}, &syncBuf{}
	done := make(chan error, 1)
	args := append([]string{"--api", "127.0.0.1:0", "--bootstrap", "/ip4/127.0.0.1/tcp/9/p2p/" + randomPeer(t).String()}, firstNet...)
	if dir != "" {
		args = append(args, "--data-dir", dir)
	}
	go func() { done <- runServe(ctx, out, logs, args) }()
	stop = func() { cancel(); <-done }
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if s := out.String(); strings.Contains(s, "\nready\n") {
			id, _, _ = strings.Cut(s[strings.Index(s, "peer id:")+len("peer id:"):], "\n")
			return strings.TrimSpace(id), stop
		}
		select {
		case err := <-done:
			t.Fatalf("serve exited: %v\n%s", err, logs.String())
		default:
		}
		if time.Now().After(deadline) {
			stop()
			t.Fatalf("serve not ready:\n%s", logs.String())
		}
	}
}

// A client's identity lasts: `serve` restarted (default data dir, or
// --data-dir) has the same peer id, which --trusted-client can name; it is
// client.key, not the identity.key of a node in the same directory; and a
// second run at the same time works, with a temporary identity of its own.
func TestClientIdentityLasts(t *testing.T) {
	t.Setenv("MESHP2P_DATA_DIR", t.TempDir()) // the default data dir: this test's alone
	for _, dir := range []string{"", t.TempDir()} {
		first, stop := serveOnce(t, dir)
		stop()
		again, stop := serveOnce(t, dir)
		concurrent, stop2 := serveOnce(t, dir)
		stop2()
		stop()
		if first == "" || first != again {
			t.Fatalf("data dir %q: serve's peer id changed on restart: %s, then %s", dir, first, again)
		}
		if concurrent == first {
			t.Fatalf("data dir %q: two serve runs at once share peer id %s", dir, first)
		}
		t.Logf("data dir %q: serve %s twice, %s beside it", dir, first, concurrent)
		if dir == "" {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, p2p.ClientIdentityFile)); err != nil {
			t.Fatal(err)
		}
		key, _, err := p2p.LoadOrCreateIdentity(dir) // a node's identity.key in the same dir
		if err != nil {
			t.Fatal(err)
		}
		if id, _ := peer.IDFromPrivateKey(key); id.String() == first {
			t.Fatalf("the client has the node's identity %s", id)
		}
	}
}
