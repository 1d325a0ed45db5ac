package specdecode

import (
	"math"
	"slices"
	"time"
)

// Adaptive chooses how many proposals a verification window carries (K)
// and how many windows may be in flight (W) from what the session
// measures: the acceptance rate of the proposer (also of proposals it made
// but did not send, so a switched-off session keeps learning), the time a
// one-row window takes around the ring, and what each extra row adds to
// it (the hops' compute). A window of K proposals commits on average
// E(K) = (1-α^(K+1))/(1-α) tokens for the price of 1 + m·K one-row
// windows (m: an extra row's cost relative to a one-row window); K is the
// one that maximises E(K)/(1+m·K), and 0 (one row, no proposal: plain
// decoding) when no K beats plain by Margin. A further window in flight
// pays when the ones ahead of it are likely all accepted (α^(K·j) ≥ ½)
// and the ring time covers its compute. Not safe for concurrent use.
type Adaptive struct {
	MaxK, MaxW int
	// Always keeps K ≥ 1 (the "ngram" mode): proposals are sent whenever
	// there are some, paying or not.
	Always bool

	acc, tot float64 // decayed counts: proposals accepted / verified
	// byN are the same per match length of the proposer (NGram's n):
	// a long match is a better guess than a short one.
	byN [MaxN + 1]struct{ acc, tot float64 }
	// Costs, each the median of its last few measurements: one window
	// stalled by the scheduler must not switch a session off for good
	// (while it is off no multi-row window re-measures the row cost).
	t1  recent // seconds: a one-row window around the ring
	row recent // seconds: what one more row adds (summed over hops)
	c1  recent // seconds: a one-row window's compute, summed over hops
	// offForCost counts proposals held back by the costs alone (their
	// acceptance would pay at free rows): every ProbeEvery-th goes out
	// as a one-proposal window, so the row cost is measured again.
	offForCost int
}

// ProbeEvery is how often a session switched off by the measured costs
// (not by its acceptance rate) sends one proposal anyway, to measure the
// costs again.
const ProbeEvery = 16

// recentN measurements make a cost's median.
const recentN = 5

// recent keeps the last recentN measurements of a cost.
type recent struct {
	v [recentN]float64
	n int // measurements so far
}

func (r *recent) add(x float64) {
	r.v[r.n%recentN] = x
	r.n++
}

// get is the median of the kept measurements (0 before any).
func (r *recent) get() float64 {
	k := min(r.n, recentN)
	if k == 0 {
		return 0
	}
	s := r.v
	sorted := s[:k]
	slices.Sort(sorted)
	if k%2 == 1 {
		return sorted[k/2]
	}
	return (sorted[k/2-1] + sorted[k/2]) / 2
}

// Margin is the least predicted gain over plain decoding that turns
// proposals on (the model's error and the proposer's own cost).
const Margin = 1.05

// MinEvidence is how many proposals must have been checked (sent, or
// only compared with what was committed) before proposals are sent: a
// session starts off and looks first, so text nothing repeats in costs
// nothing.
const MinEvidence = 4

// decay weighs recent windows over old ones (about the last 1/(1-decay)
// proposals).
const decay = 0.97

// ObserveAcceptance adds verified proposals of a match of n tokens (0:
// unknown): accepted of verified (the first rejected one counts; the
// ones after it were never verified).
func (a *Adaptive) ObserveAcceptance(n, accepted, verified int) {
	if verified <= 0 {
		return
	}
	f := math.Pow(decay, float64(verified))
	a.acc = a.acc*f + float64(accepted)
	a.tot = a.tot*f + float64(verified)
	if n > 0 && n <= MaxN {
		b := &a.byN[n]
		b.acc = b.acc*f + float64(accepted)
		b.tot = b.tot*f + float64(verified)
	}
}

// Rate is the running acceptance rate of proposals from matches of n
// tokens (0: all): its own counts, pulled towards the overall rate while
// they are few (½ before any observation).
func (a *Adaptive) Rate(n int) float64 {
	all := (a.acc + 1) / (a.tot + 2)
	if n <= 0 || n > MaxN {
		return all
	}
	b := a.byN[n]
	return (b.acc + 2*all) / (b.tot + 2)
}

// ObserveWindow adds one answered window of rows rows: round is the time
// from sending it to its result, compute the hops' compute for it.
func (a *Adaptive) ObserveWindow(rows int, round, compute time.Duration) {
	if rows < 1 || round <= 0 {
		return
	}
	c := compute.Seconds()
	if rows == 1 {
		a.c1.add(c)
	} else if a.c1.n > 0 {
		a.row.add(max(0, (c-a.c1.get())/float64(rows-1)))
	}
	if one := round.Seconds() - float64(rows-1)*a.row.get(); one > 0 {
		a.t1.add(one)
	}
}

// Gain is the predicted speed of K proposals per window against plain
// decoding, at the running acceptance rate of matches of n tokens and the
// measured costs.
func (a *Adaptive) Gain(n, k int) float64 {
	if k <= 0 {
		return 1
	}
	alpha := a.Rate(n)
	e := float64(k + 1)
	if alpha < 1 {
		e = (1 - math.Pow(alpha, float64(k+1))) / (1 - alpha)
	}
	return e / (1 + a.rowCost()*float64(k))
}

// freeRowGain is Gain's best over K if extra rows cost nothing: what the
// acceptance rate alone would give.
func (a *Adaptive) freeRowGain(n int) float64 {
	alpha := a.Rate(n)
	if alpha >= 1 {
		return float64(a.MaxK + 1)
	}
	return (1 - math.Pow(alpha, float64(a.MaxK+1))) / (1 - alpha)
}

// rowCost is an extra row's cost relative to a one-row window.
func (a *Adaptive) rowCost() float64 {
	if t1 := a.t1.get(); t1 > 0 && a.c1.n > 0 && a.row.n > 0 {
		return a.row.get() / t1
	}
	return 0.05 // before any measurement: rows are cheap next to the ring
}

// Choose returns K (0: plain) and W (≥ 1) for proposals from a match of
// n tokens (0: unknown).
func (a *Adaptive) Choose(n int) (k, w int) {
	if !a.Always && a.tot < MinEvidence {
		return 0, 1
	}
	best, bestK := 1.0, 0
	for k := 1; k <= a.MaxK; k++ {
		if g := a.Gain(n, k); g > best {
			best, bestK = g, k
		}
	}
	if best < Margin && !a.Always {
		// Held back by the costs alone? Probe now and then.
		if a.MaxK > 0 && a.freeRowGain(n) >= Margin {
			if a.offForCost++; a.offForCost%ProbeEvery == 0 {
				return 1, 1
			}
		}
		return 0, 1
	}
	a.offForCost = 0
	if bestK == 0 {
		bestK = min(1, a.MaxK)
	}
	w = 1
	alpha := a.Rate(n)
	window := a.c1.get() + float64(bestK)*a.row.get()
	for w < a.MaxW && math.Pow(alpha, float64(bestK*w)) >= 0.5 && a.t1.get() > float64(w+1)*window {
		w++
	}
	return bestK, w
}
