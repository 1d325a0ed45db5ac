package session

import (
	"context"
	"testing"

	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

func TestOwnTimingKeepsRouteOrder(t *testing.T) {
	a, b, c := &meshp2pb.HopTiming{ComputeUs: 1}, &meshp2pb.HopTiming{ComputeUs: 2}, &meshp2pb.HopTiming{ComputeUs: 3}
	for _, tc := range []struct {
		name string
		prev []*meshp2pb.HopTiming
		idx  int
		want []uint32
	}{
		{"head", nil, 0, []uint32{3}},
		{"second hop", []*meshp2pb.HopTiming{a}, 1, []uint32{1, 3}},
		{"third hop", []*meshp2pb.HopTiming{a, b}, 2, []uint32{1, 2, 3}},
		{"too many from upstream are cut", []*meshp2pb.HopTiming{a, b, a, b}, 1, []uint32{1, 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ownTiming(tc.prev, tc.idx, c)
			if len(got) != len(tc.want) {
				t.Fatalf("%d entries, want %d", len(got), len(tc.want))
			}
			for i, g := range got {
				if g.GetComputeUs() != tc.want[i] {
					t.Fatalf("entry %d: compute %d, want %d", i, g.GetComputeUs(), tc.want[i])
				}
			}
			if len(tc.prev) > 0 && &tc.prev[0] == &got[0] {
				t.Fatal("ownTiming wrote into the upstream slice")
			}
		})
	}
}

func TestTimingSumsMeanPerHop(t *testing.T) {
	s := timingSums{hops: make([][7]uint64, 2)}
	s.add([]*meshp2pb.HopTiming{{WaitUs: 10, ReadUs: 2, UpUs: 4}, {DecodeUs: 6, EncodeUs: 8, WriteUs: 1}})
	s.add([]*meshp2pb.HopTiming{{WaitUs: 20, ReadUs: 4, UpUs: 0}, {DecodeUs: 2, EncodeUs: 0, WriteUs: 3}})
	s.add([]*meshp2pb.HopTiming{{WaitUs: 1000}}) // wrong length: ignored
	stats := []HopStat{{MeanUs: 5}, {MeanUs: 7}}
	s.fill(stats)
	if stats[0].WaitUs != 15 || stats[0].ReadUs != 3 || stats[0].UpUs != 2 {
		t.Fatalf("hop 0: %+v", stats[0])
	}
	if stats[1].DecodeUs != 4 || stats[1].EncodeUs != 4 || stats[1].WriteUs != 2 {
		t.Fatalf("hop 1: %+v", stats[1])
	}
	if got := stats[1].BusyUs(); got != 4+4+2+7 {
		t.Fatalf("busy %v", got)
	}
}

// Every hop's timing reaches the origin through the route: the ring's
// token frames carry one entry per hop, so every hop waited for its input
// (the head for the ring, the others for their upstream).
func TestHopTimingReachesOrigin(t *testing.T) {
	hops := threeHops(t)
	o, _ := newOrigin(t, stagePlanner{[][]*fakeHop{{hops[0]}, {hops[1]}, {hops[2]}}}, hops...)
	res, err := o.Generate(context.Background(), GenerateRequest{Fingerprint: fakeFP, NLayer: fakeNLay, Prompt: []int32{5, 6, 7}, MaxTokens: 12})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.HopStats) != 3 {
		t.Fatalf("%d hop stats", len(res.HopStats))
	}
	for i, h := range res.HopStats {
		if h.StepsTimed != 11 {
			t.Fatalf("hop %d timed %d steps, want 11", i, h.StepsTimed)
		}
		if h.WaitUs <= 0 {
			t.Fatalf("hop %d: no wait for input recorded: %+v", i, h)
		}
		if h.BusyUs() < h.MeanUs {
			t.Fatalf("hop %d: busy %v < compute %v", i, h.BusyUs(), h.MeanUs)
		}
	}
	waitReleased(t, hops...)
}
