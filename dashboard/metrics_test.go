package dashboard_test

import (
	"fmt"
	"net/http"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/neuron-tai/meshp2p/internal/testmodels"
	"github.com/neuron-tai/meshp2p/status"
)

// A real two-node swarm started through the CLI with --metrics, after one
// generation and one refusal: exact counter values on both hops, go-libp2p
// and runtime metrics present, meshp2p's names pass Prometheus's linter,
// `status --json` prints the document /api/status serves, and the
// dashboard is served with its CSP.
func TestMetricsStatusAndDashboard(t *testing.T) {
	bin := cli(t)
	model := testmodels.Path(t, "stories260K.gguf")
	const nEmbd = 64 // stories260K
	head := startProc(t, bin, append([]string{"start", "--model", model, "--layers", "0-3", "--metrics", "127.0.0.1:0",
		"--max-session-kv", "64"}, netArgs("metricstest", dataDir(t, "head"))...)...)
	tail := startProc(t, bin, append([]string{"start", "--model", model, "--layers", "3-5", "--metrics", "127.0.0.1:0",
		"--bootstrap", head.addr}, netArgs("metricstest", dataDir(t, "tail"))...)...)
	if head.metrics == "" || tail.metrics == "" {
		t.Fatalf("no metrics address printed:\n%s", head.logs.String())
	}
	client := []string{"--model", "stories260K", "--bootstrap", head.addr, "--wait", "30s", "--network", "metricstest",
		"--listen", "/ip4/127.0.0.1/tcp/0"}

	// One generation of 12 tokens...
	out, err := run(t, bin, append([]string{"generate", "--prompt", "Once upon a time", "--max-tokens", "12", "--json"}, client...)...)
	if err != nil {
		t.Fatal(err)
	}
	var gen struct {
		Tokens []int32 `json:"tokens"`
		Stop   string  `json:"stop"`
	}
	decodeJSON(t, out, &gen)
	if len(gen.Tokens) != 12 || gen.Stop != "max_tokens" {
		t.Fatalf("generation: %s", out)
	}
	// ...and one the head refuses: 100 tokens need more KV cells than the
	// 64 one session may reserve there.
	if _, err := run(t, bin, append([]string{"generate", "--prompt", "Once upon a time", "--max-tokens", "100"}, client...)...); err == nil ||
		!strings.Contains(err.Error(), "KV cells") {
		t.Fatalf("want a KV refusal, got %v", err)
	}

	ok := map[string]string{"reason": "ok"}
	hf := waitValue(t, head.metrics, "meshp2p_sessions_ended_total", ok, 1)
	tf := waitValue(t, tail.metrics, "meshp2p_sessions_ended_total", ok, 1)
	decode, prefill := map[string]string{"kind": "decode"}, map[string]string{"kind": "prefill"}
	prompt := value(hf, "meshp2p_hop_rows_total", prefill)
	want := []struct {
		fams   string
		name   string
		labels map[string]string
		v      float64
	}{
		{"head", "meshp2p_sessions_admitted_total", nil, 1},
		{"head", "meshp2p_sessions_refused_total", map[string]string{"reason": "bad_request"}, 1},
		{"head", "meshp2p_tokens_served_total", nil, 12},
		{"head", "meshp2p_hop_rows_total", decode, 11}, // the 12th token is not fed back
		{"head", "meshp2p_hop_compute_seconds", decode, 11},
		{"head", "meshp2p_seam_sent_bytes_total", map[string]string{"path": "direct"}, (prompt + 11) * nEmbd * 4},
		{"head", "meshp2p_seam_write_seconds", map[string]string{"path": "direct"}, 2 + 11}, // the prefill in two chunks (the first of session.FirstChunkRows), 11 steps
		{"head", "meshp2p_seam_sent_bytes_total", map[string]string{"path": "relayed"}, 0},
		{"head", "meshp2p_sessions_active", nil, 0},
		{"head", "meshp2p_kv_cells", nil, 4096},
		{"head", "meshp2p_kv_cells_used", nil, 0},
		{"head", "meshp2p_kv_compactions_total", nil, 0}, // one session in 4096 cells: never needed
		{"head", "meshp2p_adverts", nil, 1},
		{"tail", "meshp2p_sessions_admitted_total", nil, 1},
		{"tail", "meshp2p_sessions_refused_total", map[string]string{"reason": "bad_request"}, -1}, // never reached the tail
		{"tail", "meshp2p_tokens_served_total", nil, 0},
		{"tail", "meshp2p_hop_rows_total", decode, 11},
		{"tail", "meshp2p_hop_rows_total", prefill, prompt},
		{"tail", "meshp2p_seam_write_seconds", map[string]string{"path": "direct"}, 12}, // 12 tokens over the ring
	}
	for _, w := range want {
		fams := hf
		if w.fams == "tail" {
			fams = tf
		}
		if got := value(fams, w.name, w.labels); got != w.v {
			t.Errorf("%s %s%v = %v, want %v", w.fams, w.name, w.labels, got, w.v)
		}
	}
	if prompt < 2 {
		t.Errorf("prefill rows %v", prompt)
	}
	// go-libp2p's, the runtime's and the process's metrics are there.
	for _, name := range []string{"libp2p_rcmgr_streams", "libp2p_swarm_dial_ranking_delay_seconds", "libp2p_identify_identify_total",
		"go_goroutines", "process_resident_memory_bytes", "meshp2p_peers"} {
		if hf[name] == nil {
			t.Errorf("head /metrics lacks %s", name)
		}
	}
	if v := value(hf, "meshp2p_peers", map[string]string{"path": "direct"}); v < 1 {
		t.Errorf("meshp2p_peers{path=direct} = %v", v)
	}

	// Prometheus's linter: no problem in meshp2p's metrics.
	_, body := scrape(t, head.metrics)
	problems, err := promlint.New(strings.NewReader(body)).Lint()
	if err != nil {
		t.Fatal(err)
	}
	var others []string
	for _, p := range problems {
		if strings.HasPrefix(p.Metric, "meshp2p_") {
			t.Errorf("promlint: %s: %s", p.Metric, p.Text)
		} else {
			others = append(others, p.Metric+": "+p.Text)
		}
	}
	if len(others) > 0 {
		t.Logf("promlint on go-libp2p's metrics (not ours): %d problems, e.g. %s", len(others), others[0])
	}

	// `status --json` prints the document /api/status serves.
	var api, cliDoc status.Document
	decodeJSON(t, get(t, "http://"+head.metrics+"/api/status"), &api)
	out, err = run(t, bin, append([]string{"status", "--json", "--wait", "5s"}, client[2:]...)...)
	if err != nil {
		t.Fatal(err)
	}
	decodeJSON(t, out, &cliDoc)
	if api.Version != status.Version || cliDoc.Version != status.Version || api.Self.Role != "node" || cliDoc.Self.Role != "client" {
		t.Fatalf("versions/roles: api %d %s, cli %d %s", api.Version, api.Self.Role, cliDoc.Version, cliDoc.Self.Role)
	}
	if len(api.Models) != 1 || len(cliDoc.Models) != 1 {
		t.Fatalf("models: api %+v\ncli %+v", api.Models, cliDoc.Models)
	}
	am, cm := api.Models[0], cliDoc.Models[0]
	if !reflect.DeepEqual(am.Replicas, []int{1, 1, 1, 1, 1}) || !reflect.DeepEqual(am.Replicas, cm.Replicas) ||
		!reflect.DeepEqual(am.Runs, cm.Runs) || len(am.Gaps) != 0 || len(cm.Gaps) != 0 || !am.Routable || !cm.Routable ||
		am.Fingerprint != cm.Fingerprint || am.NLayer != 5 {
		t.Errorf("coverage differs:\napi %+v\ncli %+v", am, cm)
	}
	spans := func(m status.Model) []string {
		var s []string
		for _, sh := range m.Shards {
			if !sh.Live {
				t.Errorf("shard %s %d-%d not live", sh.Peer, sh.Start, sh.End)
			}
			s = append(s, fmt.Sprintf("%s %d-%d", sh.Peer, sh.Start, sh.End))
		}
		sort.Strings(s)
		return s
	}
	if a, c := spans(am), spans(cm); !reflect.DeepEqual(a, c) || len(a) != 2 || a[0] == "" {
		t.Errorf("shards: api %v, cli %v", a, c)
	}
	if api.Counters.SessionsAdmitted != 1 || api.Counters.TokensServed != 12 || api.Counters.SessionsRefused != 1 || len(api.Routes) != 1 ||
		len(api.Routes[0].Hops) != 2 || api.Routes[0].Hops[1].Path != "direct" {
		t.Errorf("head counters/routes: %+v %+v", api.Counters, api.Routes)
	}

	// A dead node drops out of coverage at once, though its advert
	// lingers: the client's probe cannot dial it, the head has lost it.
	tail.kill()
	out, err = run(t, bin, append([]string{"status", "--json", "--wait", "5s"}, client[2:]...)...)
	if err != nil {
		t.Fatal(err)
	}
	var dead status.Document
	decodeJSON(t, out, &dead)
	if len(dead.Models) != 1 || !reflect.DeepEqual(dead.Models[0].Replicas, []int{1, 1, 1, 0, 0}) || dead.Models[0].Routable ||
		!reflect.DeepEqual(dead.Models[0].Gaps, []status.Run{{Start: 3, End: 5, Replicas: 0}}) {
		t.Fatalf("after the kill, status --json: %+v", dead.Models)
	}
	listed := 0
	for _, sh := range dead.Models[0].Shards {
		if (sh.Peer == tail.id) == sh.Live {
			t.Errorf("shard %s live=%v after the tail was killed", sh.Peer, sh.Live)
		}
		if sh.Peer == tail.id {
			listed++
		}
	}
	if listed != 1 {
		t.Errorf("the dead tail's lingering advert is listed %d times, want once (as dead)", listed)
	}
	decodeJSON(t, get(t, "http://"+head.metrics+"/api/status"), &api)
	if !reflect.DeepEqual(api.Models[0].Replicas, []int{1, 1, 1, 0, 0}) {
		t.Errorf("head after the kill: %+v", api.Models[0])
	}

	// The dashboard: its page and files, with the self-only CSP.
	r, err := http.Get("http://" + head.metrics + "/")
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if csp := r.Header.Get("Content-Security-Policy"); r.StatusCode != 200 || !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "connect-src 'self'") {
		t.Errorf("GET /: %d, CSP %q", r.StatusCode, csp)
	}
	if js := get(t, "http://"+head.metrics+"/ui/app.js"); !strings.Contains(js, "/api/status") || strings.Contains(js, "http://") || strings.Contains(js, "https://") {
		t.Errorf("app.js must poll /api/status and load nothing from elsewhere")
	}
}

