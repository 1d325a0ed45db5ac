package specdecode

import (
	"math"
	"slices"
	"time"
)

// Adaptive chooses how many proposals a verification window carries (K)
// and how many windows may be in flight (W) from what the session
// measures: the acceptance rate of the proposer (also of proposals it made
// but did not send, so a switched-off session keeps learning), the wall
// time a one-row window takes around the route (a plain step: S1), and
// the wall time each extra row adds to a window (ρ), both from windows
// alone in flight. A window of K proposals commits on average
// E(K) = (1-α^(K+1))/(1-α) tokens in S1 + K·ρ, against one token per S1
// for plain decoding; K is the one that maximises E(K)·S1/(S1 + K·ρ), and
// 0 (one row, no proposal: plain decoding) when no K beats plain by
// Margin. ρ is measured, never assumed cheap: until a window of several
// rows has been timed, an extra row is taken to cost what the first row's
// compute costs (the CPU without batched kernels), and K grows at most
// to twice the largest window timed so far. A further window in flight
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
	s1   recent // seconds: a one-row window around the route (wall)
	rho  recent // seconds: what one more row adds to a window (wall)
	c1   recent // seconds: a one-row window's compute, summed over hops
	rowC recent // seconds: what one more row adds to the hops' compute
	redo recent // seconds: the one-row window after a rejection (wall)
	// kSeen is the most proposals of a window whose costs were measured.
	kSeen int
	// pre is the hops' compute of the prefill's last chunk of preRows
	// rows (seconds): a batch's cost on this route, the first estimate of
	// a row's.
	pre     float64
	preRows int
	// probeCredit is the time (seconds) probing may still spend: each
	// plain window adds ProbeShare of its time, a probe takes what its
	// extra row costs. While the costs alone hold proposals
	// back (their acceptance would pay at free rows) a probe, one
	// proposal, goes out when the credit covers it and ProbeEvery windows
	// have passed since the last, so the row cost is measured again at a
	// bounded price (≤ ProbeShare of the session's time).
	probeCredit float64
	sinceProbe  int
}

// ProbeEvery is the fewest windows between two probes of a session
// switched off by the measured costs (not by its acceptance rate).
const ProbeEvery = 16

// ProbeShare bounds what probing costs a session switched off by its
// costs: the extra time of its probes (their rows, as if all rejected)
// over the time of its plain windows.
const ProbeShare = 0.01

// recentN measurements make a cost's median; from robustN on, one
// outlier does not move it.
const recentN, robustN = 5, 3

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
const Margin = 1.1

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

// sureRate is the acceptance rate a decision to send proposals from a
// match of n tokens relies on: Rate less its standard error. A
// session sends proposals when a rate looks good, and the match lengths
// it sends for are the ones a few lucky proposals pushed up: on
// stories260K sampled at t = 0.8 (h = 0, a quiet machine) windows went
// out at K = 1 where one length rated 0.5-0.66 on 4-6 proposals against
// 0.31-0.37 overall, 30% were accepted, and auto ran at 0.93-0.955 of
// plain. A rate that many proposals back keeps nearly all of its value.
// The price: windows that would pay a little at a middling rate go out
// less (simulated at a 1.07 ms stories260K step, α = 0.5: 1.14× →
// 1.08×; α = 0.4: 1.03-1.10× → 1.00×); where rows are cheap against the
// ring (h = 20 ms) the gains stay.
func (a *Adaptive) sureRate(n int) float64 {
	r, seen := a.Rate(n), a.tot+2
	if n > 0 && n <= MaxN {
		seen = a.byN[n].tot + 2
	}
	return max(0, r-math.Sqrt(r*(1-r)/seen))
}

// ObserveWindow adds one answered window of rows rows that was alone in
// flight (none ahead of it or behind it): round is the wall time from
// sending it to its result, compute the hops' compute for it.
func (a *Adaptive) ObserveWindow(rows int, round, compute time.Duration) {
	if rows < 1 || round <= 0 {
		return
	}
	a.ObserveCompute(rows, compute)
	r := round.Seconds()
	if rows == 1 {
		a.s1.add(r)
		a.probeCredit += ProbeShare * r
		return
	}
	if a.s1.n > 0 {
		a.rho.add(max(0, (r-a.s1.get())/float64(rows-1)))
	}
}

