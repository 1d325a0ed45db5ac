package session

import (
	"context"
	"slices"
	"testing"

	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// A hop killed mid-generation at each position: the origin re-routes to a
// spare, which computes the whole context; the hops that survive start
// where their previous epoch's prefill left their KV (the prompt's whole
// blocks), the hop before the spare re-sends what it sent in that epoch
// from its records, and the tokens are those of a run without the failure.
func TestFailoverRecomputesOneHop(t *testing.T) {
	for pos, name := range []string{"head", "middle", "tail"} {
		t.Run(name, func(t *testing.T) {
			primary, spare := threeHops(t), threeHops(t)
			var stages [][]*fakeHop
			caches := map[*fakeHop]*fakeCache{}
			for i := range primary {
				stages = append(stages, []*fakeHop{primary[i], spare[i]})
				caches[primary[i]], caches[spare[i]] = primary[i].withCache(), spare[i].withCache()
			}
			o, c := newOrigin(t, stagePlanner{stages}, append(primary, spare...)...)
			o.Chunk = 16
			o.Audit = &Auditor{Rate: 0.5, Draw: func() float64 { return 0.99 }} // transcripts and records, never an audit
			primary[pos].killAtStep(5, append([]*testHost{c}, hostsOf(append(primary, spare...)...)...)...)
			prompt := make([]int32, 100)
			for i := range prompt {
				prompt[i] = int32(i%50 + 1)
			}
			const maxTok = 30
			res, err := o.Generate(context.Background(), GenerateRequest{Fingerprint: fakeFP, NLayer: fakeNLay, Prompt: prompt, MaxTokens: maxTok,
				Sampling: &meshp2pb.SamplingParams{Seed: 5}})
			if err != nil {
				t.Fatal(err)
			}
			if want := reference(prompt, maxTok, 5); !equal(res.Tokens, want) {
				t.Fatalf("tokens %v\nwant   %v", res.Tokens, want)
			}
			if res.Reroutes != 1 {
				t.Fatalf("reroutes %d, want 1 (failures %v)", res.Reroutes, res.Failures)
			}
			// The prefill's 100 tokens left 3 whole blocks (96 positions)
			// on every hop; the new epoch's hops started there but the spare.
			want := []int{96, 96, 96}
			want[pos] = 0
			var got []int
			for i, h := range res.Route.Hops {
				hop := primary[i]
				if i == pos {
					hop = spare[i]
				}
				if h.Peer != hop.host.ID() {
					t.Fatalf("hop %d is %s after the re-route, want %s", i, h.Peer, hop.host.ID())
				}
				adopted, first, _ := caches[hop].snapshot()
				if len(first) == 0 {
					t.Fatalf("hop %d never computed", i)
				}
				if a := adopted[len(adopted)-1]; a != want[i] {
					t.Fatalf("hop %d adopted %d positions in the new epoch (all: %v), want %d", i, a, adopted, want[i])
				}
				got = append(got, first[len(first)-1])
			}
			if !slices.Equal(got, want) {
				t.Fatalf("the new epoch's hops computed from positions %v, want %v", got, want)
			}
			if res.CachedTokens != 0 || res.HopCached == nil {
				t.Fatalf("cached tokens %d (per hop %v): the spare holds none", res.CachedTokens, res.HopCached)
			}
			t.Logf("starts %v", got)
			var alive []*fakeHop
			for i, h := range primary {
				if i != pos {
					alive = append(alive, h)
				}
			}
			waitReleased(t, append(alive, spare...)...)
		})
	}
}

// A second failover recomputes one hop too: the head dies (its spare
// computes from 0, the others adopt 96 positions and forward only from
// there), then the tail dies. The middle's epoch-2 records start at 96,
// its epoch-1 records hold [0, 100): together they re-send the new tail
// every position, so only the tail's replacement computes from 0.
func TestSecondFailoverRecomputesOneHop(t *testing.T) {
	var stages [][]*fakeHop
	caches := map[*fakeHop]*fakeCache{}
	sets := [][]*fakeHop{threeHops(t), threeHops(t), threeHops(t)}
	var all []*fakeHop
	for i := range 3 {
		var st []*fakeHop
		for _, s := range sets {
			st = append(st, s[i])
			caches[s[i]] = s[i].withCache()
			all = append(all, s[i])
		}
		stages = append(stages, st)
	}
	o, c := newOrigin(t, stagePlanner{stages}, all...)
	o.Chunk = 16
	o.Audit = &Auditor{Rate: 0.5, Draw: func() float64 { return 0.99 }} // transcripts and records, never an audit
	hosts := append([]*testHost{c}, hostsOf(all...)...)
	head, tail2 := stages[0][0], stages[2][0]
	head.killAtStep(5, hosts...)
	tail2.killAtStep(15, hosts...)
	prompt := make([]int32, 100)
	for i := range prompt {
		prompt[i] = int32(i%50 + 1)
	}
	const maxTok = 30
	res, err := o.Generate(context.Background(), GenerateRequest{Fingerprint: fakeFP, NLayer: fakeNLay, Prompt: prompt, MaxTokens: maxTok,
		Sampling: &meshp2pb.SamplingParams{Seed: 5}})
	if err != nil {
		t.Fatal(err)
	}
	if want := reference(prompt, maxTok, 5); !equal(res.Tokens, want) {
		t.Fatalf("tokens %v\nwant   %v", res.Tokens, want)
	}
	if res.Reroutes != 2 {
		t.Fatalf("reroutes %d, want 2 (failures %v)", res.Reroutes, res.Failures)
	}
	want := []*fakeHop{stages[0][1], stages[1][0], stages[2][1]}
	var starts []int
	for i, h := range res.Route.Hops {
		if h.Peer != want[i].host.ID() {
			t.Fatalf("hop %d is %s after the re-routes, want %s", i, h.Peer, want[i].host.ID())
		}
		_, first, _ := caches[want[i]].snapshot()
		starts = append(starts, first[len(first)-1])
	}
	// The third epoch: the head and the middle hold everything the second
	// computed (whole blocks), the new tail nothing.
	if starts[2] != 0 || starts[0] == 0 || starts[1] == 0 {
		t.Fatalf("the third epoch's hops computed from positions %v, want [n n 0] with n > 0", starts)
	}
	t.Logf("starts %v", starts)
}
