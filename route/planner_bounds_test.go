package route

import (
	"context"
	"errors"
	"math"
	"runtime"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/p2p"
)

// Both planners refuse a layer count no model has before sizing their
// search by it (CostPlanner used to allocate per requested layer: 2^22
// layers took ~260 MiB of a tracker, 2^32-1 asked for ~260 GiB).
func TestPlannersRefuseLayerCount(t *testing.T) {
	planners := map[string]Planner{"local": &LocalPlanner{Table: NewTable()}, "cost": &CostPlanner{Table: NewTable()}}
	for _, tc := range []struct {
		n    int
		want error
	}{
		{0, ErrUnknownModel},
		{513, ErrLayerCount},
		{1 << 22, ErrLayerCount},
		{math.MaxUint32, ErrLayerCount},
		{math.MaxInt, ErrLayerCount},
	} {
		for name, p := range planners {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, err := p.Plan(context.Background(), Request{Fingerprint: "ff", NLayer: tc.n, Epoch: 1})
			runtime.ReadMemStats(&after)
			if !errors.Is(err, tc.want) {
				t.Errorf("%s, %d layers: %v, want %v", name, tc.n, err, tc.want)
			}
			if n := after.TotalAlloc - before.TotalAlloc; n > 1<<20 {
				t.Errorf("%s, %d layers: refusing allocated %d KiB", name, tc.n, n>>10)
			}
		}
	}
}

// One client's tickets count at most MaxPendingPerClient per hop: a client
// that keeps asking cannot make the only replica look full to another
// (anonymous requests, Client "", stay uncapped).
func TestCostPlannerPendingPerClient(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		name      string
		flooder   peer.ID
		honestOK  bool
		floodGets int // routes out of 8
	}{
		{"named client capped", "flooder", true, 8},
		{"anonymous uncapped", "", false, 4},
	} {
		p := &CostPlanner{Table: table(offer("a", 0, 6, p2p.PathDirect, 4)), Now: func() time.Time { return now }}
		got := 0
		for range 8 {
			if _, err := p.Plan(context.Background(), Request{Fingerprint: fp, NLayer: 6, Epoch: 1, Client: tc.flooder}); err == nil {
				got++
			}
		}
		_, err := p.Plan(context.Background(), Request{Fingerprint: fp, NLayer: 6, Epoch: 1, Client: "honest"})
		if got != tc.floodGets || (err == nil) != tc.honestOK {
			t.Errorf("%s: flooder got %d routes (want %d); honest client: %v (want ok %v)", tc.name, got, tc.floodGets, err, tc.honestOK)
		}
	}
}
