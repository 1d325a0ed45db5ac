package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/neuron-tai/meshp2p/engine/gguf"
)

// A path that does not exist is not mistaken for a model name; bad rates
// are usage errors.
func TestStartFetchUsage(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		model, want string
		usage       bool
	}{
		{filepath.Join(dir, "missing.gguf"), "no such file", false},
	} {
		err := runStart(context.Background(), &syncBuf{}, &syncBuf{}, []string{"--model", c.model, "--data-dir", dir, "--listen", "/ip4/127.0.0.1/tcp/0"})
		if err == nil || !strings.Contains(err.Error(), c.want) || errors.Is(err, errUsage) != c.usage {
			t.Errorf("--model %s: %v", c.model, err)
		}
	}
	err := runStart(context.Background(), &syncBuf{}, &syncBuf{}, []string{"--model", "m", "--layers", "0-1", "--upload-limit", "fast"})
	if !errors.Is(err, errUsage) {
		t.Errorf("bad --upload-limit: %v", err)
	}
	err = runStart(context.Background(), &syncBuf{}, &syncBuf{}, []string{"--model", "m", "--layers", "0-1", "--trusted-client", "12D3KooWBoci9eUurB9rJA2Hqs3UF28uuL1375WBkgniEZoWkGUE,gateway"})
	if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), `--trusted-client "gateway": not a peer id`) {
		t.Errorf("bad --trusted-client: %v", err)
	}
	for in, want := range map[string]int64{"5M": 5 << 20, "500K": 500 << 10, "1024": 1024, "1.5G": 3 << 29, "0": 0} {
		if got, err := parseByteRate(in); err != nil || got != want {
			t.Errorf("parseByteRate(%q) = %d, %v", in, got, err)
		}
	}
}

// synthFetchModel writes a synthesized 12-layer model name.gguf in dir
// and returns its path, fingerprint and the bytes a fetch of layers r
// downloads (its shard's tensors, equal data counted once: staging is by
// hash).
func synthFetchModel(t *testing.T, dir, name string, r gguf.Range) (model, fp string, need int64) {
	t.Helper()
	spec := gguf.DefaultSpec("llama")
	spec.Layers, spec.Embd, spec.FF, spec.Name = 12, 128, 256, name
	model = filepath.Join(dir, name+".gguf")
	if err := gguf.Synth(context.Background(), spec, model); err != nil {
		t.Fatal(err)
	}
	m, err := gguf.BuildManifest(context.Background(), model, nil)
	if err != nil {
		t.Fatal(err)
	}
	ts, err := gguf.ShardSources(m.File, r)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[gguf.Digest]bool{}
	for _, ti := range ts {
		if h := m.DataHash(ti); !seen[h] {
			seen[h] = true
			need += int64(ti.Bytes)
		}
	}
	return model, m.Fingerprint(), need
}

// countSrv serves one file with range support (http.ServeContent) and
// counts the body bytes sent; while throttle > 0 an answer sends at most
// that many bytes per 10 ms.
type countSrv struct {
	*httptest.Server
	sent, throttle, active atomic.Int64
}

func countingServer(t *testing.T, path string) *countSrv {
	cs := &countSrv{}
	mt := time.Now().Add(-time.Hour)
	cs.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cs.active.Add(1)
		defer cs.active.Add(-1)
		f, err := os.Open(path)
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		defer f.Close()
		http.ServeContent(countW{w, &cs.sent, &cs.throttle}, r, "m.gguf", mt, f)
	}))
	t.Cleanup(cs.Close)
	return cs
}

// quiesce waits until no answer is in flight (a killed client's handler
// may still be writing into its dead connection).
func (cs *countSrv) quiesce(t *testing.T) {
	for deadline := time.Now().Add(10 * time.Second); cs.active.Load() > 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("HTTP answers still in flight")
		}
	}
}

type countW struct {
	http.ResponseWriter
	n, throttle *atomic.Int64
}

