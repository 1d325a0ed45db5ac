package status

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/neuron-tai/meshp2p/p2p"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/session"
)

// MaxRoutes is how many recent routes a Recorder keeps.
const MaxRoutes = 20

// Recorder keeps the running totals and the recent routes of the status
// document. It is a session.HopObserver and session.OriginObserver; the
// zero value is ready.
type Recorder struct {
	admitted, refused, served, rows, reroutes, gens, received atomic.Uint64
	windows, proposed, accepted                               atomic.Uint64
	auditsPassed, auditsFailed, auditsInconclusive            atomic.Uint64

	mu     sync.Mutex
	routes []Route // ring, oldest first, at most MaxRoutes
}

var _ session.HopObserver = (*Recorder)(nil)
var _ session.OriginObserver = (*Recorder)(nil)

func (r *Recorder) SessionAdmitted(si session.SessionInfo) {
	r.admitted.Add(1)
	if si.Epoch > 1 {
		r.reroutes.Add(1)
	}
	r.add(si)
}

// Routed records a route this node's origin opens (its re-routes are
// counted by Rerouted).
func (r *Recorder) Routed(si session.SessionInfo) { r.add(si) }

func (r *Recorder) add(si session.SessionInfo) {
	rt := Route{Time: time.Now().UTC(), Fingerprint: si.Fingerprint, Epoch: si.Epoch, Reroute: si.Epoch > 1, HopIndex: si.HopIndex}
	for _, h := range si.Hops {
		rt.Hops = append(rt.Hops, Hop{Peer: h.Peer.String(), Start: h.Start, End: h.End})
	}
	r.mu.Lock()
	if len(r.routes) >= MaxRoutes {
		r.routes = append(r.routes[:0], r.routes[1:]...)
	}
	r.routes = append(r.routes, rt)
	r.mu.Unlock()
}

func (r *Recorder) SessionRefused(meshp2pb.ErrorCode) { r.refused.Add(1) }
func (r *Recorder) SessionEnded(meshp2pb.ErrorCode)   {}
func (r *Recorder) Computed(prefill bool, rows int, _ time.Duration) {
	if !prefill {
		r.rows.Add(uint64(rows))
	}
}
func (r *Recorder) TokenServed()        { r.served.Add(1) }
func (r *Recorder) WindowsInFlight(int) {}
func (r *Recorder) Verified(proposed, accepted int) {
	r.windows.Add(1)
	r.proposed.Add(uint64(proposed))
	r.accepted.Add(uint64(accepted))
}
func (r *Recorder) SeamWrite(p2p.Path, int, time.Duration) {}
func (r *Recorder) RoutePlanned(time.Duration, error)      {}
func (r *Recorder) FirstToken(time.Duration)               {}
func (r *Recorder) TokenReceived()                         { r.received.Add(1) }
func (r *Recorder) Rerouted()                              { r.reroutes.Add(1) }
func (r *Recorder) Recovered(time.Duration)                {}
func (r *Recorder) GenerationDone(int, error)              { r.gens.Add(1) }
func (r *Recorder) PromptCached(int, int)                  {}
func (r *Recorder) TakenOver()                             {}
func (r *Recorder) StandbyFed(int)                         {}
func (r *Recorder) StandbyDropped()                        {}
func (r *Recorder) Audited(rep session.AuditReport) {
	switch rep.Outcome {
	case session.AuditPassed:
		r.auditsPassed.Add(1)
	case session.AuditFailed:
		r.auditsFailed.Add(1)
	case session.AuditInconclusive:
		r.auditsInconclusive.Add(1)
	}
}

// Counters returns the running totals (SessionsActive is the caller's).
func (r *Recorder) Counters() Counters {
	return Counters{SessionsAdmitted: r.admitted.Load(), SessionsRefused: r.refused.Load(), TokensServed: r.served.Load(),
		DecodeRows: r.rows.Load(), Reroutes: r.reroutes.Load(), Generations: r.gens.Load(), TokensReceived: r.received.Load(),
		SpecWindows: r.windows.Load(), SpecProposed: r.proposed.Load(), SpecAccepted: r.accepted.Load(),
		AuditsPassed: r.auditsPassed.Load(), AuditsFailed: r.auditsFailed.Load(), AuditsInconclusive: r.auditsInconclusive.Load()}
}

// Routes returns the recent routes, newest first.
func (r *Recorder) Routes() []Route {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Route, 0, len(r.routes))
	for i := len(r.routes) - 1; i >= 0; i-- {
		rt := r.routes[i]
		rt.Hops = append([]Hop(nil), rt.Hops...)
		out = append(out, rt)
	}
	return out
}
