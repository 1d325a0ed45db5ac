package dashboard_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/neuron-tai/meshp2p/dashboard"
	"github.com/neuron-tai/meshp2p/internal/testmodels"
	"github.com/neuron-tai/meshp2p/status"
)

// chromium finds Debian's chromium (scripts/browser-deps.sh installs it).
func chromium(t *testing.T) string {
	t.Helper()
	for _, b := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(b); err == nil {
			return p
		}
	}
	t.Skip("chromium is not installed: run `make deps` as root (scripts/browser-deps.sh runs apt-get install chromium)")
	return ""
}

// browser starts headless chromium with the flags this project uses and
// returns a tab context.
func browser(t *testing.T, exe string) context.Context {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(exe),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1366, 900),
	}
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelB := chromedp.NewContext(actx)
	t.Cleanup(func() { cancelB(); cancelA() })
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		t.Fatalf("start chromium: %v", err)
	}
	return ctx
}

// evalUntil evaluates js (a boolean expression) until it is true, at most
// within d; it returns how long that took.
func evalUntil(t *testing.T, ctx context.Context, js string, d time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](js))
		if err != nil {
			t.Fatalf("evaluate %s: %v", js, err)
		}
		if ok {
			return time.Since(start)
		}
		if time.Since(start) > d {
			html, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector('main').outerHTML`))
			t.Fatalf("not true after %s: %s\n%s", d, js, html)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// screenshot writes the page to $MESHP2P_SCREENSHOT_DIR (default: the
// test's temp dir), never into the repository.
// phoneFits switches the page to a phone's viewport (390×844) and fails
// the test for every element wider than it.
func phoneFits(t *testing.T, ctx context.Context) {
	t.Helper()
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(390, 844)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	wide, err := chromedp.Run(ctx, chromedp.Evaluate[string](`[...document.querySelectorAll('body *')].filter(e => e.getBoundingClientRect().right > window.innerWidth + 0.5).map(e => e.tagName + '.' + e.className).slice(0, 5).join(' ')`))
	if err != nil {
		t.Fatal(err)
	}
	if wide != "" {
		t.Errorf("phone: elements wider than the viewport: %s", wide)
	}
}

func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	dir := os.Getenv("MESHP2P_SCREENSHOT_DIR")
	if dir == "" {
		dir = t.TempDir()
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot %s (%d bytes)", p, len(png))
}

// A three-node loopback swarm started through the CLI, the dashboard of
// the first node in headless chromium: the coverage bar shows every layer
// covered and every node; after a generation the route is listed; killing
// a node turns its layers red; nothing overflows at laptop or phone width.
func TestDashboardInBrowser(t *testing.T) {
	exe := chromium(t)
	bin := cli(t)
	model := testmodels.Path(t, "stories260K.gguf")
	a := startProc(t, bin, append([]string{"start", "--model", model, "--layers", "0-2", "--metrics", "127.0.0.1:0"}, netArgs("browsertest", dataDir(t, "a"))...)...)
	b := startProc(t, bin, append([]string{"start", "--model", model, "--layers", "2-4", "--bootstrap", a.addr}, netArgs("browsertest", dataDir(t, "b"))...)...)
	c := startProc(t, bin, append([]string{"start", "--model", model, "--layers", "4-5", "--bootstrap", a.addr}, netArgs("browsertest", dataDir(t, "c"))...)...)
	if _, err := run(t, bin, "generate", "--model", "stories260K", "--bootstrap", a.addr, "--prompt", "Once upon a time", "--max-tokens", "24",
		"--wait", "30s", "--network", "browsertest", "--listen", "/ip4/127.0.0.1/tcp/0"); err != nil {
		t.Fatal(err)
	}

	ctx := browser(t, exe)
	url := "http://" + a.metrics + "/"
	if err := chromedp.Do(ctx, chromedp.Navigate(url)); err != nil {
		t.Fatal(err)
	}
	// Full coverage: five layers, one replica each, no gap; three shards,
	// all live, each node listed.
	took := evalUntil(t, ctx, `document.querySelectorAll('.bar .cell').length === 5 &&
		document.querySelectorAll('.bar .cell.gap').length === 0 &&
		document.querySelectorAll('.bar .cell.r1').length === 5 &&
		document.querySelectorAll('.shard[data-live="true"]').length === 3`, 20*time.Second)
	t.Logf("full coverage shown %v after load", took.Round(time.Millisecond))
	// Each shard names the device its layers run on: this swarm is all
	// CPU.
	evalUntil(t, ctx, `(() => { const sh = [...document.querySelectorAll('.shard')];
		return sh.length === 3 && sh.every(s => { const b = s.querySelector('.badge.backend');
			return !!b && b.textContent === 'cpu' && b.dataset.backend === 'cpu' && b.dataset.device === '' && b.title.startsWith('cpu/'); }); })()`, 10*time.Second)
	for _, p := range []*proc{b, c} {
		evalUntil(t, ctx, fmt.Sprintf(`!!document.querySelector('.node[data-peer=%q]') && !!document.querySelector('.shard[data-peer=%q]')`, p.id, p.id), 10*time.Second)
	}
	evalUntil(t, ctx, `document.querySelectorAll('#route-list li[data-epoch]').length === 1 &&
		document.querySelector('#route-list li').textContent.includes('[0-2]') && document.querySelector('#route-list li').textContent.includes('[4-5]')`, 10*time.Second)
	// Tokens flowing through this node show as a rate.
	if _, err := run(t, bin, "generate", "--model", "stories260K", "--bootstrap", a.addr, "--prompt", "Once upon a time", "--max-tokens", "64",
		"--wait", "30s", "--network", "browsertest", "--listen", "/ip4/127.0.0.1/tcp/0"); err != nil {
		t.Fatal(err)
	}
	evalUntil(t, ctx, `parseFloat(document.getElementById('tps').textContent) > 0 && document.querySelectorAll('#route-list li[data-epoch]').length === 2`, 10*time.Second)
	// No API on this server: the chat panel stays hidden.
	if chatHidden, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.getElementById('chat').hidden`)); err != nil || !chatHidden {
		t.Errorf("chat panel shown without /v1/models (%v)", err)
	}

	for _, w := range []struct {
		name          string
		width, height int64
	}{{"laptop", 1366, 900}, {"phone", 390, 844}} {
		if err := chromedp.Do(ctx, chromedp.EmulateViewport(w.width, w.height)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond) // a layout pass and a poll
		type widths struct{ Doc, Body, Inner float64 }
		over, err := chromedp.Run(ctx, chromedp.Evaluate[widths](`({Doc: document.documentElement.scrollWidth, Body: document.body.scrollWidth, Inner: window.innerWidth})`))
		if err != nil {
			t.Fatal(err)
		}
		if over.Doc > over.Inner || over.Body > over.Inner || over.Inner != float64(w.width) {
			t.Errorf("%s: horizontal overflow: scrollWidth %v / body %v > innerWidth %v", w.name, over.Doc, over.Body, over.Inner)
		}
		// No element sticks out to the right either (overflow hidden on
		// the body would hide that from scrollWidth).
		wide, err := chromedp.Run(ctx, chromedp.Evaluate[string](`[...document.querySelectorAll('body *')].filter(e => e.getBoundingClientRect().right > window.innerWidth + 0.5).map(e => e.tagName + '.' + e.className).slice(0, 5).join(' ')`))
		if err != nil {
			t.Fatal(err)
		}
		if wide != "" {
			t.Errorf("%s: elements wider than the viewport: %s", w.name, wide)
		}
		screenshot(t, ctx, "dashboard-"+w.name+".png")
	}
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(1366, 900)); err != nil {
		t.Fatal(err)
	}

	// Kill the node serving layers 4-5: its layer turns red, its shard is
	// marked dead, and the model is not routable.
	killed := time.Now()
	c.kill()
	evalUntil(t, ctx, `!!document.querySelector('.bar .cell.gap[data-layer="4"]') &&
		document.querySelectorAll('.bar .cell.gap').length === 1 &&
		!!document.querySelector('.shard.dead[data-peer="`+c.id+`"]') &&
		document.querySelector('.model .badge.bad') !== null`, 15*time.Second)
	t.Logf("killed node's layer red %v after SIGKILL", time.Since(killed).Round(time.Millisecond))
	screenshot(t, ctx, "dashboard-killed.png")
	// About a second later discovery drops the dead node's advert (p2p's
	// liveness check); the page keeps showing its shard as dead
	// (route.Table.Departed) rather than losing it.
	time.Sleep(3 * time.Second)
	evalUntil(t, ctx, `!!document.querySelector('.shard.dead[data-peer="`+c.id+`"]') &&
		document.querySelectorAll('.bar .cell.gap').length === 1`, 5*time.Second)

	t.Run("chat panel streams from a stand-in /v1", func(t *testing.T) { chatPanel(t, ctx) })
}