// The tracker serves the same: go-libp2p's relay service and its own
// gauges, and counts the tickets it signs.
func TestTrackerMetrics(t *testing.T) {
	bin := cli(t)
	model := testmodels.Path(t, "stories260K.gguf")
	tr := startProc(t, bin, append([]string{"tracker", "--metrics", "127.0.0.1:0"}, netArgs("trackermetrics", dataDir(t, "tracker"))...)...)
	startProc(t, bin, append([]string{"start", "--model", model, "--tracker", tr.addr}, netArgs("trackermetrics", dataDir(t, "node"))...)...)
	waitValue(t, tr.metrics, "meshp2p_adverts", nil, 1)
	fams := waitValue(t, tr.metrics, "meshp2p_tracker_tickets_issued_total", nil, 0)
	for _, name := range []string{"libp2p_relaysvc_status", "libp2p_rcmgr_streams", "libp2p_identify_identify_total", "go_goroutines", "meshp2p_known_shards"} {
		if fams[name] == nil {
			t.Errorf("tracker /metrics lacks %s", name)
		}
	}
	if _, err := run(t, bin, "generate", "--model", "stories260K", "--tracker", tr.addr, "--require-tracker", "--prompt", "Once", "--max-tokens", "4",
		"--wait", "30s", "--network", "trackermetrics", "--listen", "/ip4/127.0.0.1/tcp/0"); err != nil {
		t.Fatal(err)
	}
	waitValue(t, tr.metrics, "meshp2p_tracker_tickets_issued_total", nil, 1)
	_, body := scrape(t, tr.metrics)
	problems, err := promlint.New(strings.NewReader(body)).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if strings.HasPrefix(p.Metric, "meshp2p_") {
			t.Errorf("promlint: %s: %s", p.Metric, p.Text)
		}
	}
	var doc status.Document
	decodeJSON(t, get(t, "http://"+tr.metrics+"/api/status"), &doc)
	if doc.Self.Role != "tracker" || len(doc.Models) != 1 || !doc.Models[0].Routable {
		t.Errorf("tracker status: %+v", doc)
	}
}

// A node that places itself (no --layers) reports the shard it chose:
// its gauges and status follow the window, read at each scrape.
func TestSelfPlacingNodeMetrics(t *testing.T) {
	bin := cli(t)
	model := testmodels.Path(t, "stories260K.gguf")
	n := startProc(t, bin, append([]string{"start", "--model", model, "--memory", "1G", "--ctx", "512", "--metrics", "127.0.0.1:0"},
		netArgs("placemetrics", dataDir(t, "n"))...)...)
	fams := waitValue(t, n.metrics, "meshp2p_kv_cells", nil, 512)
	if v := value(fams, "meshp2p_session_slots", nil); v <= 0 {
		t.Errorf("session slots %v", v)
	}
	var doc status.Document
	decodeJSON(t, get(t, "http://"+n.metrics+"/api/status"), &doc)
	if doc.Self.KVTotal != 512 || doc.Self.End <= doc.Self.Start || len(doc.Models) != 1 || len(doc.Models[0].Shards) != 1 || !doc.Models[0].Shards[0].Self {
		t.Fatalf("status of a self-placing node: %+v %+v", doc.Self, doc.Models)
	}
	t.Logf("chose layers %d-%d", doc.Self.Start, doc.Self.End)
}