// ObserveRedo adds the round time of a one-row window alone in flight
// sent after a rejection: every hop drops the rejected rows, so it costs
// more than a plain step, and a rejection costs that much more.
// Until a plain step was timed it is the best there is of one (S1).
func (a *Adaptive) ObserveRedo(round time.Duration) {
	if round <= 0 {
		return
	}
	a.redo.add(round.Seconds())
	if a.s1.n == 0 {
		a.s1.add(round.Seconds())
	}
}

// ObservePrefill takes the hops' compute of the prefill's last chunk of
// rows rows (summed over hops): until a window of several rows has been
// timed, it says what an extra row costs on this route (these kernels,
// these hops).
func (a *Adaptive) ObservePrefill(rows int, compute time.Duration) {
	if rows >= 2 && compute > 0 {
		a.pre, a.preRows = compute.Seconds(), rows
	}
}

// ObserveCompute adds the hops' compute of a window of rows rows (every
// window: also those in flight with others, whose round times overlap).
func (a *Adaptive) ObserveCompute(rows int, compute time.Duration) {
	if rows < 1 || compute <= 0 {
		return
	}
	c := compute.Seconds()
	if rows == 1 {
		a.c1.add(c)
	} else if a.c1.n > 0 {
		a.rowC.add(max(0, (c-a.c1.get())/float64(rows-1)))
		a.kSeen = max(a.kSeen, rows-1)
	}
}

// Gain is the predicted speed of K proposals per window against plain
// decoding, at the acceptance rate of matches of n tokens it relies on
// (sureRate) and the measured costs: K extra rows, and where a proposal is rejected
// (1 - α^K), what the one-row window that follows it costs over a plain
// step (every hop drops the rejected rows: 116 µs on a 1.07 ms
// stories260K step here, 11%; before, that window was timed as a plain
// step, so it made S1 look dearer and rows cheaper against it).
func (a *Adaptive) Gain(n, k int) float64 {
	if k <= 0 {
		return 1
	}
	return gainAt(a.sureRate(n), k, a.rowCost(), a.redoCost())
}

// gainAt is Gain at acceptance rate alpha, an extra row's relative cost
// rows and a rejection's relative cost redo.
func gainAt(alpha float64, k int, rows, redo float64) float64 {
	e := float64(k + 1)
	if alpha < 1 {
		e = (1 - math.Pow(alpha, float64(k+1))) / (1 - alpha)
	}
	return e / (1 + rows*float64(k) + (1-math.Pow(alpha, float64(k)))*redo)
}

// redoCost is what the one-row window after a rejection costs over a plain
// step, relative to a plain step (0 before one was timed).
func (a *Adaptive) redoCost() float64 {
	s1 := a.s1.get()
	if a.redo.n == 0 || s1 <= 0 {
		return 0
	}
	return max(0, a.redo.get()-s1) / s1
}

// freeRowGain is Gain's best over K if extra rows cost nothing: what the
// acceptance rate alone would give.
func (a *Adaptive) freeRowGain(n int) float64 { return a.freeGainAt(a.Rate(n)) }

// freeGainAt is freeRowGain at acceptance rate alpha.
func (a *Adaptive) freeGainAt(alpha float64) float64 {
	if alpha >= 1 {
		return float64(a.MaxK + 1)
	}
	return (1 - math.Pow(alpha, float64(a.MaxK+1))) / (1 - alpha)
}

// rowWall is what an extra row adds to a window's wall time (seconds):
// measured on windows alone in flight; or, where windows go in flight
// together (the ring covers their compute), what a row adds to the hops'
// compute; or, before a window of several rows was answered, what a row
// of the prefill's batch cost over a one-row window's compute; or,
// without a batch, what the first row's compute costs (kernels that do
// not batch).
func (a *Adaptive) rowWall() float64 {
	switch {
	case a.rho.n > 0:
		return a.rho.get()
	case a.rowC.n > 0:
		return a.rowC.get()
	case a.c1.n > 0 && a.preRows >= 2:
		return max(0, (a.pre-a.c1.get())/float64(a.preRows-1))
	case a.c1.n > 0:
		return a.c1.get()
	}
	return a.s1.get() // nothing known: as dear as a plain step
}

