package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/neuron-tai/meshp2p/internal/testmodels"
	"github.com/neuron-tai/meshp2p/p2p"
)

// syncBuf is a goroutine-safe buffer for a command's output.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// start serves a shard, writes node.json once ready, and shuts down cleanly
// when its context ends (what SIGINT/SIGTERM do); a thin client generates
// through a two-node swarm started the same way, and --local agrees.
func TestStartGenerateAndShutdown(t *testing.T) {
	model := testmodels.Path(t, "stories260K.gguf")
	dir := t.TempDir()
	// The flags the README gives users (loopback listening turns UPnP off).
	net := []string{"--network", "clitest", "--listen", "/ip4/127.0.0.1/tcp/0"}
	type proc struct {
		cancel context.CancelFunc
		done   chan error
		out    *syncBuf
	}
	start := func(name, layers string, extra ...string) (*proc, map[string]any) {
		ctx, cancel := context.WithCancel(context.Background())
		p := &proc{cancel: cancel, done: make(chan error, 1), out: &syncBuf{}}
		args := append([]string{"--model", model, "--layers", layers, "--data-dir", filepath.Join(dir, name)}, append(net, extra...)...)
		go func() { p.done <- runStart(ctx, p.out, &syncBuf{}, args) }()
		nj := filepath.Join(dir, name, "node.json")
		deadline := time.Now().Add(30 * time.Second)
		for {
			if b, err := os.ReadFile(nj); err == nil {
				var info map[string]any
				if json.Unmarshal(b, &info) == nil {
					return p, info
				}
			}
			select {
			case err := <-p.done:
				t.Fatalf("start %s exited: %v", name, err)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("start %s: no node.json", name)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	head, info := start("head", "0-3")
	addrs, _ := info["addrs"].([]any)
	if info["peer_id"] == "" || len(addrs) == 0 || !strings.Contains(addrs[0].(string), "/p2p/"+info["peer_id"].(string)) {
		t.Fatalf("node.json: %v", info)
	}
	boot := addrs[0].(string)
	tail, _ := start("tail", "3-5", "--bootstrap", boot)
	if !strings.Contains(head.out.String(), "peer id:") {
		t.Fatalf("start printed %q", head.out.String())
	}

	gen := func(args ...string) map[string]any {
		var out, errb syncBuf
		if err := runGenerate(context.Background(), &out, &errb, append(args, "--prompt", "Once upon a time", "--max-tokens", "12", "--json")); err != nil {
			t.Fatalf("generate %v: %v\n%s", args, err, errb.String())
		}
		var res map[string]any
		if err := json.Unmarshal([]byte(out.String()), &res); err != nil {
			t.Fatalf("generate output %q: %v", out.String(), err)
		}
		return res
	}
	local := gen("--local", "--model", model)
	swarm := gen(append([]string{"--model", "stories260K", "--bootstrap", boot, "--wait", "20s"}, net...)...)
	if local["text"] == "" || local["text"] != swarm["text"] {
		t.Fatalf("local %q, swarm %q", local["text"], swarm["text"])
	}
	// Sampled, with a seed above 2^32 and the penalty over the whole
	// context: --local and the swarm still agree token for token.
	sampled := []string{"--temperature", "0.8", "--seed", "1099511640121", "--repeat-penalty", "1.1", "--repeat-last-n", "-1"}
	localS := gen(append([]string{"--local", "--model", model}, sampled...)...)
	swarmS := gen(append(append([]string{"--model", "stories260K", "--bootstrap", boot, "--wait", "20s"}, net...), sampled...)...)
	if fmt.Sprint(localS["tokens"]) != fmt.Sprint(swarmS["tokens"]) {
		t.Fatalf("sampled: local %v, swarm %v", localS["tokens"], swarmS["tokens"])
	}
	// Without --json the text is all generate prints; --stats adds the
	// summary, the route and each hop's timing table on stderr.
	for _, stats := range []bool{false, true} {
		var out, errb syncBuf
		args := append([]string{"--model", "stories260K", "--bootstrap", boot, "--wait", "20s", "--prompt", "Once upon a time", "--max-tokens", "12"}, net...)
		if stats {
			args = append(args, "--stats")
		}
		if err := runGenerate(context.Background(), &out, &errb, args); err != nil || out.String() != swarm["text"].(string)+"\n" {
			t.Fatalf("generate (--stats %v): %v, stdout %q", stats, err, out.String())
		}
		table := strings.Contains(errb.String(), "route:\n") && strings.Contains(errb.String(), "per token (ms):") && strings.HasPrefix(errb.String(), "12 tokens, stop=")
		if table != stats || (!stats && strings.Contains(errb.String(), "tokens, stop=")) {
			t.Fatalf("generate (--stats %v) printed on stderr:\n%s", stats, errb.String())
		}
	}
	route, _ := swarm["route"].([]any)
	if len(route) != 2 || swarm["ttft_ms"] == nil || swarm["reroutes"].(float64) != 0 {
		t.Fatalf("swarm result %v", swarm)
	}
	// The per-hop breakdown (HopTiming) reaches the JSON: every hop waited
	// for its input, and the time no hop accounts for is reported.
	hops, _ := swarm["hops"].([]any)
	for i, h := range hops {
		if w, _ := h.(map[string]any)["wait_us"].(float64); w <= 0 {
			t.Fatalf("hop %d: no wait_us in %v", i, h)
		}
	}
	if _, ok := swarm["network_ms_per_token"]; len(hops) != 2 || !ok {
		t.Fatalf("swarm hops %v, network_ms_per_token %v", hops, swarm["network_ms_per_token"])
	}

	for name, p := range map[string]*proc{"head": head, "tail": tail} {
		p.cancel()
		select {
		case err := <-p.done:
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Fatalf("%s shutdown: %v", name, err)
			}
		case <-time.After(15 * time.Second):
			t.Fatalf("%s did not shut down", name)
		}
	}
}

// status shows a swarm's models and says when layers are missing.
func TestStatus(t *testing.T) {
	model := testmodels.Path(t, "stories260K.gguf")
	dir := t.TempDir()
	net := []string{"--network", "statustest", "--listen", "/ip4/127.0.0.1/tcp/0"}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- runStart(ctx, &syncBuf{}, &syncBuf{}, append([]string{"--model", model, "--layers", "0-3", "--data-dir", dir}, net...))
	}()
	defer func() { cancel(); <-done }()
	var info struct {
		Addrs []string `json:"addrs"`
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if b, err := os.ReadFile(filepath.Join(dir, "node.json")); err == nil && json.Unmarshal(b, &info) == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no node.json")
		}
	}
	var out, errb syncBuf
	if err := runStatus(context.Background(), &out, &errb, append([]string{"--bootstrap", info.Addrs[0], "--model", "stories260K", "--wait", "3s"}, net...)); err != nil {
		t.Fatalf("status: %v\n%s", err, errb.String())
	}
	s := out.String()
	if !strings.Contains(s, "stories260K") || !strings.Contains(s, "NOT routable") || !strings.Contains(s, "layers 3-5") || !strings.Contains(s, "layers   0-3") {
		t.Fatalf("status output:\n%s", s)
	}
	t.Logf("status:\n%s", s)
}