func (c countW) Write(b []byte) (int, error) {
	written := 0
	for len(b) > 0 {
		chunk := b
		if th := c.throttle.Load(); th > 0 {
			chunk = b[:min(int64(len(b)), th)]
			time.Sleep(10 * time.Millisecond)
		}
		k, err := c.ResponseWriter.Write(chunk)
		c.n.Add(int64(k))
		written += k
		if err != nil {
			return written, err
		}
		b = b[k:]
	}
	return written, nil
}

// The README's flags: two nodes serve layers 0-4 and 8-12 of a 12-layer
// model from the file; a third starts with only the file's URL and
// --layers 4-8: it downloads the header and exactly its tensors (checked
// against the peers' manifest), and the swarm's output equals --local. A
// fourth starts with only the fingerprint and fetches 4-8 from the third
// and from a fifth that serves corrupt bytes.
func TestStartFetchFromURLAndPeers(t *testing.T) {
	dir := t.TempDir()
	model, fp, need := synthFetchModel(t, dir, "fetch12", gguf.Range{Start: 4, End: 8})
	srv := countingServer(t, model)
	sent := &srv.sent
	net := []string{"--network", "fetchtest", "--listen", "/ip4/127.0.0.1/tcp/0"}

	boot, _ := startNode(t, filepath.Join(dir, "a"), append([]string{"--model", model, "--layers", "0-4"}, net...)...)
	startNode(t, filepath.Join(dir, "c"), append([]string{"--model", model, "--layers", "8-12", "--bootstrap", boot}, net...)...)
	t0 := time.Now()
	_, logsB := startNode(t, filepath.Join(dir, "b"), append([]string{"--model", srv.URL + "/fetch12.gguf", "--layers", "4-8", "--bootstrap", boot}, net...)...)
	srv.quiesce(t)
	t.Logf("URL node ready after %v; file %d bytes, downloaded %d", time.Since(t0).Round(time.Millisecond), mustSize(t, model), sent.Load())
	if got := sent.Load(); got != 256<<10+need {
		t.Fatalf("URL node downloaded %d bytes, want the 262144-byte header read + %d tensor bytes\n%s", got, need, logsB.String())
	}
	if !strings.Contains(logsB.String(), "verified against a peer's manifest") {
		t.Fatalf("URL node did not use the swarm's manifest:\n%s", logsB.String())
	}
	gen := func(args ...string) map[string]any {
		var out, errb syncBuf
		if err := runGenerate(context.Background(), &out, &errb, append(args, "--prompt", "Once upon a time", "--max-tokens", "8", "--json")); err != nil {
			t.Fatalf("generate %v: %v\n%s", args, err, errb.String())
		}
		var res map[string]any
		if err := json.Unmarshal([]byte(out.String()), &res); err != nil {
			t.Fatalf("generate output %q: %v", out.String(), err)
		}
		return res
	}
	local := gen("--local", "--model", model)
	swarm := gen(append([]string{"--model", "fetch12", "--bootstrap", boot, "--wait", "20s"}, net...)...)
	if local["text"] == "" || local["text"] != swarm["text"] {
		t.Fatalf("local %q, swarm %q", local["text"], swarm["text"])
	}

	// Only the fingerprint: layers 4-8 come from the URL node and from a
	// node E whose shard file got one byte flipped in every tensor after
	// it started (a corrupt or lying peer): E's tensors are rejected, E is
	// dropped and logged, and every layer comes from the URL node.
	addrE, _ := startNode(t, filepath.Join(dir, "e"), append([]string{"--model", model, "--layers", "4-8", "--bootstrap", boot}, net...)...)
	idE := addrE[strings.LastIndex(addrE, "/")+1:]
	shardE := filepath.Join(dir, "e", "shards", fp[:16], "fetch12.L4-8.gguf")
	fe, err := gguf.Open(shardE)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(shardE)
	for _, ti := range fe.Tensors {
		raw[fe.DataOffset+int64(ti.Offset)+int64(ti.Bytes)/2] ^= 0x5a
	}
	fe.Close()
	if err := os.WriteFile(shardE, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	// Start D once the bootstrap node knows both holders of 4-8 (D learns
	// the swarm from it), so that both are sources.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		var out syncBuf
		_ = runStatus(context.Background(), &out, &syncBuf{}, append([]string{"--bootstrap", boot, "--model", "fetch12", "--wait", "2s"}, net...))
		if strings.Count(out.String(), "layers   4-8") >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the swarm never showed two holders of 4-8:\n%s", out.String())
		}
	}
	_, logsD := startNode(t, filepath.Join(dir, "d"), append([]string{"--model", fp, "--layers", "4-8", "--bootstrap", boot}, net...)...)
	if !strings.Contains(logsD.String(), "fetching layers from peers") {
		t.Fatalf("fingerprint node did not fetch from peers:\n%s", logsD.String())
	}
	var dropped bool
	for _, l := range strings.Split(logsD.String(), "\n") {
		dropped = dropped || (strings.Contains(l, "does not match the manifest; dropping it") && strings.Contains(l, idE))
	}
	if !dropped {
		t.Fatalf("corrupt peer %s not dropped:\n%s", idE, logsD.String())
	}
	// Without --layers the placement code chooses the window from the
	// manifest's sizes and the swarm; the node fetches and serves it.
	_, logsF := startNode(t, filepath.Join(dir, "f"), append([]string{"--model", "fetch12", "--memory", "2G", "--bootstrap", boot}, net...)...)
	if !strings.Contains(logsF.String(), "placement chose the layers to fetch") || !strings.Contains(logsF.String(), "shard written from fetched tensors") {
		t.Fatalf("placed fetch:\n%s", logsF.String())
	}
	var infoF struct{ Start, End int }
	b, _ := os.ReadFile(filepath.Join(dir, "f", "node.json"))
	if err := json.Unmarshal(b, &infoF); err != nil || infoF.End <= infoF.Start {
		t.Fatalf("placed fetch node.json %s: %v", b, err)
	}
	if _, err := gguf.CheckShard(context.Background(), filepath.Join(dir, "f", "shards", fp[:16], fmt.Sprintf("fetch12.L%d-%d.gguf", infoF.Start, infoF.End)), fp, gguf.Range{Start: infoF.Start, End: infoF.End}); err != nil {
		t.Fatal(err)
	}
	t.Logf("placed fetch chose layers %d-%d", infoF.Start, infoF.End)
	split, err := gguf.Split(context.Background(), model, []gguf.Range{{Start: 4, End: 8}}, filepath.Join(dir, "split"), nil)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(split[0].Path)
	got, err := os.ReadFile(filepath.Join(dir, "d", "shards", fp[:16], "fetch12.L4-8.gguf"))
	if err != nil || string(got) != string(want) {
		t.Fatalf("fetched shard differs from shard split's (%v)", err)
	}
}