// Shards on GPUs: each shard's badge names its backend and device (the
// description, '/' and all, from the kernel class), a CPU shard says cpu,
// an older node's (no kernel class) has none, and a long device name
// stays inside its card at phone width.
func TestDashboardShowsBackends(t *testing.T) {
	exe := chromium(t)
	const long = "AMD Radeon RX 7900 XTX (RADV NAVI31) / Mesa 24.0.5-1 with a very long driver description that does not fit a phone"
	classes := []string{
		"cpu/amd64/sse3+avx2/llama.cpp@ec98e2002/fa",
		"vulkan/llvmpipe (LLVM 15.0.6, 256 bits)/llama.cpp@ec98e2002/fa",
		"cuda/NVIDIA H200/llama.cpp@ec98e2002/fa",
		"vulkan/" + long + "/llama.cpp@ec98e2002/fa",
		"",
	}
	var shards []status.Shard
	for i, c := range classes {
		sh := status.Shard{Peer: fmt.Sprintf("peer%d", i), Start: i, End: i + 1, Live: true, Path: "direct", MaxSessions: 1, FreeSessions: 1,
			MsPerLayer: 0.5, TokensPerSec: 2000, KernelClass: c}
		sh.Backend, sh.Device = status.BackendOf(c)
		shards = append(shards, sh)
	}
	rep, runs, gaps := status.Coverage(len(classes), shards)
	doc := &status.Document{Version: status.Version, Self: status.Self{Role: "node"}, Models: []status.Model{{Fingerprint: "0123456789abcdef0123",
		Name: "m", NLayer: len(classes), Routable: true, Replicas: rep, Runs: runs, Gaps: gaps, Shards: shards}}}
	mux := http.NewServeMux()
	dashboard.Register(mux, dashboard.Options{Status: func(context.Context) *status.Document { return doc }})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	ctx := browser(t, exe)
	if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/")); err != nil {
		t.Fatal(err)
	}
	evalUntil(t, ctx, `document.querySelectorAll('.shard').length === 5`, 10*time.Second)
	for i, want := range []string{"cpu", "vulkan (llvmpipe (LLVM 15.0.6, 256 bits))", "cuda (NVIDIA H200)", "vulkan (" + long + ")", ""} {
		got, err := chromedp.Run(ctx, chromedp.Evaluate[string](fmt.Sprintf(`(() => { const b = document.querySelector('.shard[data-peer="peer%d"] .badge.backend');
			return b ? b.textContent : ''; })()`, i)))
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("shard %d (%q): backend badge %q, want %q", i, classes[i], got, want)
		}
	}
	evalUntil(t, ctx, `document.querySelector('.shard[data-peer="peer2"] .badge.backend').title === 'cuda/NVIDIA H200/llama.cpp@ec98e2002/fa' &&
		document.querySelector('.shard[data-peer="peer2"] .badge.backend').dataset.device === 'NVIDIA H200' &&
		document.querySelector('.shard[data-peer="peer2"]').textContent.includes('2000 tok/s')`, time.Second)
	phoneFits(t, ctx)
	inside, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`(() => { const s = document.querySelector('.shard[data-peer="peer3"]'), b = s.querySelector('.badge.backend');
		return b.getBoundingClientRect().right <= s.getBoundingClientRect().right + 0.5; })()`))
	if err != nil || !inside {
		t.Errorf("phone: the long device badge sticks out of its shard card (%v)", err)
	}
	screenshot(t, ctx, "dashboard-backends-phone.png")
}

