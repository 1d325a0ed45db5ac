package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"google.golang.org/protobuf/proto"

	"github.com/neuron-tai/meshp2p/engine"
	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/internal/testbin"
	"github.com/neuron-tai/meshp2p/internal/testmodels"
	"github.com/neuron-tai/meshp2p/node"
	"github.com/neuron-tai/meshp2p/p2p"
	"github.com/neuron-tai/meshp2p/placement"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/status"
)

// warmBound is the bound docs/placement.md states for a model that
// standby nodes offer to get a route after it is first asked for (the
// gateway's demand report, every DefaultDemandInterval; the standby's
// check, every WarmCheck; the switch: drain, cut, load), with slack for
// a loaded 2-core machine; the measured time is logged.
const warmBound = 90 * time.Second

// completion is one /v1/completions answer: status, text, the
// Retry-After header and the error code.
type completion struct {
	status     int
	text       string
	retryAfter string
	code       string
	message    string
}

func complete(t *testing.T, base, model, prompt string, maxTokens int) completion {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"model": model, "prompt": prompt, "max_tokens": maxTokens, "temperature": 0})
	hc := &http.Client{Timeout: 60 * time.Second}
	resp, err := hc.Post(base+"/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatalf("POST completions: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var out struct {
		Choices []struct {
			Text string `json:"text"`
		} `json:"choices"`
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &out); err != nil {
		t.Fatalf("completions: %v: %s", err, body)
	}
	c := completion{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), code: out.Error.Code, message: out.Error.Message}
	if len(out.Choices) > 0 {
		c.text = out.Choices[0].Text
	}
	return c
}

