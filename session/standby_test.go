package session

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/route"
)

// A hop with a hot standby killed mid-generation: the origin puts the
// standby in its place, and every hop of the new epoch, the standby
// included, starts where its cells end (the prompt's whole blocks, and
// those of the tokens generated before the kill that SessionProgress
// gave the hops): no hop computes the prompt again, and the tokens are
// those of a run without the failure — plain and speculative, head
// (whose standby the origin feeds), middle and tail.
func TestStandbyTakesOver(t *testing.T) {
	for _, tc := range []struct {
		name       string
		pos        int
		spec       bool
		step, want int // the kill's decode step; the new epoch starts at least there
	}{{"middle", 1, false, 5, 96}, {"tail", 2, false, 5, 96}, {"tail-speculative", 2, true, 5, 96}, {"middle-late", 1, false, 50, 128},
		{"head", 0, false, 5, 96}, {"head-speculative", 0, true, 5, 96}, {"head-late", 0, false, 50, 128}} {
		t.Run(tc.name, func(t *testing.T) {
			primary := threeHops(t)
			spare := startHop(t, primary[tc.pos].eng.info.Start, primary[tc.pos].eng.info.End, nil)
			stages := [][]*fakeHop{{primary[0]}, {primary[1]}, {primary[2]}}
			stages[tc.pos] = append(stages[tc.pos], spare)
			caches := map[*fakeHop]*fakeCache{spare: spare.withCache()}
			for _, h := range primary {
				caches[h] = h.withCache()
			}
			o, c := newOrigin(t, stagePlanner{stages}, append(primary, spare)...)
			o.Chunk = 16
			o.StandbyAbove = -1
			o.Shards = func(string) []route.Shard {
				var out []route.Shard
				for _, h := range append(primary, spare) {
					x := h.hop()
					out = append(out, route.Shard{Peer: x.Peer, Fingerprint: fakeFP, NLayer: fakeNLay, Start: x.Start, End: x.End, Addrs: x.Addrs})
				}
				return out
			}
			// Killed in decode step tc.step, once the standby has computed
			// the prompt (the fake engines outrun the standby's own
			// admission otherwise: a standby that comes too late only
			// holds nothing).
			var once sync.Once
			victim, others := primary[tc.pos], append([]*testHost{c}, hostsOf(append(primary, spare)...)...)
			victim.eng.mu.Lock()
			var survivors []*fakeHop
			for i, h := range primary {
				if i != tc.pos {
					survivors = append(survivors, h)
				}
			}
			victim.eng.onStep = func(steps int) {
				// Late: once the origin's SessionProgress reached the
				// hops that survive (the head relays it with its next
				// frame), so that they hold the generated tokens' block.
				if steps < tc.step || (tc.want > 96 && !progressed(survivors)) {
					return
				}
				once.Do(func() {
					for deadline := time.Now().Add(10 * time.Second); spare.svc.StandbyStats().Rows < 100 && time.Now().Before(deadline); {
						time.Sleep(time.Millisecond)
					}
					victim.kill(others...)
				})
			}
			victim.eng.mu.Unlock()
			prompt := make([]int32, 100)
			for i := range prompt {
				prompt[i] = int32(i%50 + 1)
			}
			maxTok := 30 + tc.step
			req := GenerateRequest{Fingerprint: fakeFP, NLayer: fakeNLay, Prompt: prompt, MaxTokens: maxTok, Standby: true,
				Sampling: &meshp2pb.SamplingParams{Seed: 5}}
			if tc.spec {
				req.Speculation = &meshp2pb.Speculation{Mode: meshp2pb.SpecMode_SPEC_MODE_NGRAM}
			}
			res, err := o.Generate(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			if want := reference(prompt, maxTok, 5); !equal(res.Tokens, want) {
				t.Fatalf("tokens %v\nwant   %v", res.Tokens, want)
			}
			if res.Reroutes != 1 || res.Takeovers != 1 || res.Standbys != 1 || res.Route.Hops[tc.pos].Peer != spare.host.ID() {
				t.Fatalf("reroutes %d, takeovers %d, standbys %d, hop %d now %s (the standby is %s)", res.Reroutes, res.Takeovers, res.Standbys,
					tc.pos, res.Route.Hops[tc.pos].Peer, spare.host.ID())
			}

			for i := range res.Route.Hops {
				hop := primary[i]
				if i == tc.pos {
					hop = spare
				}
				adopted, first, _ := caches[hop].snapshot()
				if len(first) == 0 || adopted[len(adopted)-1] < tc.want || first[len(first)-1] < tc.want {
					t.Fatalf("hop %d adopted %v and first computed %v: want the new epoch at %d or later", i, adopted, first, tc.want)
				}
			}
			if st := spare.svc.StandbyStats(); st.Sessions != 1 || st.Rows < int64(len(prompt)) {
				t.Fatalf("standby stats %+v: want one session that computed the prompt", st)
			}
			alive := []*fakeHop{spare}
			for i, h := range primary {
				if i != tc.pos {
					alive = append(alive, h)
				}
			}
			waitReleased(t, alive...)
		})
	}
}

// progressed reports whether every hop of hops holds a session that got
// a SessionProgress (a continuation of its open's chain).
func progressed(hops []*fakeHop) bool {
	for _, h := range hops {
		h.svc.mu.Lock()
		ok := false
		for _, hs := range h.svc.active {
			if p := hs.prefixMore.Load(); p != nil && len(*p) > 0 {
				ok = true
			}
		}
		h.svc.mu.Unlock()
		if !ok {
			return false
		}
	}
	return true
}

// A standby that does not take its frames is dropped once the mirror's
// queue is full: the mirror never waits for it.
func TestLaggingStandbyIsDropped(t *testing.T) {
	h := &HopService{log: slog.New(slog.DiscardHandler)}
	m := &mirror{hs: &hopSession{h: h}, q: make(chan *meshp2pb.StreamMessage, StandbyQueueFrames), pay: map[*meshp2pb.StreamMessage][]byte{}, standbyLink: newStandbyLink()}
	for range StandbyQueueFrames + 3 {
		m.activation(&meshp2pb.ActivationHeader{NRows: 1}, make([]byte, 8))
	}
	select {
	case <-m.gone:
	default:
		t.Fatal("a full queue did not drop the standby")
	}
	if st := h.StandbyStats(); st.Dropped != 1 || len(m.q) != StandbyQueueFrames {
		t.Fatalf("dropped %d times, %d frames queued", st.Dropped, len(m.q))
	}
	m = &mirror{hs: &hopSession{h: h}, q: make(chan *meshp2pb.StreamMessage, StandbyQueueFrames), pay: map[*meshp2pb.StreamMessage][]byte{}, standbyLink: newStandbyLink()}
	m.activation(&meshp2pb.ActivationHeader{NRows: 1}, make([]byte, StandbyQueueBytes+1))
	if !m.dropped.Load() || h.StandbyStats().Dropped != 2 {
		t.Fatal("a frame over the queue's bytes did not drop the standby")
	}
}

// The origin's feed of a head standby that does not take its frames is
// dropped once its queue is full: pushing never waits, the drop is
// counted once, and the standby is lost (it will not take over).
func TestLaggingHeadStandbyIsDropped(t *testing.T) {
	obs := &recObs{}
	f := &headFeed{o: &Origin{Logger: quiet, Observer: obs}, open: &meshp2pb.SessionOpen{}, q: make(chan *meshp2pb.StreamMessage, StandbyQueueFrames),
		standbyLink: newStandbyLink(), end: make(chan struct{}), done: make(chan struct{})}
	pushed := make(chan struct{})
	go func() {
		defer close(pushed)
		for i := range StandbyQueueFrames + 3 {
			f.token(int32(i), uint32(100+i))
		}
		f.message(&meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Close{Close: &meshp2pb.SessionClose{}}})
	}()
	select {
	case <-pushed:
	case <-time.After(5 * time.Second):
		t.Fatal("the origin blocked on a lagging head standby")
	}
	select {
	case <-f.gone:
	default:
		t.Fatal("a full queue did not drop the head standby")
	}
	if !f.lost() || obs.sbDropped != 1 || len(f.q) != StandbyQueueFrames {
		t.Fatalf("lost %v, dropped %d times, %d frames queued", f.lost(), obs.sbDropped, len(f.q))
	}
	var none *headFeed // no head standby: every call is a no-op
	none.token(1, 1)
	none.finish()
	if none.lost() {
		t.Fatal("no feed reported a lost standby")
	}
}

