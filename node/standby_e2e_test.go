package node

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/internal/testmodels"
	"github.com/neuron-tai/meshp2p/route"
	"github.com/neuron-tai/meshp2p/session"
)

// A session with a hot standby of its middle hop survives the middle
// node's death without prefilling the prompt again on any hop: the
// second middle node, which computed every frame the first one got while
// a standby, takes its place and adopts its own cells; the head and tail
// adopt theirs. The tokens are `--local`'s (the real engine, greedy).
// Counters, not timing: the new epoch's hops all held the prompt's whole
// blocks (HopCached) and, killed later, those of the tokens generated
// before the kill too (SessionProgress), the origin put the standby in
// (Takeovers), and the standby computed the prompt while it stood by
// (StandbyStats).
func TestStandbyTakesOverWithoutPrefill(t *testing.T) {
	for _, steps := range []int{3, 40} {
		t.Run(strconv.Itoa(steps), func(t *testing.T) { standbyTakeover(t, steps) })
	}
}

// standbyTakeover is TestStandbyTakesOverWithoutPrefill with the covered
// hop killed after steps decode steps.
func standbyTakeover(t *testing.T, steps int) {
	model := testmodels.Path(t, "stories260K.gguf")
	tn, head, mids, tail, c := spareMiddleSwarm(t, model)
	fp, nl := waitModel(t, c, "stories260K")
	prompt := thinClientPrompt(t, c, fp, strings.Repeat("Once upon a time, there was a little girl named Lily. She loved to play outside. ", 8))
	maxTok := 40 + steps
	want := localTokens(t, model, prompt, maxTok)
	byPeer := map[peer.ID]*Node{mids[0].P2P().ID(): mids[0], mids[1].P2P().ID(): mids[1]}
	var covered, standby atomic.Pointer[Node]
	killed := make(chan struct{})
	o := c.Origin(nil)
	o.StandbyAbove = -1                                                         // asked for below, not by length
	o.Audit = &session.Auditor{Rate: 0.5, Draw: func() float64 { return 0.99 }} // transcripts and records (the CLI's default), no audit
	res, err := o.Generate(context.Background(), session.GenerateRequest{Fingerprint: fp, NLayer: nl, Prompt: prompt, MaxTokens: maxTok, Standby: true,
		OnRoute: func(rt *route.Route, reroutes int) {
			if reroutes > 0 || len(rt.Hops) != 3 {
				return
			}
			m := byPeer[rt.Hops[1].Peer]
			covered.Store(m)
			for _, x := range mids {
				if x != m {
					standby.Store(x)
				}
			}
			go killAfterSteps(m, steps, killed, head, tail)
		}})
	<-killed
	if err != nil {
		t.Fatal(err)
	}
	if res.Reroutes != 1 || res.Takeovers != 1 || len(res.Recoveries) != 1 || !equalTokens(res.Tokens, want) {
		t.Fatalf("reroutes %d, takeovers %d, stalls %v\nswarm %v\nlocal %v", res.Reroutes, res.Takeovers, res.Recoveries, res.Tokens, want)
	}
	if res.Route.Hops[1].Peer != standby.Load().P2P().ID() {
		t.Fatalf("the new epoch's middle hop is %s, not the standby", res.Route.Hops[1].Peer)
	}
	// The prompt's whole blocks and those of the first half of the
	// tokens generated before the kill (the origin sends progress as
	// tokens reach it, a little behind the covered hop's steps): 224 of
	// 250 positions when killed after 40 steps.
	blocks := (len(prompt) + steps/2 - 1) / session.PrefixBlock * session.PrefixBlock
	for i, n := range res.HopCached {
		if n < blocks || len(res.HopCached) != 3 {
			t.Fatalf("the new epoch's hops held %v positions (hop %d); want ≥ %d on every hop: none prefills the prompt again", res.HopCached, i, blocks)
		}
	}
	st := standby.Load().Hop().StandbyStats()
	mirror := head.Hop().StandbyStats()
	if st.Sessions != 1 || st.Rows < int64(len(prompt)) || mirror.Dropped != 0 || mirror.MirrorFrames == 0 {
		t.Fatalf("standby %+v, mirror %+v: want one standby session that computed the %d-token prompt, none dropped", st, mirror, len(prompt))
	}
	// /metrics says the same (node/observe.go standbyCounters).
	for _, c := range []struct {
		n    *Node
		name string
		want float64
	}{
		{standby.Load(), "meshp2p_standby_sessions_total", 1},
		{standby.Load(), "meshp2p_standby_rows_total", float64(st.Rows)},
		{head, "meshp2p_standby_mirrored_frames_total", float64(mirror.MirrorFrames)},
		{head, "meshp2p_standby_mirrored_bytes_total", float64(mirror.MirrorBytes)},
		{head, "meshp2p_standby_dropped_total", 0},
	} {
		if got := sample(t, c.n.cfg.Metrics, c.name, ""); got != c.want {
			t.Errorf("%s = %v, want %v", c.name, got, c.want)
		}
	}
	t.Logf("prompt %d tokens; after the kill the hops held %v positions; the standby computed %d rows in %v, the head mirrored %d frames (%d bytes)",
		len(prompt), res.HopCached, st.Rows, st.Compute, mirror.MirrorFrames, mirror.MirrorBytes)
	assertReleased(t, tn, head, tail, mids[0], mids[1])
}

// killAfterSteps kills m's host once it has run steps decode steps
// (closing its connections to neighbours first, as a crash does), then
// closes killed (nil: none).
func killAfterSteps(m *Node, steps int, killed chan<- struct{}, neighbours ...*Node) {
	if killed != nil {
		defer close(killed)
	}
	for deadline := time.Now().Add(2 * time.Minute); m.Hop().DecodeSteps() < steps && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	for _, n := range neighbours {
		_ = m.P2P().Host().Network().ClosePeer(n.P2P().ID())
	}
	_ = m.P2P().Host().Close()
}
