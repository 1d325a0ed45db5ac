package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	"google.golang.org/protobuf/proto"

	"github.com/neuron-tai/meshp2p/p2p"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/route"
	"github.com/neuron-tai/meshp2p/session"
)

// Every meshp2p metric, once each observer method ran, passes
// Prometheus's linter, and the labels take only their fixed values.
func TestMetricsLintAndLabels(t *testing.T) {
	m := New()
	m.SessionAdmitted(session.SessionInfo{Epoch: 2})
	m.SessionRefused(meshp2pb.ErrorCode_ERROR_CODE_NO_CAPACITY)
	m.SessionEnded(meshp2pb.ErrorCode_ERROR_CODE_UNSPECIFIED)
	m.SessionEnded(meshp2pb.ErrorCode_ERROR_CODE_TIMEOUT)
	m.Computed(true, 7, time.Millisecond)
	m.Computed(false, 1, time.Millisecond)
	m.TokenServed()
	m.WindowsInFlight(3)
	m.Verified(4, 3)
	m.Verified(2, 0)
	m.WindowsInFlight(-2)
	m.SeamWrite(p2p.PathDirect, 256, time.Microsecond)
	m.SeamWrite(p2p.PathRelayed, 512, time.Microsecond)
	m.SeamWrite(p2p.PathNone, 1, time.Microsecond) // no path label for "none"
	m.RoutePlanned(time.Millisecond, nil)
	m.RoutePlanned(time.Millisecond, fmt.Errorf("x: %w", route.ErrNoRoute))
	m.RoutePlanned(time.Millisecond, errors.New("tracker down"))
	m.FirstToken(50 * time.Millisecond)
	m.Rerouted()
	m.Rerouted()
	m.TakenOver()
	m.Recovered(time.Second)
	for i := 0; i < 12; i++ {
		m.TokenReceived()
	}
	m.GenerationDone(12, nil)
	m.Gauge("kv_cells", "KV cache cells.", func() float64 { return 4096 })
	if m.Gauge("kv_cells", "again", func() float64 { return 1 }) {
		t.Fatal("a second gauge of the same name was registered")
	}
	m.Counter("tracker_tickets_issued_total", "Tickets.", func() float64 { return 3 })
	m.GaugeVec("peers", "Peers by path.", "path", func() map[string]float64 { return map[string]float64{"direct": 2, "relayed": 1} })

	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body := rec.Body.String()
	problems, err := promlint.New(strings.NewReader(body)).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
	for _, want := range []string{
		`meshp2p_sessions_refused_total{reason="no_capacity"} 1`,
		`meshp2p_sessions_ended_total{reason="ok"} 1`,
		`meshp2p_sessions_ended_total{reason="timeout"} 1`,
		`meshp2p_hop_rows_total{kind="prefill"} 7`,
		`meshp2p_seam_sent_bytes_total{path="relayed"} 512`,
		`meshp2p_route_plan_seconds_count{result="no_route"} 1`,
		`meshp2p_generated_tokens_total 12`,
		`meshp2p_reroutes_total 2`,
		`meshp2p_standby_takeovers_total 1`,
		`meshp2p_spec_windows_total 2`,
		`meshp2p_spec_proposed_total 6`,
		`meshp2p_spec_accepted_total 3`,
		`meshp2p_spec_windows_in_flight 1`,
		`meshp2p_kv_cells 4096`,
		`meshp2p_tracker_tickets_issued_total 3`,
		`meshp2p_peers{path="relayed"} 1`,
		"go_goroutines", "process_cpu_seconds_total",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if n := testutil.CollectAndCount(m.seamBytes); n != 2 {
		t.Errorf("seam bytes has %d series, want direct and relayed only", n)
	}
}

// Two hosts of one process (a gateway's client beside a serving node)
// share the process's registry: go-libp2p's collectors are registered
// once, meshp2p's gauges of the same name once, and a scrape works.
func TestTwoHostsShareARegistry(t *testing.T) {
	m := New()
	for i := 0; i < 2; i++ {
		n, err := p2p.New(context.Background(), p2p.Config{Network: "metricsshare", DataDir: t.TempDir(), Metrics: m.Registry,
			ListenAddrs: []string{"/ip4/127.0.0.1/tcp/0"}, RelayService: i == 0, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		m.P2P(n)
	}
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), "libp2p_rcmgr_") || !strings.Contains(rec.Body.String(), "meshp2p_adverts 0") {
		t.Fatalf("scrape: %d\n%.2000s", rec.Code, rec.Body.String())
	}
}

// The demand gauges: per model some peer serves or offers, by fingerprint
// prefix; a report naming a made-up model adds no series.
func TestDemandGauges(t *testing.T) {
	fp, made := strings.Repeat("ab", 32), strings.Repeat("cd", 32)
	tb := route.NewTable()
	body, _ := proto.Marshal(&meshp2pb.CapabilityAdvert{
		Offers: []*meshp2pb.ModelOffer{{ModelFingerprint: fp, ModelName: "m", NLayer: 2}},
		Demand: &meshp2pb.DemandReport{MeasuredAtMs: time.Now().UnixMilli(), Models: []*meshp2pb.ModelDemand{
			{ModelFingerprint: fp, Requests: 2, Refused: 1}, {ModelFingerprint: made, Requests: 9}}}})
	tb.Apply(p2p.Advert{Peer: "peer-a", Body: body, ExpiresAt: time.Now().Add(time.Minute)})
	m := New()
	m.Table(tb)
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	out := rec.Body.String()
	// The demand decays from the report's arrival: a hair under 2 and 1.
	for _, want := range []string{`meshp2p_model_offers\{model="abababababababab"\} 1\n`, `meshp2p_model_demand_requests_per_second\{model="abababababababab"\} (2|1\.99\d*)\n`,
		`meshp2p_model_demand_unmet_per_second\{model="abababababababab"\} (1|0\.99\d*)\n`} {
		if !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if strings.Contains(out, "cdcdcdcd") {
		t.Error("a made-up model has a series")
	}
	problems, err := promlint.New(strings.NewReader(out)).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
}
