package peerlimit

import (
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"golang.org/x/time/rate"
)

// One peer's bucket over time: a full burst at first, refused requests take
// nothing and say when the next token comes, refill up to the burst only.
func TestLimiterBucket(t *testing.T) {
	type step struct {
		at   time.Duration // since the start
		ok   bool
		wait time.Duration // when refused
	}
	tests := []struct {
		name  string
		limit rate.Limit
		burst int
		steps []step
	}{
		{"burst then refused", rate.Every(2 * time.Second), 3, []step{
			{0, true, 0}, {0, true, 0}, {0, true, 0}, {0, false, 2 * time.Second},
			{time.Second, false, time.Second}, // refusals took nothing
			{2 * time.Second, true, 0}, {2 * time.Second, false, 2 * time.Second},
		}},
		{"refill caps at the burst", 2, 2, []step{
			{0, true, 0}, {0, true, 0}, {0, false, 500 * time.Millisecond},
			{time.Hour, true, 0}, {time.Hour, true, 0}, {time.Hour, false, 500 * time.Millisecond},
			{time.Hour + 250*time.Millisecond, false, 250 * time.Millisecond},
			{time.Hour + 500*time.Millisecond, true, 0},
		}},
		{"a time before the last is no refill", 1, 1, []step{
			{10 * time.Second, true, 0}, {5 * time.Second, false, time.Second}, {11 * time.Second, true, 0},
		}},
		{"no limit", rate.Inf, 0, []step{{0, true, 0}, {0, true, 0}, {0, true, 0}}},
		{"zero rate: the burst, then never", 0, 1, []step{
			{0, true, 0}, {time.Hour, false, rate.InfDuration},
		}},
		{"zero burst: never", 10, 0, []step{{0, false, rate.InfDuration}, {time.Hour, false, rate.InfDuration}}},
	}
	start := time.Unix(1_700_000_000, 0)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := NewLimiter(tt.limit, tt.burst, 4)
			for i, s := range tt.steps {
				ok, wait := l.Take("p", start.Add(s.at))
				if ok != s.ok || wait != s.wait {
					t.Fatalf("step %d at %v: %v, wait %v; want %v, wait %v", i, s.at, ok, wait, s.ok, s.wait)
				}
			}
		})
	}
}

// Peers have their own buckets; past the bound the least recently seen
// peer is forgotten and comes back with a full bucket.
func TestLimiterPeers(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	const bound = 100
	l := NewLimiter(rate.Every(time.Minute), 1, bound)
	for i := range 10 * bound {
		if !l.Allow(id(i), now) {
			t.Fatalf("peer %d refused its first request", i)
		}
		if l.Len() > bound {
			t.Fatalf("%d peers tracked, bound %d", l.Len(), bound)
		}
	}
	if l.Len() != bound {
		t.Fatalf("%d peers tracked, want %d", l.Len(), bound)
	}
	last := id(10*bound - 1)
	if l.Allow(last, now) {
		t.Fatal("a drained, tracked peer was allowed")
	}
	// Seeing the oldest tracked peer again keeps it; the next new peer
	// evicts the one after it.
	oldest, next := id(9*bound), id(9*bound+1)
	if l.Allow(oldest, now) {
		t.Fatal("the oldest tracked peer was forgotten early")
	}
	l.Allow("newcomer", now)
	if l.Allow(oldest, now) {
		t.Fatal("the recently seen peer was evicted")
	}
	if !l.Allow(next, now) {
		t.Fatal("the least recently seen peer was kept")
	}
	if !l.Allow(id(0), now) {
		t.Fatal("a forgotten peer did not come back with a full bucket")
	}
}

func TestLimiterConcurrent(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	l := NewLimiter(1, 50, 8)
	done := make(chan int)
	for range 4 {
		go func() {
			n := 0
			for range 100 {
				if l.Allow(peer.ID("p"), now) {
					n++
				}
			}
			done <- n
		}()
	}
	total := 0
	for range 4 {
		total += <-done
	}
	if total != 50 {
		t.Fatalf("%d requests allowed at one instant, want the burst of 50", total)
	}
}