// rowCost is an extra row's cost relative to a plain step (one-row
// window), ρ/S1; 1 before any window was timed.
func (a *Adaptive) rowCost() float64 {
	if s1 := a.s1.get(); s1 > 0 {
		return a.rowWall() / s1
	}
	return 1
}

// maxK is the most proposals a window may carry now: twice the most of a
// window measured (at least 2), so the row cost is measured before it is
// relied on far from where it was measured; MaxK in the "ngram" mode
// (Always), which sends proposals paying or not.
func (a *Adaptive) maxK() int {
	if a.Always {
		return a.MaxK
	}
	return min(a.MaxK, max(2, 2*a.kSeen))
}

// Quiet reports whether Choose would return K = 0 for a match of any
// length now, counting the decision as Choose does (probes), so that the
// head can send a plain step before it asks the proposer anything (the
// proposer's bookkeeping then runs while the step is on the route, not
// between the tail's token and the next step). It is false where a probe
// may be due or the "ngram" mode sends whatever it has: Choose decides
// those.
func (a *Adaptive) Quiet() bool {
	switch {
	case a.Always:
		return false
	case a.tot < MinEvidence:
		return true
	}
	best, bestRate := 0.0, 0.0 // the best acceptance rate of any match length: sure (Gain's), and Rate (probe's)
	for n := range MaxN + 1 {
		best, bestRate = max(best, a.sureRate(n)), max(bestRate, a.Rate(n))
	}
	if a.MaxK > 0 && a.sinceProbe+1 >= ProbeEvery && a.freeGainAt(bestRate) >= Margin {
		return false // a probe may be due
	}
	rows, redo := a.rowCost(), a.redoCost()
	for k := 1; k <= a.maxK(); k++ {
		if gainAt(best, k, rows, redo) >= Margin {
			return false
		}
	}
	a.sinceProbe++ // as probe counts a window held back by its costs
	return true
}

// Choose returns K (0: plain) and W (≥ 1) for proposals from a match of
// n tokens (0: unknown).
func (a *Adaptive) Choose(n int) (k, w int) {
	if !a.Always && a.tot < MinEvidence {
		return 0, 1
	}
	best, bestK := 1.0, 0
	for k := 1; k <= a.maxK(); k++ {
		if g := a.Gain(n, k); g > best {
			best, bestK = g, k
		}
	}
	if best < Margin && !a.Always {
		if a.probe(n) {
			return 1, 1
		}
		return 0, 1
	}
	if bestK == 0 {
		bestK = min(1, a.MaxK)
	}
	return bestK, a.inFlight(n, bestK)
}

// probe reports whether a session held back by the costs alone (its
// acceptance would pay at free rows) sends one proposal now, to measure
// the row cost again: at most one in ProbeEvery windows, and only while
// the probes' expected cost stays within ProbeShare of the time.
func (a *Adaptive) probe(n int) bool {
	a.sinceProbe++
	if a.MaxK == 0 || a.freeRowGain(n) < Margin || a.sinceProbe < ProbeEvery {
		return false
	}
	// What a probe costs when its proposal is rejected: its row. Fewer
	// than robustN timings of rows (one may be a window the scheduler
	// stalled) do not hold probes back: the estimate before them had
	// said rows were cheap, or none would have been sent.
	cost := a.rowWall()
	if (a.rho.n == 0 || a.rho.n >= robustN) && a.probeCredit < cost {
		return false
	}
	a.probeCredit = max(0, a.probeCredit-cost)
	a.sinceProbe = 0
	return true
}

// inFlight is W for windows of k proposals from a match of n tokens:
// another window goes in flight while the ones ahead of it are likely all
// accepted and the ring time (a one-row window's round, less its compute)
// covers its compute.
func (a *Adaptive) inFlight(n, k int) int {
	w := 1
	alpha := a.Rate(n)
	rowC := a.c1.get()
	if a.rowC.n > 0 {
		rowC = a.rowC.get()
	}
	window := a.c1.get() + float64(k)*rowC
	for w < a.MaxW && math.Pow(alpha, float64(k*w)) >= 0.5 && a.s1.get() > float64(w+1)*window {
		w++
	}
	return w
}