// The demand section: one row per model of the document's demand with
// its state badge (warming styled apart from served) and its rates; the
// node's last choice between its models beside its model's placement
// line, or above the demand when no model card is its own; a muted line
// when no demand is reported. The page fits a phone.
func TestDashboardShowsDemand(t *testing.T) {
	exe := chromium(t)
	const fp, fpWarm = "0123456789abcdef0123", "fedcba9876543210fedcba98"
	const why = "0123456789abcdef has 1 route(s) and demand: never uncovered"
	shards := []status.Shard{{Peer: "peer0", Start: 0, End: 2, Live: true, Path: "direct", MaxSessions: 1, FreeSessions: 1}}
	rep, runs, gaps := status.Coverage(2, shards)
	withDemand := &status.Document{Version: status.Version,
		Self:   status.Self{Role: "node", Model: "m", Fingerprint: fp, Placement: &status.Placement{ModelReason: why}},
		Models: []status.Model{{Fingerprint: fp, Name: "m", NLayer: 2, Routable: true, Replicas: rep, Runs: runs, Gaps: gaps, Shards: shards}},
		Demand: []status.ModelDemand{
			{Fingerprint: fp, Name: "m", Requests: 1.5, TokensPerSec: 250, State: "served"},
			{Fingerprint: fpWarm, Requests: 0.25, Queued: 0.004, Refused: 0.1, Offers: 2, State: "warming"},
		}}
	// A standby node: no model of its own, nothing asked for yet.
	noDemand := &status.Document{Version: status.Version,
		Self: status.Self{Role: "node", Placement: &status.Placement{ModelReason: why}}, Demand: []status.ModelDemand{}}
	var mu sync.Mutex
	doc := withDemand
	mux := http.NewServeMux()
	dashboard.Register(mux, dashboard.Options{Status: func(context.Context) *status.Document {
		mu.Lock()
		defer mu.Unlock()
		return doc
	}})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	ctx := browser(t, exe)
	if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/")); err != nil {
		t.Fatal(err)
	}
	evalUntil(t, ctx, `document.querySelectorAll('#demand-list tr.demand-row').length === 2`, 10*time.Second)
	rows, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll('#demand-list tr.demand-row')].map(r =>
		r.dataset.fingerprint + ' ' + r.dataset.state + ': ' + [...r.cells].map(c => c.textContent).join('|'))`))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		fp + " served: m|served|1.50|0|0|250.00|0",
		fpWarm + " warming: " + fpWarm[:16] + "|warming|0.25|0.0040|0.10|0|2",
	}
	if fmt.Sprint(rows) != fmt.Sprint(want) {
		t.Errorf("demand rows\n got %q\nwant %q", rows, want)
	}
	// The state badges: styled per state, warming visibly apart from
	// served.
	evalUntil(t, ctx, `(() => { const b = (s) => document.querySelector('#demand-list tr[data-state="' + s + '"] .badge');
		const served = b('served'), warming = b('warming');
		return served.classList.contains('state-served') && warming.classList.contains('state-warming') &&
			getComputedStyle(served).backgroundColor !== getComputedStyle(warming).backgroundColor &&
			getComputedStyle(served).color !== getComputedStyle(warming).color &&
			getComputedStyle(served).backgroundColor !== getComputedStyle(document.querySelector('#demand-list')).backgroundColor; })()`, time.Second)
	// The node's choice between its models shows on its model's card,
	// not twice.
	evalUntil(t, ctx, `document.querySelector('.model[data-fingerprint="`+fp+`"] .model-why').textContent === 'models: `+why+`' &&
		!document.querySelector('#demand-list .model-why')`, time.Second)
	phoneFits(t, ctx)
	screenshot(t, ctx, "dashboard-demand-phone.png")
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(1366, 900)); err != nil {
		t.Fatal(err)
	}
	screenshot(t, ctx, "dashboard-demand.png")

	mu.Lock()
	doc = noDemand
	mu.Unlock()
	evalUntil(t, ctx, `document.querySelectorAll('#demand-list tr').length === 0 &&
		[...document.querySelectorAll('#demand-list p.muted')].some(p => p.textContent === 'no demand reported yet') &&
		document.querySelector('#demand-list .model-why').textContent === 'models: `+why+`'`, 10*time.Second)
}

// The dashboard on the API server of `start --api` (mounted beside /v1/):
// the chat panel streams a reply through the real API and the swarm (the
// base model has no chat template, so the panel continues the text), the
// gateway's route and tokens/s show, and the API server's /metrics has the
// origin's metrics.
func TestDashboardChatThroughAPI(t *testing.T) {
	exe := chromium(t)
	bin := cli(t)
	model := testmodels.Path(t, "stories260K.gguf")
	// --audit-rate 1: the gateway audits the chat's generation with the
	// node's model file (docs/trust.md), and the dashboard counts it.
	// --speculative ngram: the head sends every proposal it has, so the
	// chat's generation has windows for the dashboard to count (the
	// default, auto, sends them only where they pay, which on a busy
	// loopback may be nowhere).
	a := startProc(t, bin, append([]string{"start", "--model", model, "--layers", "0-3", "--api", "127.0.0.1:0", "--audit-rate", "1", "--speculative", "ngram"}, netArgs("chattest", dataDir(t, "a"))...)...)
	startProc(t, bin, append([]string{"start", "--model", model, "--layers", "3-5", "--bootstrap", a.addr}, netArgs("chattest", dataDir(t, "b"))...)...)
	if a.api == "" {
		t.Fatalf("no api address printed:\n%s", a.logs.String())
	}
	ctx := browser(t, exe)
	if err := chromedp.Do(ctx, chromedp.Navigate("http://"+a.api+"/")); err != nil {
		t.Fatal(err)
	}
	evalUntil(t, ctx, `!document.getElementById('chat').hidden && document.getElementById('chat-model').value === 'stories260K' &&
		document.querySelectorAll('.bar .cell.r1').length === 5`, 30*time.Second)
	if err := chromedp.Do(ctx, chromedp.Evaluate[chromedp.Void](`document.getElementById('chat-input').value = 'Once upon a time'; document.getElementById('chat-send').click()`)); err != nil {
		t.Fatal(err)
	}
	evalUntil(t, ctx, `parseFloat(document.getElementById('tps').textContent) > 0`, 60*time.Second)
	evalUntil(t, ctx, `(() => { const m = document.querySelector('.msg.assistant[data-done="true"]');
		return !!m && m.dataset.mode === 'completion' && m.textContent.startsWith('Once upon a time') && m.textContent.length > 40; })()`, 60*time.Second)
	evalUntil(t, ctx, `[...document.querySelectorAll('#route-list li')].some(li => li.textContent.includes('[0-3]') && li.textContent.includes('[3-5]'))`, 10*time.Second)
	reply, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector('.msg.assistant').textContent`))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("reply through the API: %q", reply)
	screenshot(t, ctx, "dashboard-api-chat.png")
	fams := waitValue(t, a.api, "meshp2p_generations_total", map[string]string{"result": "ok"}, 1)
	// Speculation (ngram): the head answered windows, none is left in
	// flight, and the dashboard counts them.
	waitValue(t, a.api, "meshp2p_spec_windows_in_flight", nil, 0)
	if w := value(fams, "meshp2p_spec_windows_total", nil); w < 1 {
		t.Errorf("meshp2p_spec_windows_total = %v after a generation with speculation ngram", w)
	}
	evalUntil(t, ctx, `/ in [1-9][0-9]* windows$/.test(document.getElementById('accept').title)`, 10*time.Second)
	waitValue(t, a.api, "meshp2p_audits_total", map[string]string{"outcome": "passed"}, 1)
	evalUntil(t, ctx, `document.getElementById('audits').textContent === '1/0/0'`, 10*time.Second)
	for _, name := range []string{"meshp2p_ttft_seconds", "meshp2p_route_plan_seconds", "meshp2p_generated_tokens_total", "meshp2p_sessions_admitted_total", "libp2p_rcmgr_streams"} {
		if fams[name] == nil {
			t.Errorf("API server /metrics lacks %s", name)
		}
	}
	if v := value(fams, "meshp2p_sessions_admitted_total", nil); v != 1 {
		t.Errorf("the node (head of the chat's route) admitted %v sessions, want 1", v)
	}
}

