package specdecode

import (
	"testing"
	"time"
)

func TestAdaptiveChoose(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		name    string
		always  bool
		observe func(a *Adaptive)
		n       int
		wantK   func(k int) bool
		wantW   func(w int) bool
	}{
		{"no measurement: look first", false, func(*Adaptive) {}, 0, func(k int) bool { return k == 0 }, func(w int) bool { return w == 1 }},
		{"no measurement, ngram mode: try", true, func(*Adaptive) {}, 0, func(k int) bool { return k > 0 }, func(w int) bool { return w == 1 }},
		{"a few good proposals seen, nothing timed: rows may cost a step, off", false, func(a *Adaptive) { a.ObserveAcceptance(2, 4, 5) }, 2,
			func(k int) bool { return k == 0 }, func(w int) bool { return w == 1 }},
		{"a few good proposals seen, a step mostly ring: try", false, func(a *Adaptive) {
			a.ObserveAcceptance(2, 4, 5)
			a.ObserveWindow(1, 60*ms, 3*ms)
		}, 2, func(k int) bool { return k > 0 && k <= 2 }, func(w int) bool { return w >= 1 }},
		{"a few good proposals seen, a step mostly compute: off", false, func(a *Adaptive) {
			a.ObserveAcceptance(2, 4, 5)
			a.ObserveWindow(1, 17*ms, 16*ms)
		}, 2, func(k int) bool { return k == 0 }, func(w int) bool { return w == 1 }},
		{"good proposals, rows dear on the wall clock though cheap in the compute: off", false, func(a *Adaptive) {
			a.ObserveAcceptance(2, 140, 200)
			for range 10 {
				a.ObserveWindow(1, 1*ms, 600*time.Microsecond)
				a.ObserveWindow(9, 5400*time.Microsecond, 1*ms)
			}
		}, 2, func(k int) bool { return k == 0 }, func(w int) bool { return w == 1 }},
		{"nothing accepted: off", false, func(a *Adaptive) { a.ObserveAcceptance(0, 0, 200) }, 0,
			func(k int) bool { return k == 0 }, func(w int) bool { return w == 1 }},
		{"nothing accepted, ngram mode: still one", true, func(a *Adaptive) { a.ObserveAcceptance(0, 0, 200) }, 0,
			func(k int) bool { return k == 1 }, func(w int) bool { return w == 1 }},
		{"all accepted, cheap rows, long ring: all in", false, func(a *Adaptive) {
			a.ObserveAcceptance(3, 300, 300)
			for range 10 {
				a.ObserveWindow(1, 60*ms, 3*ms)
				a.ObserveWindow(9, 61*ms, 4*ms)
			}
		}, 3, func(k int) bool { return k == 8 }, func(w int) bool { return w == 4 }},
		{"half accepted, rows as dear as the ring: off", false, func(a *Adaptive) {
			a.ObserveAcceptance(2, 100, 200)
			for range 10 {
				a.ObserveWindow(1, 20*ms, 10*ms)
				a.ObserveWindow(3, 60*ms, 50*ms)
			}
		}, 2, func(k int) bool { return k == 0 }, func(w int) bool { return w == 1 }},
		{"long matches good, short ones bad: per length", false, func(a *Adaptive) {
			a.ObserveAcceptance(4, 190, 200)
			a.ObserveAcceptance(1, 0, 400)
			for range 10 {
				a.ObserveWindow(1, 60*ms, 3*ms)
				a.ObserveWindow(5, 62*ms, 6*ms)
			}
		}, 1, func(k int) bool { return k == 0 }, func(w int) bool { return w == 1 }},
		{"long matches good: on", false, func(a *Adaptive) {
			a.ObserveAcceptance(4, 190, 200)
			a.ObserveAcceptance(1, 0, 400)
			for range 10 {
				a.ObserveWindow(1, 60*ms, 3*ms)
				a.ObserveWindow(5, 62*ms, 6*ms)
			}
		}, 4, func(k int) bool { return k >= 4 }, func(w int) bool { return w >= 1 }},
		{"one stalled window among cheap ones: still on", false, func(a *Adaptive) {
			a.ObserveAcceptance(3, 300, 300)
			for i := range 10 {
				a.ObserveWindow(1, 1*ms, 200*time.Microsecond)
				if i == 7 {
					a.ObserveWindow(5, 40*ms, 39*ms) // descheduled mid-compute
				} else {
					a.ObserveWindow(5, 1*ms, 300*time.Microsecond)
				}
			}
		}, 3, func(k int) bool { return k == 8 }, func(w int) bool { return w >= 1 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &Adaptive{MaxK: 8, MaxW: 4, Always: tc.always}
			tc.observe(a)
			k, w := a.Choose(tc.n)
			if !tc.wantK(k) || !tc.wantW(w) {
				t.Fatalf("Choose(%d) = K %d W %d (rate %.2f, gain(1) %.2f)", tc.n, k, w, a.Rate(tc.n), a.Gain(tc.n, 1))
			}
			if k > a.MaxK || w > a.MaxW || w < 1 || k < 0 {
				t.Fatalf("K %d W %d outside the bounds", k, w)
			}
			for k := 1; k <= a.MaxK; k++ {
				if g := a.Gain(tc.n, k); g > float64(k+1) || g < 0 {
					t.Fatalf("Gain(%d) = %v: more than the %d tokens a window can commit", k, g, k+1)
				}
			}
		})
	}
}