// Who gets a standby: one asked for; a prompt of StandbyAbove tokens or
// more unless it refuses one; nobody by length when StandbyAbove < 0.
func TestWantsStandby(t *testing.T) {
	long, short := make([]int32, DefaultStandbyAbove), make([]int32, DefaultStandbyAbove-1)
	for _, c := range []struct {
		name  string
		above int
		req   GenerateRequest
		want  bool
	}{
		{"short", 0, GenerateRequest{Prompt: short}, false},
		{"long", 0, GenerateRequest{Prompt: long}, true},
		{"short, asked", 0, GenerateRequest{Prompt: short, Standby: true}, true},
		{"long, refused", 0, GenerateRequest{Prompt: long, NoStandby: true}, false},
		{"asked and refused: asked wins", 0, GenerateRequest{Prompt: short, Standby: true, NoStandby: true}, true},
		{"long, only when asked", -1, GenerateRequest{Prompt: long}, false},
		{"above 10", 10, GenerateRequest{Prompt: short[:10]}, true},
	} {
		if got := (&Origin{StandbyAbove: c.above}).wantsStandby(c.req); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// A standby dropped before the hop it covers failed (here: the standby's
// peer died) is not put in the failed hop's place. A middle hop's standby
// is dropped by the mirror on the hop before, whose report says so
// (Error.standby_lost); the head's by the origin, which knows it dropped
// it (headFeed.lost). Either way the origin re-routes as without a
// standby, through a live replica, in one re-route, and names it no more.
func TestDroppedStandbyDoesNotTakeOver(t *testing.T) {
	for _, covered := range []int{1, 0} {
		t.Run(map[int]string{0: "head", 1: "middle"}[covered], func(t *testing.T) { testDroppedStandby(t, covered) })
	}
}

func testDroppedStandby(t *testing.T, covered int) {
	primary := threeHops(t)
	victim := primary[covered]
	start, end := victim.eng.info.Start, victim.eng.info.End
	standby, replica := startHop(t, start, end, nil), startHop(t, start, end, nil)
	all := append(primary, standby, replica)
	stages := [][]*fakeHop{{primary[0]}, {primary[1]}, {primary[2]}}
	stages[covered] = []*fakeHop{victim, replica, standby}
	o, c := newOrigin(t, stagePlanner{stages}, all...)
	obs := &recObs{}
	o.Observer = obs
	o.Chunk = 16
	o.StandbyAbove = -1
	o.Shards = func(string) []route.Shard { // the standby is the replica listed first
		var out []route.Shard
		for _, h := range []*fakeHop{standby, replica} {
			x := h.hop()
			out = append(out, route.Shard{Peer: x.Peer, Fingerprint: fakeFP, NLayer: fakeNLay, Start: x.Start, End: x.End, Addrs: x.Addrs})
		}
		return out
	}
	// dropped: how many standbys were dropped, by the mirror on the hop
	// before or by the origin (the head's).
	dropped := func() int {
		if covered > 0 {
			return int(primary[covered-1].svc.StandbyStats().Dropped)
		}
		obs.mu.Lock()
		defer obs.mu.Unlock()
		return obs.sbDropped
	}
	others := append([]*testHost{c}, hostsOf(all...)...)
	var once sync.Once
	victim.eng.mu.Lock()
	victim.eng.onStep = func(steps int) {
		if steps < 5 {
			return
		}
		once.Do(func() {
			for deadline := time.Now().Add(10 * time.Second); standby.svc.StandbyStats().Rows < 100 && time.Now().Before(deadline); {
				time.Sleep(time.Millisecond)
			}
			standby.kill(others...)
			for deadline := time.Now().Add(10 * time.Second); dropped() == 0 && time.Now().Before(deadline); {
				time.Sleep(time.Millisecond)
			}
			victim.kill(others...)
		})
	}
	victim.eng.mu.Unlock()
	prompt := make([]int32, 100)
	for i := range prompt {
		prompt[i] = int32(i%50 + 1)
	}
	req := GenerateRequest{Fingerprint: fakeFP, NLayer: fakeNLay, Prompt: prompt, MaxTokens: 30, Standby: true, Sampling: &meshp2pb.SamplingParams{Seed: 5}}
	res, err := o.Generate(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if want := reference(prompt, 30, 5); !equal(res.Tokens, want) {
		t.Fatalf("tokens %v\nwant   %v", res.Tokens, want)
	}
	if d := dropped(); d != 1 {
		t.Fatalf("%d standbys dropped, want 1 (the test kills it first)", d)
	}
	obs.mu.Lock()
	fed := obs.fed
	obs.mu.Unlock()
	if covered == 0 && fed < len(prompt) {
		t.Fatalf("the origin fed the head standby %d rows before dropping it, want the prompt's %d", fed, len(prompt))
	}
	if res.Reroutes != 1 || res.Takeovers != 0 || res.Route.Hops[covered].Peer != replica.host.ID() {
		t.Fatalf("reroutes %d, takeovers %d, hop %d now %s: want one re-route through the replica %s, no takeover by the dropped standby %s",
			res.Reroutes, res.Takeovers, covered, res.Route.Hops[covered].Peer, replica.host.ID(), standby.host.ID())
	}
	var live []*fakeHop
	for i, h := range primary {
		if i != covered {
			live = append(live, h)
		}
	}
	waitReleased(t, append(live, replica)...)
}

// Which hop's replica pickStandby names: the hop with the most layers
// that has one, the hops after the head first (a tie keeps them), the
// head with strictly more layers or the only one with a replica, and the
// head never on a route that is not batch-invariant (its standby's rows
// come in another batching than the head's).
func TestPickStandbyHead(t *testing.T) {
	ids := make([]peer.ID, 6)
	for i := range ids {
		ids[i] = peer.ID(fmt.Sprintf("peer-%d", i))
	}
	cpu, gpu := "cpu/amd64/llama.cpp", "cuda/H100/llama.cpp"
	routeOf := func(class string, ends ...int) *route.Route {
		rt := &route.Route{Fingerprint: fakeFP, NLayer: ends[len(ends)-1]}
		start := 0
		for i, e := range ends {
			rt.Hops = append(rt.Hops, route.Hop{Peer: ids[i], Start: start, End: e, KernelClass: class})
			start = e
		}
		return rt
	}
	replica := func(p int, rt *route.Route, hop int) route.Shard {
		h := rt.Hops[hop]
		return route.Shard{Peer: ids[p], Fingerprint: fakeFP, Start: h.Start, End: h.End, KernelClass: h.KernelClass}
	}
	for _, tc := range []struct {
		name     string
		rt       *route.Route
		replicas []int // hops with a replica
		want     int   // the covered hop (-1: none)
	}{
		{"only the head has one", routeOf(cpu, 2, 4, 6), []int{0}, 0},
		{"tie: the hop after the head", routeOf(cpu, 2, 4, 6), []int{0, 1}, 1},
		{"the head with more layers", routeOf(cpu, 3, 5, 6), []int{0, 1, 2}, 0},
		{"a later hop with more layers", routeOf(cpu, 1, 4, 6), []int{0, 1, 2}, 1},
		{"one-hop route", routeOf(cpu, 6), []int{0}, 0},
		{"not batch-invariant: no head standby", routeOf(gpu, 2, 4, 6), []int{0}, -1},
		{"not batch-invariant: a later hop", routeOf(gpu, 3, 5, 6), []int{0, 1}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var shards []route.Shard
			for k, hop := range tc.replicas {
				shards = append(shards, replica(len(tc.rt.Hops)+k, tc.rt, hop))
			}
			o := &Origin{Shards: func(string) []route.Shard { return shards }}
			got := o.pickStandby(tc.rt, GenerateRequest{Standby: true}, 10, nil, nil)
			switch {
			case tc.want < 0 && got != nil:
				t.Fatalf("picked a standby of hop %d, want none", got.idx)
			case tc.want >= 0 && (got == nil || got.idx != tc.want || got.covered != tc.rt.Hops[tc.want].Peer):
				t.Fatalf("picked %+v, want a standby of hop %d", got, tc.want)
			}
		})
	}
}