// chatPanel checks the panel's own logic (shown when /v1/models answers,
// sends the conversation with stream: true, renders SSE deltas as they
// arrive) against a minimal stand-in for the API server's two routes,
// mounted beside the dashboard as the API server will mount it.
func chatPanel(t *testing.T, ctx context.Context) {
	var mu sync.Mutex
	var got []map[string]any
	mux := http.NewServeMux()
	dashboard.Register(mux, dashboard.Options{Status: func(context.Context) *status.Document {
		return &status.Document{Version: status.Version, Self: status.Self{Role: "gateway"}}
	}})
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, `{"object":"list","data":[{"id":"stories260K","object":"model"},{"id":"base","object":"model"}]}`)
	})
	sse := func(w http.ResponseWriter, chunk func(string) any, pieces ...string) {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, piece := range pieces {
			b, _ := json.Marshal(chunk(piece))
			fmt.Fprintf(w, "data: %s\n\n", b)
			w.(http.Flusher).Flush()
			time.Sleep(50 * time.Millisecond)
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	}
	record := func(r *http.Request) map[string]any {
		var req map[string]any
		_ = json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req)
		req["path"] = r.URL.Path
		mu.Lock()
		got = append(got, req)
		mu.Unlock()
		return req
	}
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		if record(r)["model"] == "base" { // what the API server says for a GGUF without a chat template
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `{"error":{"message":"model base has no chat template in its GGUF file: use /v1/completions with a prompt","type":"invalid_request_error","param":"messages","code":null}}`)
			return
		}
		sse(w, func(p string) any {
			return map[string]any{"object": "chat.completion.chunk", "choices": []any{map[string]any{"index": 0, "delta": map[string]any{"content": p}}}}
		}, "Once", " upon", " a <b>time</b>")
	})
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) {
		record(r)
		sse(w, func(p string) any {
			return map[string]any{"object": "text_completion", "choices": []any{map[string]any{"index": 0, "text": p}}}
		}, " a time", " there")
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/")); err != nil {
		t.Fatal(err)
	}
	evalUntil(t, ctx, `!document.getElementById('chat').hidden && document.getElementById('chat-model').value === 'stories260K'`, 10*time.Second)
	if err := chromedp.Do(ctx, chromedp.Evaluate[chromedp.Void](`document.getElementById('chat-input').value = 'Tell me a story'; document.getElementById('chat-send').click()`)); err != nil {
		t.Fatal(err)
	}
	evalUntil(t, ctx, `(() => { const m = document.querySelector('.msg.assistant[data-done="true"]');
		return !!m && m.textContent === 'Once upon a <b>time</b>' && m.children.length === 0; })()`, 10*time.Second)
	// A base model (no chat template): the panel continues the text
	// through /v1/completions and says so.
	if err := chromedp.Do(ctx, chromedp.Evaluate[chromedp.Void](`document.getElementById('chat-model').value = 'base'; document.getElementById('chat-input').value = 'Once upon'; document.getElementById('chat-send').click()`)); err != nil {
		t.Fatal(err)
	}
	evalUntil(t, ctx, `(() => { const m = document.querySelectorAll('.msg.assistant[data-done="true"]');
		return m.length === 2 && m[1].textContent === 'Once upon a time there' && m[1].dataset.mode === 'completion' && !!document.querySelector('.msg.note'); })()`, 10*time.Second)
	screenshot(t, ctx, "dashboard-chat.png")
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 3 || got[0]["stream"] != true || got[0]["model"] != "stories260K" || fmt.Sprint(got[0]["messages"]) != "[map[content:Tell me a story role:user]]" ||
		got[1]["path"] != "/v1/chat/completions" || got[2]["path"] != "/v1/completions" || got[2]["prompt"] != "Once upon" || got[2]["stream"] != true {
		t.Fatalf("requests %v", got)
	}
}

