package route

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/neuron-tai/meshp2p/p2p"
)

// A plan that fails only because the peers of some layers are full says
// so (ErrRouteFull, still ErrNoRoute); one missing layers does not; Covers
// tells the two apart with the table alone.
func TestRouteFull(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tb     *Table
		full   bool
		covers bool
		gap    [2]int // Gap's range when not covered
	}{
		{"middle full", table(offer("a", 0, 2, p2p.PathDirect, 1), offer("b", 2, 4, p2p.PathDirect, 0), offer("c", 4, 6, p2p.PathDirect, 1)), true, true, [2]int{}},
		{"middle missing", table(offer("a", 0, 2, p2p.PathDirect, 1), offer("c", 4, 6, p2p.PathDirect, 1)), false, false, [2]int{2, 4}},
		{"head missing", table(offer("c", 4, 6, p2p.PathDirect, 1)), false, false, [2]int{0, 4}},
		{"tail missing", table(offer("a", 0, 2, p2p.PathDirect, 1), offer("b", 2, 4, p2p.PathDirect, 1)), false, false, [2]int{4, 6}},
		{"one replica full, the other free", table(offer("a", 0, 6, p2p.PathDirect, 0), offer("b", 0, 6, p2p.PathDirect, 1)), false, true, [2]int{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := (&LocalPlanner{Table: tc.tb}).Plan(context.Background(), Request{Fingerprint: fp, NLayer: 6})
			if tc.full != errors.Is(err, ErrRouteFull) || (tc.full && !errors.Is(err, ErrNoRoute)) {
				t.Fatalf("err %v, want full %v", err, tc.full)
			}
			if got := tc.tb.Covers(fp, 6); got != tc.covers {
				t.Fatalf("Covers %v, want %v", got, tc.covers)
			}
			a, b, covered := tc.tb.Gap(fp, 6)
			if covered != tc.covers || (!covered && [2]int{a, b} != tc.gap) {
				t.Fatalf("Gap %d-%d covered %v, want %v covered %v", a, b, covered, tc.gap, tc.covers)
			}
		})
	}
}

// A Changed subscription ends with its context: a long-lived gateway
// resolving a model per request must not grow the table's subscriber list.
func TestChangedUnsubscribes(t *testing.T) {
	tb := table(offer("a", 0, 6, p2p.PathDirect, 1))
	for range 100 {
		ctx, cancel := context.WithCancel(context.Background())
		ch := tb.Changed(ctx)
		tb.Set("b", []Shard{offer("b", 0, 6, p2p.PathDirect, 1)})
		<-ch
		cancel()
	}
	// context.AfterFunc drops each in a goroutine of its own: wait for them.
	for deadline := time.Now().Add(5 * time.Second); tb.subscribers() != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d subscribers left after every context ended", tb.subscribers())
		}
	}
}