// listedModels is GET /v1/models: state by id.
func listedModels(t *testing.T, base string) map[string]string {
	t.Helper()
	resp, err := http.Get(base + "/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct {
		Data []struct {
			ID      string `json:"id"`
			Meshp2p struct {
				State string `json:"state"`
			} `json:"meshp2p"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, m := range list.Data {
		out[m.ID] = m.Meshp2p.State
	}
	return out
}

// servedModels counts the nodes serving each model, by node.json: their
// own model, and (as "+name") the models they serve whole beside it.
func servedModels(dirs []string) map[string]int {
	out := map[string]int{}
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "node.json"))
		var in node.Info
		if err != nil || json.Unmarshal(b, &in) != nil || in.End <= in.Start {
			continue
		}
		out[in.Model]++
		for _, m := range in.AlsoServes {
			out["+"+m]++
		}
	}
	return out
}

// Six nodes started as the README says for several models (`start --model
// a.gguf,b.gguf,c.gguf --memory …`, the budget holding A and C together,
// not A and B) serve model A, the first given, and offer B and C; the
// gateway lists them as warmable. Then demand moves from A to B: A is
// still asked for, B is asked for too. B is answered 503 model_warming
// with Retry-After until a node switches to it (it does not fit beside A),
// then with the text `generate --local` gives; B gets its route within
// warmBound; A keeps a route the whole time (every A request answered,
// every node.json poll shows a node on A), its text equal to --local too.
// Then `generate --model C` waits for C to warm (its wait is the demand):
// a node serves C whole beside A, and the CLI prints what --local does.
// An unknown model is a 404 naming it.
func TestManyModelsDemandMoves(t *testing.T) {
	if testing.Short() {
		t.Skip("starts seven processes")
	}
	t.Parallel() // its processes mostly wait on timers (make test: -parallel = cores)
	bin := testbin.CLI(t)
	a := testmodels.Path(t, "stories260K.gguf")
	b := testmodels.Path(t, "llama-2-tiny-random.gguf")
	dir := t.TempDir()
	c := filepath.Join(dir, "synth-c.gguf")
	if _, _, err := runShardArgs(t, "synth", "--layers", "3", "--embd", "64", "--ff", "128", "--name", "synth-c", "-o", c); err != nil {
		t.Fatal(err)
	}
	need := map[string]int64{}
	for _, m := range []string{a, b, c} {
		// PrefixCacheCells: start's default --prefix-cache, half of --ctx.
		sz, err := node.ModelSizing(m, engine.Config{NCtx: 512, NBatch: 64, PrefixCacheCells: 256})
		if err != nil {
			t.Fatal(err)
		}
		need[m] = sz.Need(placement.Range{Start: 0, End: sz.NLayer})
	}
	budget := max(need[a]+need[c], need[b]) + 1<<20
	if need[a]+need[b] <= budget {
		t.Fatalf("whole-model needs %v: no budget holds A and C but not A and B", need)
	}
	t.Logf("whole-model needs A %d, B %d, C %d; budget %d", need[a], need[b], need[c], budget)
	net := []string{"--network", "manymodels", "--listen", "/ip4/127.0.0.1/tcp/0", "--test-mode"}
	nodeArgs := append([]string{"--model", a + "," + b + "," + c, "--memory", fmt.Sprint(budget), "--ctx", "512", "--batch", "64", "--threads", "1"}, net...)
	var dirs []string
	first := startCLI(t, bin, filepath.Join(dir, "n0"), nodeArgs...)
	dirs = append(dirs, filepath.Join(dir, "n0"))
	boot := []string{"--bootstrap", first.addr}
	var wg sync.WaitGroup
	for i := 1; i < 6; i++ {
		d := filepath.Join(dir, fmt.Sprint("n", i))
		dirs = append(dirs, d)
		wg.Go(func() { startCLI(t, bin, d, append(nodeArgs, boot...)...) })
	}
	wg.Wait()
	serve := launch(t, bin, append([]string{"serve", "--api", "127.0.0.1:0"}, append(net, boot...)...)...)
	base := apiURL(t, serve)

	const prompt = "Once upon a time"
	wantA, _ := localText(t, bin, "--model", a, "--prompt", prompt, "--max-tokens", "16")
	wantB, _ := localText(t, bin, "--model", b, "--prompt", prompt, "--max-tokens", "16")

	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		ms := listedModels(t, base)
		if ms["stories260K"] == "served" && ms["llama-2-tiny-random"] == "warmable" && ms["synth-c"] == "warmable" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the gateway never listed A served, B and C warmable: %v\n%v", ms, servedModels(dirs))
		}
	}
	if got := servedModels(dirs); got["stories260K"] != 6 {
		t.Fatalf("nodes by model before any demand: %v, want all 6 on the first model given", got)
	}
	if r := complete(t, base, "no-such-model", prompt, 4); r.status != http.StatusNotFound || !strings.Contains(r.message, "no-such-model") {
		t.Fatalf("unknown model: %d %q, want a 404 naming it", r.status, r.message)
	}
	for range 3 {
		if r := complete(t, base, "stories260K", prompt, 16); r.status != http.StatusOK || r.text != wantA {
			t.Fatalf("A before the shift: %d %q %q, want %q", r.status, r.text, r.message, wantA)
		}
	}

	// Demand moves: A is still asked for (every 2 s), B is asked for.
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var aErr error
	var aMu sync.Mutex
	aDone := make(chan struct{})
	aAnswered := 0
	go func() {
		defer close(aDone)
		for ctx.Err() == nil {
			r := complete(t, base, "stories260K", prompt, 16)
			aMu.Lock()
			aAnswered++
			if (r.status != http.StatusOK || r.text != wantA) && aErr == nil {
				aErr = fmt.Errorf("A while B warms: %d %q %q, want %q", r.status, r.text, r.message, wantA)
			}
			aMu.Unlock()
			select {
			case <-ctx.Done():
			case <-time.After(2 * time.Second):
			}
		}
	}()
	t0 := time.Now()
	warming := 0
	var took time.Duration
	for {
		r := complete(t, base, "llama-2-tiny-random", prompt, 16)
		if got := servedModels(dirs); got["stories260K"] == 0 {
			t.Fatalf("no node serves A while it is asked for: %v", got)
		}
		if r.status == http.StatusOK {
			took = time.Since(t0)
			if r.text != wantB {
				t.Fatalf("B once warm: %q, want %q (generate --local)", r.text, wantB)
			}
			break
		}
		if r.status != http.StatusServiceUnavailable || r.retryAfter == "" {
			t.Fatalf("B before its route: %d %q (Retry-After %q), want 503 with Retry-After", r.status, r.message, r.retryAfter)
		}
		if r.code == "model_warming" {
			warming++
		}
		if time.Since(t0) > warmBound {
			t.Fatalf("B has no route %v after it was first asked for: %v\n%s", warmBound, servedModels(dirs), serve.log.String())
		}
		time.Sleep(2 * time.Second)
	}
	if warming == 0 {
		t.Fatalf("B was never answered 503 model_warming before its route")
	}
	t.Logf("B got a route %v after it was first asked for (%d answers 503 model_warming first); nodes by model now %v", took.Round(100*time.Millisecond), warming, servedModels(dirs))
	for range 3 {
		if r := complete(t, base, "llama-2-tiny-random", prompt, 16); r.status != http.StatusOK || r.text != wantB {
			t.Fatalf("B once warm: %d %q %q, want %q", r.status, r.text, r.message, wantB)
		}
	}
	if ms := listedModels(t, base); ms["llama-2-tiny-random"] != "served" || ms["stories260K"] != "served" || ms["synth-c"] != "warmable" {
		t.Fatalf("models listed once B is warm: %v, want A and B served, C warmable", ms)
	}
	stop()
	<-aDone
	aMu.Lock()
	defer aMu.Unlock()
	if aErr != nil {
		t.Fatal(aErr)
	}
	if got := servedModels(dirs); got["stories260K"] == 0 || got["llama-2-tiny-random"] == 0 {
		t.Fatalf("nodes by model at the end: %v, want both served", got)
	}
	t.Logf("A answered %d times while B warmed, every time equal to --local", aAnswered)

	// The CLI: generate waits for C, which nobody serves yet; its wait is
	// the demand that makes a node load it.
	local := generateTokens(t, 12, "--local", "--model", c)
	tc := time.Now()
	if swarm := generateTokens(t, 12, append(append([]string{"--model", "synth-c", "--wait", warmBound.String()}, net...), boot...)...); swarm != local {
		t.Fatalf("generate for C once warm: %s, --local %s", swarm, local)
	}
	got := servedModels(dirs)
	t.Logf("generate waited %v for C to warm; nodes by model now %v (+: served whole beside the node's own)", time.Since(tc).Round(100*time.Millisecond), got)
	if got["+synth-c"] == 0 || got["synth-c"] != 0 {
		t.Fatalf("nodes by model %v: want C served beside A (it fits), no node switched to it", got)
	}
}

// A hostile peer on the real gossip layer claims enormous demand for
// model B, re-publishing as fast as gossip lets it, and offers a model
// nobody has. The swarm counts its demand at most at the per-author cap,
// never abandons A (asked for by honest clients) — one node may move to B,
// the last route of A stays — and a request for the fake model gets 503
// model_warming only until --warm-timeout, then a 404 saying warming gave
// up.
func TestManyModelsHostileGossip(t *testing.T) {
	if testing.Short() {
		t.Skip("starts four processes")
	}
	t.Parallel() // its processes mostly wait on timers (make test: -parallel = cores)
	bin := testbin.CLI(t)
	a := testmodels.Path(t, "stories260K.gguf")
	b := testmodels.Path(t, "llama-2-tiny-random.gguf")
	dir := t.TempDir()
	net := []string{"--network", "hostiledemand", "--listen", "/ip4/127.0.0.1/tcp/0", "--test-mode"}
	nodeArgs := append([]string{"--model", a + "," + b, "--memory", "512MiB", "--ctx", "512", "--batch", "64", "--threads", "1"}, net...)
	dirs := []string{filepath.Join(dir, "n0"), filepath.Join(dir, "n1")}
	first := startCLI(t, bin, dirs[0], nodeArgs...)
	boot := []string{"--bootstrap", first.addr}
	startCLI(t, bin, dirs[1], append(nodeArgs, boot...)...)
	const warmTimeout = 15 * time.Second
	serve := launch(t, bin, append([]string{"serve", "--api", "127.0.0.1:0", "--warm-timeout", warmTimeout.String()}, append(net, boot...)...)...)
	base := apiURL(t, serve)

	// The liar: a real peer of the swarm, publishing signed adverts.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pc := node.Preset(node.PresetTest)
	bootInfo, err := peer.AddrInfoFromString(first.addr)
	if err != nil {
		t.Fatal(err)
	}
	pc.Network, pc.DataDir, pc.Bootstrap = "hostiledemand", t.TempDir(), []peer.AddrInfo{*bootInfo}
	liar, err := p2p.New(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	defer liar.Close()
	fpB := fingerprintOf(t, b)
	fake := strings.Repeat("ab", 32)
	var lies sync.WaitGroup
	lies.Go(func() {
		for ctx.Err() == nil {
			ca := &meshp2pb.CapabilityAdvert{PeerId: []byte(liar.ID()), Network: "hostiledemand", Roles: []meshp2pb.Role{meshp2pb.Role_ROLE_CLIENT},
				Offers: []*meshp2pb.ModelOffer{{ModelFingerprint: fake, ModelName: "fake-model", NLayer: 4, Bytes: 1 << 20}},
				Demand: &meshp2pb.DemandReport{MeasuredAtMs: time.Now().UnixMilli(), Models: []*meshp2pb.ModelDemand{
					{ModelFingerprint: fpB, Requests: 1e9, Refused: 1e9, Queued: 1e9, TokensPerSec: 1e12},
					{ModelFingerprint: fake, Requests: 1e9, Refused: 1e9}}}}
			body, _ := proto.Marshal(ca)
			_ = liar.Discovery().SetLocalAdvert(nil, body)
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond): // beyond gossip's per-author rate: most are dropped
			}
		}
	})
	defer lies.Wait()
	defer cancel()

	const prompt = "Once upon a time"
	wantA, _ := localText(t, bin, "--model", a, "--prompt", prompt, "--max-tokens", "8")
	// The fake model is warmable (the liar offers it): 503 until the
	// timeout, then 404 for the cooldown.
	var t0 time.Time
	sawWarming := false
	for deadline := time.Now().Add(warmTimeout + 60*time.Second); ; time.Sleep(time.Second) {
		// Honest demand for A all along.
		if c := complete(t, base, "stories260K", prompt, 8); c.status != http.StatusOK || c.text != wantA {
			t.Fatalf("A under hostile demand gossip: %d %q %q, want %q", c.status, c.text, c.message, wantA)
		}
		if got := servedModels(dirs); got["stories260K"] == 0 {
			t.Fatalf("no node serves A, which honest clients ask for: %v", got)
		}
		c := complete(t, base, "fake-model", prompt, 8)
		switch {
		case c.status == http.StatusServiceUnavailable && c.code == "model_warming":
			if !sawWarming {
				t0 = time.Now()
			}
			sawWarming = true
		case c.status == http.StatusNotFound && sawWarming:
			if !strings.Contains(c.message, "gave up") {
				t.Fatalf("after the warming timeout: %q, want it to say warming gave up", c.message)
			}
			t.Logf("the liar's model: 503 model_warming for %v, then 404: %s", time.Since(t0).Round(time.Second), c.message)
			goto counted
		case c.status == http.StatusNotFound:
			// The liar's advert has not arrived yet.
		default:
			t.Fatalf("fake model: %d %q %q", c.status, c.code, c.message)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the fake model was still answered %v after %v (warming seen: %v)", c.status, warmTimeout+60*time.Second, sawWarming)
		}
	}
counted:
	if time.Since(t0) < warmTimeout-2*time.Second {
		t.Fatalf("gave up after %v, before --warm-timeout %v", time.Since(t0), warmTimeout)
	}
	// What the gateway counts of the liar's demand: capped per author.
	st := statusJSON(t, base)
	for _, m := range st.Demand {
		if m.Fingerprint == fpB && m.Requests > 2*50 { // the liar's cap plus honest demand
			t.Fatalf("demand for B counted %v/s from one liar; the per-author cap is 50/s", m.Requests)
		}
	}
	if got := servedModels(dirs); got["stories260K"] == 0 {
		t.Fatalf("A abandoned: %v", got)
	}
	t.Logf("nodes by model under the liar's gossip: %v; demand seen %+v", servedModels(dirs), st.Demand)
}

// fingerprintOf is the fingerprint of the model file at path.
func fingerprintOf(t *testing.T, path string) string {
	t.Helper()
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fp, err := gguf.Fingerprint(context.Background(), f)
	if err != nil {
		t.Fatal(err)
	}
	return fp
}

// statusJSON is the gateway's status document (GET /api/status).
func statusJSON(t *testing.T, base string) *status.Document {
	t.Helper()
	resp, err := http.Get(strings.TrimSuffix(base, "/v1") + "/api/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var doc status.Document
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	return &doc
}

// generateTokens runs `meshp2p generate … --json` in process on "Once upon
// a time" for maxTokens tokens (its own data dir) and returns the tokens
// as text, to compare a swarm's generation with --local's.
func generateTokens(t *testing.T, maxTokens int, args ...string) string {
	t.Helper()
	var out, errb syncBuf
	if err := runGenerate(t.Context(), &out, &errb, append(args, "--prompt", "Once upon a time", "--max-tokens", fmt.Sprint(maxTokens), "--json", "--data-dir", t.TempDir())); err != nil {
		t.Fatalf("generate %v: %v\n%s", args, err, errb.String())
	}
	var res map[string]any
	if err := json.Unmarshal([]byte(out.String()), &res); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprint(res["tokens"])
}