func mustSize(t *testing.T, p string) int64 {
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}

// shard ls lists the cache (shards with model and layers, the manifest,
// a fetch's staging); shard rm removes one shard or a model's whole cache.
func TestShardLsRm(t *testing.T) {
	dd := t.TempDir()
	spec := gguf.DefaultSpec("llama")
	spec.Layers, spec.Embd, spec.FF = 4, 32, 64
	model := filepath.Join(t.TempDir(), "m.gguf")
	if err := gguf.Synth(context.Background(), spec, model); err != nil {
		t.Fatal(err)
	}
	m, err := gguf.BuildManifest(context.Background(), model, nil)
	if err != nil {
		t.Fatal(err)
	}
	fp := m.Fingerprint()
	dir := filepath.Join(dd, "shards", fp[:16])
	if _, err := gguf.Split(context.Background(), model, []gguf.Range{{Start: 0, End: 2}, {Start: 2, End: 4}}, dir, nil); err != nil {
		t.Fatal(err)
	}
	_ = os.WriteFile(filepath.Join(dir, "manifest"), m.Marshal(), 0o644)
	_ = os.MkdirAll(filepath.Join(dir, "staging"), 0o755)
	_ = os.WriteFile(filepath.Join(dir, "staging", "x.part"), make([]byte, 100), 0o644)
	var out syncBuf
	if err := runShard(context.Background(), &out, &syncBuf{}, []string{"ls", "--data-dir", dd}); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	for _, want := range []string{"shard     0-2", "shard     2-4", "manifest", "staging", fp[:16]} {
		if !strings.Contains(s, want) {
			t.Fatalf("shard ls lacks %q:\n%s", want, s)
		}
	}
	if err := runShard(context.Background(), &syncBuf{}, &syncBuf{}, []string{"rm", "--data-dir", dd, fp[:12] + ":2-4"}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "m.L2-4.gguf")); !os.IsNotExist(err) {
		t.Fatal("shard 2-4 not removed")
	}
	if _, err := os.Stat(filepath.Join(dir, "m.L0-2.gguf")); err != nil {
		t.Fatal("shard 0-2 removed too")
	}
	if err := runShard(context.Background(), &syncBuf{}, &syncBuf{}, []string{"rm", "--data-dir", dd, "abc"}); !errors.Is(err, errUsage) {
		t.Fatalf("short prefix: %v", err)
	}
	if err := runShard(context.Background(), &syncBuf{}, &syncBuf{}, []string{"rm", "--data-dir", dd, fp}); err != nil {
		t.Fatal(err)
	}
	es, _ := listCache(dd)
	if len(es) != 0 {
		t.Fatalf("after rm MODEL: %v", es)
	}
}

