package specdecode

import (
	"encoding/binary"
	"hash/fnv"
	"testing"
	"time"
)

// route is a simulated route for the controller: a window of K proposals
// costs ring + one + K·(extra+hidden) of wall time (one, extra: the hops'
// compute of its first row and of each further row, summed), and proposal i of
// the session's j-th is right when a hash of (seed, j) is below alpha.
type route struct {
	ring, one, extra time.Duration
	// hidden is what each extra row adds outside the hops' compute
	// (the tail's sampling of every row, a CPU shared by the hops).
	hidden time.Duration
	// redo is what the one-row window after a rejection costs over a
	// plain step (it is a verification window: every hop drops the
	// rejected rows).
	redo  time.Duration
	alpha float64
	seed  uint64
	// After the first early proposals, late is the acceptance (0: alpha
	// throughout): a story's opening repeats itself more than what
	// follows it.
	early int
	late  float64
	// spikes: the share of windows with proposals whose extra rows cost 5
	// times extra (a window the scheduler stalled): the medians the
	// controller keeps then see the cheap rows, the session pays the mean.
	spikes float64
	// lengths > 0: each decision's match is 1 to lengths tokens long
	// (in turn), every length with the same acceptance, as the n-gram
	// proposer's are on sampled text; 0: always 3.
	lengths int
}

func (r route) right(j int) bool {
	alpha := r.alpha
	if r.late > 0 && j >= r.early {
		alpha = r.late
	}
	return r.draw(uint64(j)) < alpha
}

// draw is a uniform number in [0, 1) from (seed, i).
func (r route) draw(i uint64) float64 {
	h := fnv.New64a()
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:], r.seed)
	binary.LittleEndian.PutUint64(b[8:], i)
	h.Write(b[:])
	return float64(h.Sum64()>>11) / float64(1<<53)
}

// extraOf is what each extra row of the w-th window costs (wall, compute).
func (r route) extraOf(w int) (wall, compute time.Duration) {
	x := r.extra
	if r.spikes > 0 && r.draw(1<<40+uint64(w)) < r.spikes {
		x *= 5
	}
	return x + r.hidden, x
}

// drive runs a session of n tokens on r under the controller, as the
// head does (proposals it does not send are still checked against what
// commits), and returns the time plain decoding takes over the time it
// took, and the proposals it sent and had accepted.
func drive(a *Adaptive, r route, n int, before ...func()) (speedup float64, sent, accepted int) {
	var spent time.Duration
	j := 0       // proposals made so far (the hash's index)
	windows := 0 // windows sent
	rejected := false
	for done := 0; done < n; {
		for _, f := range before {
			f()
		}
		m := 3
		if r.lengths > 0 {
			m = 1 + done%r.lengths
		}
		k, _ := a.Choose(m)
		k = min(k, n-done-1)
		windows++
		wall, compute := r.extraOf(windows)
		step := r.ring + r.one + time.Duration(k)*wall
		if rejected && k == 0 { // the one-row window after a rejection
			step += r.redo
			spent += step
			a.ObserveRedo(step)
			j++
			done++
			rejected = false
			continue
		}
		spent += step
		acc := 0
		for acc < k && r.right(j+acc) {
			acc++
		}
		if k == 0 {
			// Not sent: the proposal is checked against the token that
			// commits.
			if r.right(j) {
				a.ObserveAcceptance(m, 1, 1)
			} else {
				a.ObserveAcceptance(m, 0, 1)
			}
			j++
		} else {
			a.ObserveAcceptance(m, acc, min(acc+1, k))
			j += min(acc+1, k)
			sent += k
			accepted += acc
			rejected = acc < k
		}
		a.ObserveWindow(k+1, step, r.one+time.Duration(k)*compute)
		done += acc + 1
	}
	plain := time.Duration(n) * (r.ring + r.one)
	return float64(plain) / float64(spent), sent, accepted
}

