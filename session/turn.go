package session

import "errors"

// errTurnAbandoned: the session ended while a writer waited for its turn
// on the down seam (the session has failed already; nobody reads it).
var errTurnAbandoned = errors.New("session: ended while waiting for a turn on the down seam")

// turn is one writer's place in the order of a seam's writes: the head of
// a session with transcripts orders its inputs (prefill from the origin,
// steps and windows from the ring) and its final statement under trMu,
// but writes them on the down seam only after releasing it, so that a
// next hop that stops reading blocks the writer and whoever is behind it
// on the seam, never trMu (docs/locks.md).
//
// Under trMu, the input (or the clean close) adds its writes to the turn
// in the order it makes them (add) and then takes its place (take). After
// trMu is released, write waits for the turn taken before it, runs the
// writes and ends the turn, letting the next one in. So frames and
// statements reach the next hop in the order they were digested and
// signed under trMu.
//
// Bound: a turn is written by the goroutine that filled it before that
// goroutine reads anything else, so there are never more turns pending
// than goroutines that take them (the head's two readers: readUpstream,
// and readRing or selfRing), each with the writes of one input frame (its
// activation and perhaps a statement) or of the clean close (the final
// statement and the SessionClose).
type turn struct {
	writes []func() error
	prev   <-chan struct{} // closed when the turn before has written (nil: none)
	mine   chan struct{}   // closed when this turn has written
}

// add queues the write w, or runs it at once on a nil turn (a hop whose
// down seam has one writer: not the head of a session with transcripts).
func (t *turn) add(w func() error) error {
	if t == nil {
		return w()
	}
	t.writes = append(t.writes, w)
	return nil
}

// take places t after the latest turn, *last (nil: none yet), and makes t
// the latest. The caller holds the lock that orders the turns (trMu).
// A turn with nothing to write takes no place.
func (t *turn) take(last *chan struct{}) {
	if len(t.writes) == 0 {
		return
	}
	t.prev, t.mine = *last, make(chan struct{})
	*last = t.mine
}

// write waits for the turn before t to have written, or for done (the
// session ended: errTurnAbandoned), runs t's writes in order up to the
// first error, and ends t. It runs without the lock take was called under.
func (t *turn) write(done <-chan struct{}) error {
	if t.mine == nil {
		return nil // nothing to write
	}
	defer close(t.mine)
	if t.prev != nil {
		select {
		case <-t.prev:
		case <-done:
			return errTurnAbandoned
		}
	}
	for _, w := range t.writes {
		if err := w(); err != nil {
			return err
		}
	}
	return nil
}

// ordered runs fill under trMu with a turn that collects the writes it
// makes on the down seam, and writes them after releasing trMu, in the
// order the turns were taken. fill's error wins over a write's; what fill
// queued before it failed is still written, as it was when the writes
// happened under the lock.
func (hs *hopSession) ordered(fill func(*turn) error) error {
	var t turn
	hs.trMu.Lock()
	err := fill(&t)
	t.take(&hs.lastTurn)
	hs.trMu.Unlock()
	if werr := t.write(hs.done); err == nil {
		err = werr
	}
	return err
}
