// Package metrics is meshp2p's Prometheus instrumentation: one registry
// per process (never the global default registry) holding the Go runtime
// and process collectors, go-libp2p's own metrics (registered by p2p when
// given Registry) and meshp2p's session, origin and node metrics. It
// implements session.HopObserver and session.OriginObserver, so the
// session package never imports Prometheus. Every label comes from a
// fixed set: no per-session or per-peer labels.
package metrics

import (
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/neuron-tai/meshp2p/demand"
	"github.com/neuron-tai/meshp2p/p2p"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/route"
	"github.com/neuron-tai/meshp2p/session"
)

// Namespace prefixes every meshp2p metric.
const Namespace = "meshp2p"

// Metrics is one process's registry and meshp2p's metrics in it.
type Metrics struct {
	// Registry is what /metrics serves; give it to p2p.Config.Metrics.
	Registry *prometheus.Registry

	admitted   prometheus.Counter
	refused    *prometheus.CounterVec
	ended      *prometheus.CounterVec
	rows       *prometheus.CounterVec
	compute    *prometheus.HistogramVec
	served     prometheus.Counter
	proposed   prometheus.Counter
	accepted   prometheus.Counter
	windows    prometheus.Counter
	inFlight   prometheus.Gauge
	seamWrite  *prometheus.HistogramVec
	seamBytes  *prometheus.CounterVec
	planned    *prometheus.HistogramVec
	ttft       prometheus.Histogram
	reroutes   prometheus.Counter
	recovery   prometheus.Histogram
	gens       *prometheus.CounterVec
	genTokens  prometheus.Counter
	audits     *prometheus.CounterVec
	reused     prometheus.Counter
	prompt     prometheus.Counter
	cached     prometheus.Counter
	takeovers  prometheus.Counter
	headFed    prometheus.Counter
	headDrop   prometheus.Counter
	gaugeNames map[string]bool
	mu         sync.Mutex // guards gaugeNames
}

// Buckets. Compute and seam writes run from tens of microseconds (a small
// model on loopback) to seconds (a long prefill on a slow CPU).
var (
	fastBuckets = prometheus.ExponentialBuckets(50e-6, 4, 10) // 50 µs .. 13 s
	slowBuckets = prometheus.ExponentialBuckets(1e-3, 3, 10)  // 1 ms .. 20 s
)

// New returns a registry with the Go runtime and process collectors and
// meshp2p's metrics registered.
func New() *Metrics {
	r := prometheus.NewRegistry()
	r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := &Metrics{Registry: r, gaugeNames: map[string]bool{}}
	f := factory{r}
	m.admitted = f.counter("sessions_admitted_total", "Route sessions admitted by this hop (the whole route accepted them).")
	m.refused = f.counterVec("sessions_refused_total", "Session opens this hop answered with a refusal, its own or one relayed from further down the route, by wire error code.", "reason")
	m.ended = f.counterVec("sessions_ended_total", "Admitted sessions that ended, by wire error code (ok: a clean end).", "reason")
	m.rows = f.counterVec("hop_rows_total", "Rows this hop's engine computed (decode: one per generated token).", "kind")
	m.compute = f.histogramVec("hop_compute_seconds", "Engine compute time of one frame on this hop.", fastBuckets, "kind")
	m.served = f.counter("tokens_served_total", "Tokens this node, as the head of a route, passed to origins.")
	m.windows = f.counter("spec_windows_total", "Speculative verification windows answered, as the head of a route.")
	m.proposed = f.counter("spec_proposed_total", "Proposed tokens verified by speculative windows, as the head of a route.")
	m.accepted = f.counter("spec_accepted_total", "Proposed tokens the tail accepted, as the head of a route (accepted / proposed: the acceptance rate).")
	m.inFlight = f.gauge("spec_windows_in_flight", "Speculative verification windows in flight, as the head of a route.")
	m.seamWrite = f.histogramVec("seam_write_seconds", "Time to write one frame to the next hop or over the ring to the head.", fastBuckets, "path")
	m.seamBytes = f.counterVec("seam_sent_bytes_total", "Bytes written to next hops and rings (activation payloads, token frames), by path.", "path")
	m.planned = f.histogramVec("route_plan_seconds", "Time the origin's planner took to answer, by result.", slowBuckets, "result")
	m.ttft = f.histogram("ttft_seconds", "Time from the start of a generation to its first token.", slowBuckets)
	m.reroutes = f.counter("reroutes_total", "Re-routes: a hop failed during a generation and the origin routed around it.")
	m.takeovers = f.counter("standby_takeovers_total", "Of them, re-routes where the failed hop's hot standby took its place (no prefill).")
	m.headFed = f.counter("standby_head_fed_rows_total", "Input rows this origin sent the hot standbys of its routes' heads (prompt and committed tokens).")
	m.headDrop = f.counter("standby_head_dropped_total", "Head standbys this origin stopped feeding (lagging behind the bounded queue, or failed).")
	m.recovery = f.histogram("reroute_recovery_seconds", "Time from the failure behind a re-route until tokens flow again.", slowBuckets)
	m.gens = f.counterVec("generations_total", "Generations this origin ran, by result.", "result")
	m.genTokens = f.counter("generated_tokens_total", "Tokens this origin's generations received (counted as they arrive).")
	m.reused = f.counter("hop_prefix_reused_tokens_total", "Positions this hop's sessions reused from its prefix cache instead of computing them.")
	m.prompt = f.counter("prompt_tokens_total", "Prompt tokens of the generations this origin finished.")
	m.cached = f.counter("prompt_cached_tokens_total", "Of them, tokens every hop reused from its prefix cache (cached / prompt: the hit rate).")
	m.audits = f.counterVec("audits_total", "Audits of finished generations this origin ran, by outcome (passed, failed: a hop convicted, inconclusive, skipped).", "outcome")
	for _, k := range []string{"prefill", "decode"} {
		m.rows.WithLabelValues(k)
		m.compute.WithLabelValues(k)
	}
	for _, p := range []string{"direct", "relayed"} {
		m.seamWrite.WithLabelValues(p)
		m.seamBytes.WithLabelValues(p)
	}
	m.ended.WithLabelValues("ok")
	m.gens.WithLabelValues("ok")
	m.gens.WithLabelValues("error")
	return m
}

