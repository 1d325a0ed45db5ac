package route

import (
	"testing"
	"time"
)

// A dead peer's shards are listed as departed, apart from the live ones,
// until it advertises again or DepartedFor passes; MaxDeparted bounds
// them.
func TestDeparted(t *testing.T) {
	tb := NewTable()
	now := time.Now()
	a, b := pid(1), pid(2)
	tb.Set(a, []Shard{{Peer: a, Fingerprint: "fp", NLayer: 4, Start: 0, End: 2}})
	tb.Set(b, []Shard{{Peer: b, Fingerprint: "fp", NLayer: 4, Start: 2, End: 4}})

	tb.markDeparted(b, now)
	tb.Set(b, nil) // Follow drops the advert right after
	dep := tb.Departed()
	if len(dep) != 1 || dep[0].Peer != b || dep[0].Start != 2 || !dep[0].At.Equal(now) {
		t.Fatalf("Departed() = %+v, want b's 2-4", dep)
	}
	if got := tb.Shards("fp"); len(got) != 1 || got[0].Peer != a {
		t.Fatalf("Shards() = %+v: a departed shard must not be offered", got)
	}
	if tb.Covers("fp", 4) {
		t.Fatal("a departed shard counted toward coverage")
	}

	// It comes back: no longer departed.
	tb.Set(b, []Shard{{Peer: b, Fingerprint: "fp", NLayer: 4, Start: 2, End: 4}})
	if dep := tb.Departed(); len(dep) != 0 {
		t.Fatalf("Departed() = %+v after the peer advertised again", dep)
	}

	// Old departures are forgotten.
	tb.markDeparted(b, now.Add(-DepartedFor-time.Second))
	tb.Set(b, nil)
	if dep := tb.Departed(); len(dep) != 0 {
		t.Fatalf("Departed() = %+v, older than DepartedFor", dep)
	}

	// Bounded: the oldest goes first.
	for i := range MaxDeparted + 5 {
		p := pid(100 + i)
		tb.Set(p, []Shard{{Peer: p, Fingerprint: "fp", NLayer: 4, Start: 0, End: 4}})
		tb.markDeparted(p, now.Add(time.Duration(i)*time.Millisecond))
		tb.Set(p, nil)
	}
	dep = tb.Departed()
	if len(dep) != MaxDeparted {
		t.Fatalf("%d departed shards, want the bound %d", len(dep), MaxDeparted)
	}
	for _, d := range dep {
		if d.Peer == pid(100) {
			t.Fatal("the oldest departure was kept past the bound")
		}
	}
}
