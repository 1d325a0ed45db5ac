package session

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/neuron-tai/meshp2p/p2p"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// recObs records every observer call.
type recObs struct {
	mu       sync.Mutex
	admitted []SessionInfo
	refused  []meshp2pb.ErrorCode
	ended    []meshp2pb.ErrorCode
	decode   int
	prefill  int
	served   int
	writes   map[p2p.Path]int
	planned  int
	ttft     int
	reroutes int
	recover  int
	// fed and sbDropped count the head standby's rows and drops.
	fed, sbDropped int
	done           []int
	routed         []SessionInfo
	received       int
}

func (r *recObs) lock() func() { r.mu.Lock(); return r.mu.Unlock }
func (r *recObs) SessionAdmitted(si SessionInfo) {
	defer r.lock()()
	r.admitted = append(r.admitted, si)
}
func (r *recObs) SessionRefused(c meshp2pb.ErrorCode) {
	defer r.lock()()
	r.refused = append(r.refused, c)
}
func (r *recObs) SessionEnded(c meshp2pb.ErrorCode) { defer r.lock()(); r.ended = append(r.ended, c) }
func (r *recObs) Computed(prefill bool, rows int, _ time.Duration) {
	defer r.lock()()
	if prefill {
		r.prefill += rows
	} else {
		r.decode += rows
	}
}
func (r *recObs) TokenServed()                    { defer r.lock()(); r.served++ }
func (r *recObs) Verified(proposed, accepted int) {}
func (r *recObs) WindowsInFlight(int)             {}
func (r *recObs) SeamWrite(p p2p.Path, _ int, _ time.Duration) {
	defer r.lock()()
	if r.writes == nil {
		r.writes = map[p2p.Path]int{}
	}
	r.writes[p]++
}
func (r *recObs) RoutePlanned(time.Duration, error) { defer r.lock()(); r.planned++ }
func (r *recObs) FirstToken(time.Duration)          { defer r.lock()(); r.ttft++ }
func (r *recObs) TokenReceived()                    { defer r.lock()(); r.received++ }
func (r *recObs) Routed(si SessionInfo)             { defer r.lock()(); r.routed = append(r.routed, si) }
func (r *recObs) Rerouted()                         { defer r.lock()(); r.reroutes++ }
func (r *recObs) Recovered(time.Duration)           { defer r.lock()(); r.recover++ }
func (r *recObs) GenerationDone(n int, _ error)     { defer r.lock()(); r.done = append(r.done, n) }
func (r *recObs) Audited(AuditReport)               {}
func (r *recObs) PromptCached(int, int)             {}
func (r *recObs) TakenOver()                        {}
func (r *recObs) StandbyFed(n int)                  { defer r.lock()(); r.fed += n }
func (r *recObs) StandbyDropped()                   { defer r.lock()(); r.sbDropped++ }