// TestAdaptiveProbesWhenOffForCost: a session switched off by its costs
// while its proposals are good sends one proposal now and then, no more
// often than every ProbeEvery windows and for at most ProbeShare of its
// time (its probes' rows, all rejected), and cheap rows measured by the
// probes switch it back on; a session off for bad proposals never probes.
func TestAdaptiveProbesWhenOffForCost(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		name    string
		row     time.Duration // what a probe's row costs
		atLeast int           // probes expected in 1000 windows
	}{
		{"rows dear: rare probes", 19 * ms, 1},
		{"rows a tenth of a step: every ProbeEvery", 200 * time.Microsecond, 1000/ProbeEvery - 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &Adaptive{MaxK: 8, MaxW: 4}
			a.ObserveAcceptance(3, 20, 100) // α 0.2: would pay only at free rows
			for range recentN {
				a.ObserveWindow(1, 2*ms, 1*ms)
				a.ObserveWindow(2, 2*ms+tc.row, 1*ms+tc.row)
			}
			var spent, probed time.Duration
			probes, last := 0, -ProbeEvery
			for i := range 1000 {
				k, _ := a.Choose(3)
				if k > 1 {
					t.Fatalf("window %d: K %d while rows cost %.2f steps", i, k, a.rowCost())
				}
				spent += 2 * ms
				if k == 1 {
					if i-last < ProbeEvery {
						t.Fatalf("probes at windows %d and %d", last, i)
					}
					probes, last = probes+1, i
					probed += tc.row
					a.ObserveWindow(2, 2*ms+tc.row, 1*ms+tc.row)
				} else {
					a.ObserveWindow(1, 2*ms, 1*ms)
				}
			}
			if probes < tc.atLeast || float64(probed) > ProbeShare*float64(spent)+float64(tc.row) {
				t.Fatalf("%d probes (want ≥ %d) costing %v in %v", probes, tc.atLeast, probed, spent)
			}
		})
	}

	a := &Adaptive{MaxK: 8, MaxW: 4}
	a.ObserveAcceptance(3, 300, 300)
	for range recentN {
		a.ObserveWindow(1, 2*ms, 1*ms)
		a.ObserveWindow(3, 40*ms, 39*ms) // rows dear: off
	}
	if k, _ := a.Choose(3); k != 0 {
		t.Fatalf("K %d while rows cost %.1f steps", k, a.rowCost())
	}
	for range recentN/2 + 1 {
		a.ObserveWindow(2, 2100*time.Microsecond, 1100*time.Microsecond) // cheap again
	}
	if k, _ := a.Choose(3); k < 2 {
		t.Fatalf("K %d after cheap probes (row cost %.2f)", k, a.rowCost())
	}

	bad := &Adaptive{MaxK: 8, MaxW: 4}
	bad.ObserveAcceptance(3, 0, 300)
	for i := range 4 * ProbeEvery {
		if k, _ := bad.Choose(3); k != 0 {
			t.Fatalf("window %d: K %d with nothing accepted", i, k)
		}
	}
}