// TestAdaptiveNeverLoses (issue 42): on routes where an extra row costs
// about a full row (CPUs without llamafile's batched kernels) and the
// link costs next to nothing, speculation at the acceptance the issue
// measured (0.45–0.68 on stories, 0.03–0.29 on random weights) must not
// make the session slower than plain decoding (≥ 0.97×); where rows are
// cheap against the ring (h = 20 ms), the gains stay.
func TestAdaptiveNeverLoses(t *testing.T) {
	ms, us := time.Millisecond, time.Microsecond
	for _, tc := range []struct {
		name     string
		r        route
		n        int
		min, max float64 // the speed-up's bounds (max 0: none)
	}{
		// The 154M model at h = 0 on 3 hops: 5.3 ms per hop per row.
		{"154M h=0 α=0.68", route{ring: 1500 * us, one: 15900 * us, extra: 15 * ms, alpha: 0.68}, 300, 0.97, 0},
		{"154M h=0 α=0.45", route{ring: 1500 * us, one: 15900 * us, extra: 15 * ms, alpha: 0.45}, 300, 0.97, 0},
		{"154M h=0 α=0.29", route{ring: 1500 * us, one: 15900 * us, extra: 15 * ms, alpha: 0.29}, 300, 0.97, 0},
		{"154M h=0 α=0.03", route{ring: 1500 * us, one: 15900 * us, extra: 15 * ms, alpha: 0.03}, 300, 0.97, 0},
		{"154M h=0 α=0.68, 32 tokens", route{ring: 1500 * us, one: 15900 * us, extra: 15 * ms, alpha: 0.68}, 32, 0.97, 0},
		// stories260K at h = 0: the stack's own costs, and an extra row
		// costing about a row.
		{"260K h=0 α=0.55", route{ring: 400 * us, one: 600 * us, extra: 550 * us, alpha: 0.55}, 300, 0.97, 0},
		{"260K h=0 α=0.45", route{ring: 400 * us, one: 600 * us, extra: 550 * us, alpha: 0.45}, 300, 0.97, 0},
		// The same where the hops' compute shows little of what a row
		// costs: the rest is the wall clock's.
		{"260K h=0 α=0.68, rows dear outside the compute", route{ring: 400 * us, one: 600 * us, extra: 50 * us, hidden: 500 * us, alpha: 0.68}, 300, 0.97, 0},
		{"260K h=0 α=0.45, rows dear outside the compute", route{ring: 400 * us, one: 600 * us, extra: 50 * us, hidden: 500 * us, alpha: 0.45}, 300, 0.97, 0},
		// stories260K sampled at t = 0.8 at h = 0, as measured on a quiet
		// machine (issue 42: auto/off 0.96): a plain step 1.07 ms (0.85 ms
		// of it the hops' compute), a second row +250 µs, the one-row
		// window after a rejection +116 µs; acceptance 0.24-0.29.
		{"260K h=0 sampled α=0.27", route{ring: 220 * us, one: 850 * us, extra: 250 * us, redo: 116 * us, alpha: 0.27}, 300, 0.97, 0},
		{"260K h=0 sampled α=0.35", route{ring: 220 * us, one: 850 * us, extra: 250 * us, redo: 116 * us, alpha: 0.35}, 300, 0.97, 0},
		// The same with matches of 1-5 tokens, every length as good as
		// the others, and rows whose cost spikes (2026-12-06, a quiet
		// machine: auto/off 0.93-0.955; K = 1 went out at a predicted gain
		// of 1.10-1.17 where one length's few lucky proposals rated it
		// 0.5-0.66 against 0.31-0.37 overall; 30% were accepted; a plain
		// step 1.21 ms, a window of 2 rows 1.54-1.76 ms, the step after a
		// rejection 1.57 ms).
		// Counting on each length's own rate, the controller lost there
		// (0.962 and 0.964 at the worst of 3 seeds).
		{"260K h=0 sampled α=0.35, matches of 1-5, spikes", route{ring: 300 * us, one: 900 * us, extra: 250 * us, redo: 100 * us, spikes: 0.25, alpha: 0.35, lengths: 5}, 300, 0.97, 0},
		{"260K h=0 sampled α=0.35, matches of 1-3, spikes", route{ring: 300 * us, one: 900 * us, extra: 250 * us, redo: 300 * us, spikes: 0.25, alpha: 0.35, lengths: 3}, 300, 0.97, 0},
		// Rows cheap against a 20 ms link: the gains stay.
		{"260K h=20ms α=0.8", route{ring: 60 * ms, one: 3 * ms, extra: 200 * us, alpha: 0.8}, 128, 2.5, 0},
		{"260K h=20ms α=0.5", route{ring: 60 * ms, one: 3 * ms, extra: 200 * us, alpha: 0.5}, 300, 1.3, 0},
		// Cheap rows at h = 0 (batched kernels) and good proposals: on.
		{"h=0 cheap rows α=0.8", route{ring: 1 * ms, one: 3 * ms, extra: 100 * us, alpha: 0.8}, 300, 1.5, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, seed := range []uint64{1, 2, 3} {
				r := tc.r
				r.seed = seed
				a := &Adaptive{MaxK: 8, MaxW: 1}
				s, sent, acc := drive(a, r, tc.n)
				t.Logf("seed %d: %.3fx, %d of %d accepted", seed, s, acc, sent)
				if s < tc.min || (tc.max > 0 && s > tc.max) {
					t.Errorf("seed %d: %.3fx against plain (want ≥ %.2f), %d of %d proposals accepted", seed, s, tc.min, acc, sent)
				}
			}
		})
	}
}

// Quiet (the head's plain step before the proposer is asked) never says
// K = 0 where Choose would send a proposal for a match of some length:
// checked at every decision of simulated sessions, from a copy of the
// controller's state.
func TestQuietAgreesWithChoose(t *testing.T) {
	us, ms := time.Microsecond, time.Millisecond
	quiet := 0
	for _, r := range []route{
		{ring: 220 * us, one: 850 * us, extra: 250 * us, redo: 116 * us, alpha: 0.27},
		{ring: 220 * us, one: 850 * us, extra: 250 * us, redo: 116 * us, alpha: 0.5, early: 30, late: 0.1},
		{ring: 1500 * us, one: 15900 * us, extra: 15 * ms, alpha: 0.45},
		{ring: 60 * ms, one: 3 * ms, extra: 200 * us, alpha: 0.3},
	} {
		for seed := uint64(1); seed <= 5; seed++ {
			r.seed = seed
			a := &Adaptive{MaxK: 8, MaxW: 2}
			check := func() {
				c := *a
				if !c.Quiet() {
					return
				}
				quiet++
				for n := range MaxN + 1 {
					c2 := *a
					if k, _ := c2.Choose(n); k != 0 {
						t.Fatalf("%+v: Quiet, yet Choose(%d) sends %d proposals", r, n, k)
					}
				}
			}
			drive(a, r, 300, check)
		}
	}
	if quiet == 0 {
		t.Fatal("no decision was quiet")
	}
	t.Logf("%d quiet decisions agreed with Choose", quiet)
}