// Handler serves the registry in the Prometheus exposition format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry})
}

type factory struct{ r prometheus.Registerer }

func (f factory) counter(name, help string) prometheus.Counter {
	c := prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Name: name, Help: help})
	f.r.MustRegister(c)
	return c
}

func (f factory) counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: name, Help: help}, labels)
	f.r.MustRegister(c)
	return c
}

func (f factory) gauge(name, help string) prometheus.Gauge {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: Namespace, Name: name, Help: help})
	f.r.MustRegister(g)
	return g
}

func (f factory) histogram(name, help string, b []float64) prometheus.Histogram {
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: Namespace, Name: name, Help: help, Buckets: b})
	f.r.MustRegister(h)
	return h
}

func (f factory) histogramVec(name, help string, b []float64, labels ...string) *prometheus.HistogramVec {
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Name: name, Help: help, Buckets: b}, labels)
	f.r.MustRegister(h)
	return h
}

// Gauge registers a gauge read from fn at every scrape. A second gauge of
// the same name is ignored (false): two nodes of one process, e.g. a
// gateway's client beside a serving node, share the first one's.
func (m *Metrics) Gauge(name, help string, fn func() float64) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.gaugeNames[name] {
		return false
	}
	m.gaugeNames[name] = true
	m.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: Namespace, Name: name, Help: help}, fn))
	return true
}

// GaugeVec registers a gauge with one label whose values fn returns at
// every scrape (label value → value; the values must come from a fixed
// set). A second one of the same name is ignored.
func (m *Metrics) GaugeVec(name, help, label string, fn func() map[string]float64) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.gaugeNames[name] {
		return false
	}
	m.gaugeNames[name] = true
	m.Registry.MustRegister(&mapGauge{desc: prometheus.NewDesc(Namespace+"_"+name, help, []string{label}, nil), fn: fn})
	return true
}

type mapGauge struct {
	desc *prometheus.Desc
	fn   func() map[string]float64
}

func (g *mapGauge) Describe(ch chan<- *prometheus.Desc) { ch <- g.desc }
func (g *mapGauge) Collect(ch chan<- prometheus.Metric) {
	for k, v := range g.fn() {
		ch <- prometheus.MustNewConstMetric(g.desc, prometheus.GaugeValue, v, k)
	}
}

// P2P registers the gauges of a p2p node: peers by path and the advert
// table's size.
func (m *Metrics) P2P(n *p2p.Node) {
	m.GaugeVec("peers", "Connected peers, by how they are reached.", "path", func() map[string]float64 {
		out := map[string]float64{"direct": 0, "relayed": 0}
		for _, p := range n.Host().Network().Peers() {
			switch n.ConnStatus(p).Path {
			case p2p.PathDirect:
				out["direct"]++
			case p2p.PathRelayed:
				out["relayed"]++
			}
		}
		return out
	})
	m.Gauge("adverts", "Fresh capability adverts of other peers this node holds (its advert table).", func() float64 {
		return float64(len(n.Discovery().Adverts()))
	})
}