// A node restarted with --model FINGERPRINT or NAME and a shard it fetched
// before starts from the cache at once, with no peer to ask.
func TestStartFetchCachedOffline(t *testing.T) {
	dd := t.TempDir()
	spec := gguf.DefaultSpec("llama")
	spec.Layers, spec.Embd, spec.FF, spec.Name = 4, 64, 128, "cached4"
	model := filepath.Join(t.TempDir(), "cached4.gguf")
	if err := gguf.Synth(context.Background(), spec, model); err != nil {
		t.Fatal(err)
	}
	f, _ := gguf.Open(model)
	fp, err := gguf.Fingerprint(context.Background(), f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gguf.Split(context.Background(), model, []gguf.Range{{Start: 0, End: 2}}, filepath.Join(dd, "shards", fp[:16]), nil); err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{fp, "cached4"} {
		t.Run(m[:7], func(t *testing.T) { // each node stops when its subtest ends
			_ = os.Remove(filepath.Join(dd, "node.json"))
			t0 := time.Now()
			_, logs := startNode(t, dd, "--model", m, "--layers", "0-2", "--fetch-wait", "1m", "--network", "cachetest", "--listen", "/ip4/127.0.0.1/tcp/0")
			if !strings.Contains(logs.String(), "using cached fetched shard") {
				t.Fatalf("--model %s did not use the cache:\n%s", m, logs.String())
			}
			t.Logf("--model %.16s: ready from the cache in %v", m, time.Since(t0).Round(time.Millisecond))
		})
	}
}

// A self-placing node (whole file, no --layers) serves the manifest and
// its window's tensors: a node given only the model name fetches that
// window from it.
func TestStartFetchFromSelfPlacingNode(t *testing.T) {
	dir := t.TempDir()
	spec := gguf.DefaultSpec("llama")
	spec.Layers, spec.Embd, spec.FF, spec.Name = 6, 64, 128, "placed6"
	model := filepath.Join(dir, "placed6.gguf")
	if err := gguf.Synth(context.Background(), spec, model); err != nil {
		t.Fatal(err)
	}
	net := []string{"--network", "placedfetch", "--listen", "/ip4/127.0.0.1/tcp/0"}
	boot, _ := startNode(t, filepath.Join(dir, "p"), append([]string{"--model", model, "--memory", "1G"}, net...)...)
	var info struct{ Start, End int }
	b, _ := os.ReadFile(filepath.Join(dir, "p", "node.json"))
	if err := json.Unmarshal(b, &info); err != nil || info.End <= info.Start {
		t.Fatalf("node.json %s: %v", b, err)
	}
	layers := fmt.Sprintf("%d-%d", info.Start, info.End)
	_, logs := startNode(t, filepath.Join(dir, "q"), append([]string{"--model", "placed6", "--layers", layers, "--bootstrap", boot}, net...)...)
	if !strings.Contains(logs.String(), "shard written from fetched tensors") {
		t.Fatalf("no fetch from the self-placing node:\n%s", logs.String())
	}
	t.Logf("fetched layers %s from the self-placing node", layers)
}