// The observers see a generation with a re-route: the origin plans twice,
// re-routes once and recovers once; the spare hop is admitted at epoch 2;
// the tail computes one decode row per fed-back token of the final epoch.
func TestObserversSeeARerouteGeneration(t *testing.T) {
	obs := make([]*recObs, 4)
	hop := func(i, start, end int) *fakeHop {
		obs[i] = &recObs{}
		return startHop(t, start, end, func(c *HopConfig) { c.Observer = obs[i] })
	}
	head, mid, spare, tail := hop(0, 0, 2), hop(1, 2, 4), hop(2, 2, 4), hop(3, 4, fakeNLay)
	o, c := newOrigin(t, stagePlanner{[][]*fakeHop{{head}, {mid, spare}, {tail}}}, head, mid, spare, tail)
	origin := &recObs{}
	o.Observer = origin
	mid.killAtStep(5, append([]*testHost{c}, hostsOf(head, mid, spare, tail)...)...)
	const maxTok = 30
	res, err := o.Generate(context.Background(), GenerateRequest{Fingerprint: fakeFP, NLayer: fakeNLay, Prompt: []int32{3, 1, 4}, MaxTokens: maxTok})
	if err != nil || res.Reroutes != 1 {
		t.Fatalf("generate: %v, reroutes %d", err, res.Reroutes)
	}
	waitReleased(t, head, spare, tail)
	for _, r := range append(obs, origin) {
		r.mu.Lock() // the hops are done: later reads see everything
		defer r.mu.Unlock()
	}
	if origin.received != maxTok {
		t.Fatalf("origin received %d tokens, want %d", origin.received, maxTok)
	}
	if origin.planned != 2 || origin.ttft != 1 || origin.reroutes != 1 || origin.recover != 1 || len(origin.done) != 1 || origin.done[0] != maxTok {
		t.Fatalf("origin saw planned %d, ttft %d, reroutes %d, recovered %d, done %v", origin.planned, origin.ttft, origin.reroutes, origin.recover, origin.done)
	}
	if len(origin.routed) != 2 || origin.routed[1].Epoch != 2 || origin.routed[1].HopIndex != -1 || origin.routed[1].Hops[1].Peer != spare.host.ID() {
		t.Fatalf("origin routed %+v", origin.routed)
	}
	if len(obs[2].admitted) != 1 || obs[2].admitted[0].Epoch != 2 || obs[2].admitted[0].HopIndex != 1 || len(obs[2].admitted[0].Hops) != 3 ||
		obs[2].admitted[0].Hops[1].Peer != spare.host.ID() {
		t.Fatalf("spare admitted %+v", obs[2].admitted)
	}
	if len(obs[0].admitted) != 2 || obs[0].served < maxTok || len(obs[0].ended) != 2 || obs[0].ended[1] != meshp2pb.ErrorCode_ERROR_CODE_UNSPECIFIED {
		t.Fatalf("head admitted %d, served %d, ended %v", len(obs[0].admitted), obs[0].served, obs[0].ended)
	}
	if obs[0].ended[0] == meshp2pb.ErrorCode_ERROR_CODE_UNSPECIFIED {
		t.Fatalf("the failed epoch ended clean on the head: %v", obs[0].ended)
	}
	// The final epoch re-prefills the prompt and the tokens so far, then
	// feeds back every later token but the last.
	so := obs[2]
	if so.prefill+so.decode != 3+maxTok-1 || so.writes[p2p.PathDirect] == 0 {
		t.Fatalf("spare computed prefill %d + decode %d rows, want %d; writes %v", so.prefill, so.decode, 3+maxTok-1, so.writes)
	}
	if CodeLabel(meshp2pb.ErrorCode_ERROR_CODE_NO_CAPACITY) != "no_capacity" || CodeLabel(0) != "ok" {
		t.Fatal("CodeLabel")
	}
}

// Seam writes are reported with the path their stream runs on: the head's
// seam to a peer reached through a relay counts as relayed, the tail's
// ring (direct) as direct.
func TestObserverSeesSeamPaths(t *testing.T) {
	obs := []*recObs{{}, {}}
	head := startHop(t, 0, 3, func(c *HopConfig) { c.Observer = obs[0] })
	tail := startHop(t, 3, fakeNLay, func(c *HopConfig) { c.Observer = obs[1] })
	head.host.relay(tail.host.ID())
	o, _ := newOrigin(t, stagePlanner{[][]*fakeHop{{head}, {tail}}}, head, tail)
	const maxTok = 10
	if _, err := o.Generate(context.Background(), GenerateRequest{Fingerprint: fakeFP, NLayer: fakeNLay, Prompt: []int32{5, 6}, MaxTokens: maxTok}); err != nil {
		t.Fatal(err)
	}
	waitReleased(t, head, tail)
	for _, r := range obs {
		r.mu.Lock()
		defer r.mu.Unlock()
	}
	// The head writes two prefill chunks (FirstChunkRows, then the rest)
	// and maxTok-1 decode steps; the tail writes maxTok tokens over the
	// ring.
	if w := obs[0].writes; w[p2p.PathRelayed] != 2+maxTok-1 || w[p2p.PathDirect] != 0 {
		t.Fatalf("head seam writes %v, want %d relayed", w, 2+maxTok-1)
	}
	if w := obs[1].writes; w[p2p.PathDirect] != maxTok || w[p2p.PathRelayed] != 0 {
		t.Fatalf("tail ring writes %v, want %d direct", w, maxTok)
	}
	if obs[0].served != maxTok || obs[1].served != 0 {
		t.Fatalf("tokens served: head %d, tail %d", obs[0].served, obs[1].served)
	}
}