// Table registers the size of a capability table (shards known) and the
// swarm's demand per model it merged (docs/placement.md "Many models"),
// labelled by the model's fingerprint (16 hex characters), only for models
// some peer serves or offers: a report naming made-up models adds no
// series.
func (m *Metrics) Table(t *route.Table) {
	m.Gauge("known_shards", "Shards of every model this node's route table knows.", func() float64 { return float64(len(t.Shards(""))) })
	known := func() map[string]bool {
		out := map[string]bool{}
		for _, s := range t.Shards("") {
			out[s.Fingerprint] = true
		}
		for _, o := range t.Offers("") {
			out[o.Fingerprint] = true
		}
		return out
	}
	demandOf := func(pick func(demand.Sample) float64) func() map[string]float64 {
		return func() map[string]float64 {
			d := t.Demand(time.Now())
			out := map[string]float64{}
			for fp := range known() {
				out[fp[:min(16, len(fp))]] = pick(d[fp])
			}
			return out
		}
	}
	m.GaugeVec("model_demand_requests_per_second", "The swarm's requests per second per model, merged from the peers' gossiped reports (decayed).", "model",
		demandOf(func(s demand.Sample) float64 { return s.Requests }))
	m.GaugeVec("model_demand_unmet_per_second", "The swarm's queued plus refused requests per second per model (warming included).", "model",
		demandOf(func(s demand.Sample) float64 { return s.Unmet() }))
	m.GaugeVec("model_offers", "Peers offering to load each model (multi-model nodes serving another).", "model", func() map[string]float64 {
		out := map[string]float64{}
		for fp := range known() {
			out[fp[:min(16, len(fp))]] = 0
		}
		peers := map[string]map[string]bool{}
		for _, o := range t.Offers("") {
			k := o.Fingerprint[:min(16, len(o.Fingerprint))]
			if peers[k] == nil {
				peers[k] = map[string]bool{}
			}
			peers[k][o.Peer.String()] = true
		}
		for k, ps := range peers {
			out[k] = float64(len(ps))
		}
		return out
	})
}

// --- session.HopObserver ---

var _ session.HopObserver = (*Metrics)(nil)
var _ session.OriginObserver = (*Metrics)(nil)

func (m *Metrics) SessionAdmitted(si session.SessionInfo) {
	m.admitted.Inc()
	m.reused.Add(float64(si.Cached))
}
func (m *Metrics) SessionRefused(c meshp2pb.ErrorCode) {
	m.refused.WithLabelValues(session.CodeLabel(c)).Inc()
}
func (m *Metrics) SessionEnded(c meshp2pb.ErrorCode) {
	m.ended.WithLabelValues(session.CodeLabel(c)).Inc()
}
func (m *Metrics) Computed(prefill bool, rows int, d time.Duration) {
	k := "decode"
	if prefill {
		k = "prefill"
	}
	m.rows.WithLabelValues(k).Add(float64(rows))
	m.compute.WithLabelValues(k).Observe(d.Seconds())
}
func (m *Metrics) TokenServed() { m.served.Inc() }

func (m *Metrics) Verified(proposed, accepted int) {
	m.windows.Inc()
	m.proposed.Add(float64(proposed))
	m.accepted.Add(float64(accepted))
}

func (m *Metrics) WindowsInFlight(delta int) { m.inFlight.Add(float64(delta)) }
func (m *Metrics) SeamWrite(p p2p.Path, bytes int, d time.Duration) {
	if p != p2p.PathDirect && p != p2p.PathRelayed {
		return
	}
	m.seamWrite.WithLabelValues(p.String()).Observe(d.Seconds())
	m.seamBytes.WithLabelValues(p.String()).Add(float64(bytes))
}

// --- session.OriginObserver ---

func (m *Metrics) RoutePlanned(d time.Duration, err error) {
	r := "ok"
	switch {
	case errors.Is(err, route.ErrNoRoute):
		r = "no_route"
	case err != nil:
		r = "error"
	}
	m.planned.WithLabelValues(r).Observe(d.Seconds())
}
func (m *Metrics) Routed(session.SessionInfo) {}
func (m *Metrics) FirstToken(d time.Duration) { m.ttft.Observe(d.Seconds()) }
func (m *Metrics) TokenReceived()             { m.genTokens.Inc() }
func (m *Metrics) Rerouted()                  { m.reroutes.Inc() }
func (m *Metrics) Recovered(d time.Duration)  { m.recovery.Observe(d.Seconds()) }
func (m *Metrics) TakenOver()                 { m.takeovers.Inc() }
func (m *Metrics) StandbyFed(rows int)        { m.headFed.Add(float64(rows)) }
func (m *Metrics) StandbyDropped()            { m.headDrop.Inc() }
func (m *Metrics) PromptCached(prompt, cached int) {
	m.prompt.Add(float64(prompt))
	m.cached.Add(float64(cached))
}
func (m *Metrics) GenerationDone(tokens int, err error) {
	r := "ok"
	if err != nil {
		r = "error"
	}
	m.gens.WithLabelValues(r).Inc()
}
func (m *Metrics) Audited(r session.AuditReport) { m.audits.WithLabelValues(string(r.Outcome)).Inc() }

// Counter registers a counter read from fn at every scrape (a total kept
// elsewhere). A second one of the same name is ignored (false).
func (m *Metrics) Counter(name, help string, fn func() float64) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.gaugeNames[name] {
		return false
	}
	m.gaugeNames[name] = true
	m.Registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: Namespace, Name: name, Help: help}, fn))
	return true
}