// Issue 22: a self-placing node whose budget holds part of a model, alone
// in its swarm: the model is not routable, and the dashboard says what
// placement is doing about it (here: why no plan can make a route).
func TestDashboardShowsPlacementWhy(t *testing.T) {
	exe := chromium(t)
	bin := cli(t)
	model := filepath.Join(t.TempDir(), "why.gguf")
	if _, err := run(t, bin, "shard", "synth", "--layers", "12", "--embd", "64", "--ff", "128", "--name", "why", "-o", model); err != nil {
		t.Fatal(err)
	}
	a := startProc(t, bin, append([]string{"start", "--model", model, "--memory", "10M", "--ctx", "512", "--batch", "64", "--metrics", "127.0.0.1:0"},
		netArgs("whytest", dataDir(t, "a"))...)...)
	ctx := browser(t, exe)
	if err := chromedp.Do(ctx, chromedp.Navigate("http://"+a.metrics+"/")); err != nil {
		t.Fatal(err)
	}
	took := evalUntil(t, ctx, `document.querySelector('.model .badge.bad') !== null &&
		!!document.querySelector('.model .placement-why') &&
		document.querySelector('.model .placement-why').textContent.includes('no heal plan')`, 30*time.Second)
	why, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector('.model .placement-why').textContent`))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("shown %v after load: %s", took.Round(time.Millisecond), why)
	screenshot(t, ctx, "dashboard-placement-why.png")
}