// startNode runs `meshp2p start args...` until the test ends and returns
// its first address (from node.json) and its log.
func startNode(t *testing.T, dir string, args ...string) (string, *syncBuf) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	logs := &syncBuf{}
	go func() { done <- runStart(ctx, &syncBuf{}, logs, append(args, "--data-dir", dir)) }()
	t.Cleanup(func() { cancel(); <-done })
	var info struct {
		Addrs []string `json:"addrs"`
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if b, err := os.ReadFile(filepath.Join(dir, "node.json")); err == nil && json.Unmarshal(b, &info) == nil && len(info.Addrs) > 0 {
			return info.Addrs[0], logs
		}
		select {
		case err := <-done:
			t.Fatalf("start exited: %v\n%s", err, logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("no node.json")
		}
	}
}

// Nodes and clients that cannot get in say why, and clients tell "connected
// to nobody" from "connected, but nobody serves this model".
func TestJoinFailuresAreLoud(t *testing.T) {
	model := testmodels.Path(t, "stories260K.gguf")
	dir := t.TempDir()
	keyA, keyB := filepath.Join(dir, "a.key"), filepath.Join(dir, "b.key")
	for _, k := range []string{keyA, keyB} {
		if err := runKey(context.Background(), &syncBuf{}, &syncBuf{}, []string{"swarm-gen", "-o", k}); err != nil {
			t.Fatal(err)
		}
	}
	net := []string{"--network", "loud", "--listen", "/ip4/127.0.0.1/tcp/0"}
	boot, _ := startNode(t, filepath.Join(dir, "a"), append([]string{"--model", model, "--swarm-key", keyA}, net...)...)

	// An outsider node logs that it reaches no one, and why.
	_, logs := startNode(t, filepath.Join(dir, "b"), append([]string{"--model", model, "--swarm-key", keyB, "--bootstrap", boot}, net...)...)
	for deadline := time.Now().Add(20 * time.Second); !strings.Contains(logs.String(), "different swarm key"); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("outsider node never said why it is alone:\n%s", logs.String())
		}
	}

	gen := func(args ...string) (time.Duration, error) {
		start := time.Now()
		err := runGenerate(context.Background(), &syncBuf{}, &syncBuf{}, append([]string{"--wait", "30s", "--bootstrap", boot, "--prompt", "Once", "--max-tokens", "2"}, args...))
		return time.Since(start), err
	}
	// An outsider client gives up early with the reason, not after --wait.
	took, err := gen(append([]string{"--model", "stories260K", "--swarm-key", keyB}, net...)...)
	if !errors.Is(err, p2p.ErrNoPeers) || !strings.Contains(err.Error(), "different swarm key") {
		t.Fatalf("outsider generate: %v", err)
	}
	t.Logf("outsider client after %v: %v", took.Round(time.Millisecond), err)
	if err := runStatus(context.Background(), &syncBuf{}, &syncBuf{}, append([]string{"--bootstrap", boot, "--swarm-key", keyB}, net...)); !errors.Is(err, p2p.ErrNoPeers) {
		t.Fatalf("outsider status: %v", err)
	}
	// A member asking for a model nobody serves hears that it is connected.
	_, err = gen(append([]string{"--model", "no-such-model", "--swarm-key", keyA, "--wait", "2s"}, net...)...)
	if err == nil || errors.Is(err, p2p.ErrNoPeers) || !strings.Contains(err.Error(), "connected to 1 peer") || !strings.Contains(err.Error(), "no-such-model") {
		t.Fatalf("member asking for an unknown model: %v", err)
	}
	t.Logf("member, unknown model: %v", err)
}
