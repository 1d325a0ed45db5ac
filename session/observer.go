package session

import (
	"strings"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/p2p"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/route"
)

// HopObserver sees what a HopService does, for metrics and the status
// page (package metrics implements it; this package imports no metrics
// library). Calls are made on the data path: implementations must be
// cheap, must not block and must be safe for concurrent use. Arguments are
// bounded sets (wire error codes, paths), never per-session values, except
// for the route of an admitted session, which a status log may keep.
type HopObserver interface {
	// SessionAdmitted: the whole route accepted a session this hop runs.
	SessionAdmitted(SessionInfo)
	// SessionRefused: an open was answered with a refusal, by this hop
	// or relayed from further down the route; code says why.
	SessionRefused(code meshp2pb.ErrorCode)
	// SessionEnded: an admitted session was released; code is
	// ERROR_CODE_UNSPECIFIED for a clean end.
	SessionEnded(code meshp2pb.ErrorCode)
	// Computed: the engine ran rows of one frame (prefill or a decode
	// step) in d.
	Computed(prefill bool, rows int, d time.Duration)
	// TokenServed: the head passed a sampled token to the origin.
	TokenServed()
	// Verified: the head got a verification window's result: proposed
	// tokens verified, of them accepted (speculative sessions).
	Verified(proposed, accepted int)
	// WindowsInFlight: the head's verification windows in flight changed
	// by delta (sent: +, answered or dropped: −).
	WindowsInFlight(delta int)
	// SeamWrite: a frame of bytes (payload bytes for activations) went to
	// the next hop or over the ring in d, on a direct or relayed stream.
	SeamWrite(path p2p.Path, bytes int, d time.Duration)
}

// OriginObserver sees what an Origin does.
type OriginObserver interface {
	// RoutePlanned: the planner answered in d (err nil: a route).
	RoutePlanned(d time.Duration, err error)
	// Routed: an epoch's route is about to be opened (HopIndex -1: this
	// is the origin).
	Routed(SessionInfo)
	// FirstToken: a generation's first token arrived d after it started.
	FirstToken(d time.Duration)
	// TokenReceived: a token reached the origin (each one, first included).
	TokenReceived()
	// Rerouted: a hop failed and the origin re-routes around it.
	Rerouted()
	// Recovered: tokens flow again d after the failure that caused a
	// re-route.
	Recovered(d time.Duration)
	// GenerationDone: a generation ended (err nil: it finished).
	GenerationDone(tokens int, err error)
	// Audited: an audit of a finished generation ended (audit.go).
	Audited(AuditReport)
	// PromptCached: a generation finished whose prompt had prompt tokens,
	// cached of them reused from the hops' prefix caches (prefix.go).
	PromptCached(prompt, cached int)
	// TakenOver: a failed hop's hot standby took its place (standby.go).
	TakenOver()
	// StandbyFed: the origin sent the head's standby a frame of rows
	// input rows (headstandby.go).
	StandbyFed(rows int)
	// StandbyDropped: the origin dropped the head's standby (it lagged
	// behind the bounded queue, or failed).
	StandbyDropped()
}

// SessionInfo describes an admitted session on one hop.
type SessionInfo struct {
	Fingerprint string
	Epoch       uint64 // > 1: the origin re-routed this session
	HopIndex    int
	Hops        []HopInfo
	// Cached is how many positions this hop reused from its prefix cache
	// (SessionAdmitted; prefix.go).
	Cached int
}

// HopInfo is one hop of a route.
type HopInfo struct {
	Peer       peer.ID
	Start, End int
}

// CodeLabel is a wire error code as a short lower-case label
// ("no_capacity"; "ok" for ERROR_CODE_UNSPECIFIED): a fixed set, as metric
// labels need.
func CodeLabel(c meshp2pb.ErrorCode) string {
	if c == meshp2pb.ErrorCode_ERROR_CODE_UNSPECIFIED {
		return "ok"
	}
	return strings.ToLower(strings.TrimPrefix(c.String(), "ERROR_CODE_"))
}

// NopHop and nopOrigin are the observers used when none is configured;
// embed NopHop to implement only some of HopObserver's methods.
type NopHop struct{}

func (NopHop) SessionAdmitted(SessionInfo)            {}
func (NopHop) SessionRefused(meshp2pb.ErrorCode)      {}
func (NopHop) SessionEnded(meshp2pb.ErrorCode)        {}
func (NopHop) Computed(bool, int, time.Duration)      {}
func (NopHop) TokenServed()                           {}
func (NopHop) Verified(int, int)                      {}
func (NopHop) WindowsInFlight(int)                    {}
func (NopHop) SeamWrite(p2p.Path, int, time.Duration) {}
func (nopOrigin) RoutePlanned(time.Duration, error)   {}
func (nopOrigin) TokenReceived()                      {}
func (nopOrigin) FirstToken(time.Duration)            {}
func (nopOrigin) Rerouted()                           {}
func (nopOrigin) Recovered(time.Duration)             {}
func (nopOrigin) GenerationDone(int, error)           {}
func (nopOrigin) Audited(AuditReport)                 {}
func (nopOrigin) Routed(SessionInfo)                  {}
func (nopOrigin) PromptCached(int, int)               {}
func (nopOrigin) TakenOver()                          {}
func (nopOrigin) StandbyFed(int)                      {}
func (nopOrigin) StandbyDropped()                     {}

type nopOrigin struct{}

func sessionInfo(open *meshp2pb.SessionOpen, idx int) SessionInfo {
	si := SessionInfo{Fingerprint: open.GetModelFingerprint(), Epoch: open.GetEpoch(), HopIndex: idx}
	for _, h := range open.GetRoute().GetHops() {
		si.Hops = append(si.Hops, HopInfo{Peer: peer.ID(h.GetPeerId()), Start: int(h.GetStart()), End: int(h.GetEnd())})
	}
	return si
}

func routeInfo(rt *route.Route) SessionInfo {
	si := SessionInfo{Fingerprint: rt.Fingerprint, Epoch: rt.Epoch, HopIndex: -1}
	for _, h := range rt.Hops {
		si.Hops = append(si.Hops, HopInfo{Peer: h.Peer, Start: h.Start, End: h.End})
	}
	return si
}

// errCode is the wire code of a session's end (UNSPECIFIED: clean).
func errCode(err error) meshp2pb.ErrorCode {
	if err == nil {
		return meshp2pb.ErrorCode_ERROR_CODE_UNSPECIFIED
	}
	if he, ok := err.(*hopError); ok {
		return he.e.GetCode()
	}
	return meshp2pb.ErrorCode_ERROR_CODE_INTERNAL
}

// HopObservers fans every call out to each non-nil observer in turn.
type HopObservers []HopObserver

func (o HopObservers) SessionAdmitted(si SessionInfo) {
	for _, x := range o {
		x.SessionAdmitted(si)
	}
}
func (o HopObservers) SessionRefused(c meshp2pb.ErrorCode) {
	for _, x := range o {
		x.SessionRefused(c)
	}
}
func (o HopObservers) SessionEnded(c meshp2pb.ErrorCode) {
	for _, x := range o {
		x.SessionEnded(c)
	}
}
func (o HopObservers) Computed(prefill bool, rows int, d time.Duration) {
	for _, x := range o {
		x.Computed(prefill, rows, d)
	}
}
func (o HopObservers) TokenServed() {
	for _, x := range o {
		x.TokenServed()
	}
}
func (o HopObservers) Verified(proposed, accepted int) {
	for _, x := range o {
		x.Verified(proposed, accepted)
	}
}
func (o HopObservers) WindowsInFlight(delta int) {
	for _, x := range o {
		x.WindowsInFlight(delta)
	}
}
func (o HopObservers) SeamWrite(p p2p.Path, bytes int, d time.Duration) {
	for _, x := range o {
		x.SeamWrite(p, bytes, d)
	}
}

// OriginObservers fans every call out to each observer in turn.
type OriginObservers []OriginObserver

func (o OriginObservers) RoutePlanned(d time.Duration, err error) {
	for _, x := range o {
		x.RoutePlanned(d, err)
	}
}
func (o OriginObservers) Routed(si SessionInfo) {
	for _, x := range o {
		x.Routed(si)
	}
}
func (o OriginObservers) FirstToken(d time.Duration) {
	for _, x := range o {
		x.FirstToken(d)
	}
}
func (o OriginObservers) TokenReceived() {
	for _, x := range o {
		x.TokenReceived()
	}
}
func (o OriginObservers) Rerouted() {
	for _, x := range o {
		x.Rerouted()
	}
}
func (o OriginObservers) Recovered(d time.Duration) {
	for _, x := range o {
		x.Recovered(d)
	}
}
func (o OriginObservers) GenerationDone(tokens int, err error) {
	for _, x := range o {
		x.GenerationDone(tokens, err)
	}
}
func (o OriginObservers) Audited(r AuditReport) {
	for _, x := range o {
		x.Audited(r)
	}
}
func (o OriginObservers) PromptCached(prompt, cached int) {
	for _, x := range o {
		x.PromptCached(prompt, cached)
	}
}
func (o OriginObservers) TakenOver() {
	for _, x := range o {
		x.TakenOver()
	}
}
func (o OriginObservers) StandbyFed(rows int) {
	for _, x := range o {
		x.StandbyFed(rows)
	}
}
func (o OriginObservers) StandbyDropped() {
	for _, x := range o {
		x.StandbyDropped()
	}
}
