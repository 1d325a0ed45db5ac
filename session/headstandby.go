package session

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// The head's standby (docs/architecture.md, "Hot standby"). The head's
// upstream is the origin, which knows every input the head computes: the
// prompt it sends and every committed token it gets back (the head feeds
// each token but the last one back into the route). So the origin itself
// is the head standby's mirror (headFeed): it opens a session stream to
// the standby with the epoch's signed open (hop index 0), sends it the
// prefill input from where the standby's own cache ends, then the
// committed tokens as they arrive (batched when they queue up: on a
// batch-invariant route KV computed in any batching is bitwise the same,
// so rejected speculative rows never reach it), the SessionProgress
// messages and the clean close it sends the head. A bounded queue it never
// waits on: a standby that lags is dropped with one log line. When the
// epoch ends (the head failed, or the generation ended) the origin sends
// what is queued and closes the stream: the standby ends and keeps its
// blocks, and takes the head's place like any standby (takeOver).

// headFeed is the origin's feed of one epoch's head standby.
type headFeed struct {
	o     *Origin
	peer  peer.ID
	open  *meshp2pb.SessionOpen
	input []int32
	chunk int
	q     chan *meshp2pb.StreamMessage
	// held is a message taken from q while batching tokens, sent next.
	held *meshp2pb.StreamMessage
	standbyLink
	end     chan struct{} // closed by finish: the epoch ended
	done    chan struct{} // closed when the feed's goroutine returned
	endOnce sync.Once
}

// startHeadFeed starts feeding the epoch's head standby sb (nil, or a
// standby of another hop: no feed) what the head gets: open (signed),
// then the prefill input in chunks of chunk rows.
func (o *Origin) startHeadFeed(sb *meshp2pb.Standby, open *meshp2pb.SessionOpen, input []int32, chunk int) *headFeed {
	if sb == nil || sb.GetHopIndex() != 0 {
		return nil
	}
	f := &headFeed{o: o, peer: peer.ID(sb.GetHop().GetPeerId()), open: open, input: input, chunk: chunk,
		q: make(chan *meshp2pb.StreamMessage, StandbyQueueFrames), standbyLink: newStandbyLink(), end: make(chan struct{}), done: make(chan struct{})}
	go f.run()
	return f
}

// drop ends the feed (once), saying why.
func (f *headFeed) drop(why string, err error) {
	f.markDropped(func() {
		f.o.observer().StandbyDropped()
		f.o.logger().Warn("standby dropped: the session goes on without it", "standby", f.peer, "covers", "head", "why", why, "err", err)
	})
}

// lost reports whether the standby was dropped (it must not take over).
func (f *headFeed) lost() bool { return f != nil && f.dropped.Load() }

// token queues a committed token the head feeds back into the route at
// pos (never blocks).
func (f *headFeed) token(tok int32, pos uint32) {
	if f == nil {
		return
	}
	f.push(&meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Activation{Activation: &meshp2pb.ActivationHeader{
		SessionId: f.open.GetSessionId(), Epoch: f.open.GetEpoch(), PosStart: pos, NRows: 1, LastChunk: true, Tokens: []int32{tok}}}})
}

// message queues a message the head got (SessionProgress, the close).
func (f *headFeed) message(msg *meshp2pb.StreamMessage) {
	if f != nil {
		f.push(msg)
	}
}

func (f *headFeed) push(msg *meshp2pb.StreamMessage) {
	if f.dropped.Load() {
		return
	}
	select {
	case f.q <- msg:
	default:
		f.drop("lagging", fmt.Errorf("%d frames queued for it", StandbyQueueFrames))
	}
}

// finish (the epoch ended) has the feed send what is queued and close the
// standby's stream; it does not wait.
func (f *headFeed) finish() {
	if f != nil {
		f.endOnce.Do(func() { close(f.end) })
	}
}

// run opens the standby's session, sends it the prefill and then the
// queue until the epoch ends (then it flushes and closes the stream: the
// standby ends and keeps its blocks) or the standby is dropped.
func (f *headFeed) run() {
	defer close(f.done)
	seam, from, err := f.admit()
	if err != nil {
		f.drop("admission", err)
		return
	}
	defer seam.Close()
	if err := f.prefill(seam, from); err != nil {
		f.drop("write", err)
		seam.Reset()
		return
	}
	for {
		if msg := f.held; msg != nil { // a message batching passed over
			f.held = nil
			if err := f.send(seam, msg); err != nil {
				f.drop("write", err)
				seam.Reset()
				return
			}
			continue
		}
		select {
		case msg := <-f.q:
			if err := f.send(seam, msg); err != nil {
				f.drop("write", err)
				seam.Reset()
				return
			}
		case <-f.gone:
			seam.Reset()
			return
		case <-f.end:
			f.flush(seam)
			return
		}
	}
}

// admit opens the standby's stream, sends the open and reads the accept:
// the positions the standby holds of the open's chain (its own cache;
// whole blocks short of the input's end) are where its prefill starts.
func (f *headFeed) admit() (*Seam, int, error) {
	o := f.o
	ctx, cancel := context.WithTimeout(context.Background(), DialTimeout)
	s, err := o.Dialer.NewStream(ctx, f.peer, o.Protocol)
	cancel()
	if err != nil {
		return nil, 0, fmt.Errorf("open stream: %w", err)
	}
	seam := NewSeam(s, o.Limits)
	r, from, err := admitStandby(s, seam, o.Limits, f.open, time.Now().Add(DefaultOpenTimeout))
	if err != nil {
		seam.Reset()
		return nil, 0, err
	}
	if from > 0 {
		from = min(from, len(f.input)-1)
	}
	o.logger().Info("standby open", "covers", "head", "standby", f.peer, "from", from)
	go f.watch(r, f.end, f.drop)
	return seam, from, nil
}

// prefill sends the input from position from as the head's prefill goes:
// FirstChunkRows first, then chunks of f.chunk rows.
func (f *headFeed) prefill(seam *Seam, from int) error {
	for off, n := from, FirstChunkRows; off < len(f.input); off, n = off+n, f.chunk {
		end := min(off+n, len(f.input))
		a := &meshp2pb.ActivationHeader{SessionId: f.open.GetSessionId(), Epoch: f.open.GetEpoch(), PosStart: uint32(off), NRows: uint32(end - off),
			IsPrefill: true, LastChunk: end == len(f.input), Tokens: f.input[off:end]}
		if err := seam.Send(idsFrame(a), WriteDeadline(DefaultIdle)); err != nil {
			return err
		}
		f.o.observer().StandbyFed(int(a.GetNRows()))
	}
	return nil
}

// send writes msg, with the tokens queued right after it in one frame
// (at most f.chunk rows).
func (f *headFeed) send(seam *Seam, msg *meshp2pb.StreamMessage) error {
	a := msg.GetActivation()
	if a == nil {
		f.closed.Store(msg.GetClose() != nil)
		return seam.Send(msg, WriteDeadline(DefaultIdle))
	}
	a = f.batch(a)
	if err := seam.Send(idsFrame(a), WriteDeadline(DefaultIdle)); err != nil {
		return err
	}
	f.o.observer().StandbyFed(int(a.GetNRows()))
	return nil
}

// batch appends to token frame a the tokens queued after it at the next
// positions; the first other message waits in held.
func (f *headFeed) batch(a *meshp2pb.ActivationHeader) *meshp2pb.ActivationHeader {
	for len(a.GetTokens()) < f.chunk {
		var next *meshp2pb.StreamMessage
		select {
		case next = <-f.q:
		default:
			return a
		}
		b := next.GetActivation()
		if b == nil || b.GetPosStart() != a.GetPosStart()+a.GetNRows() {
			f.held = next
			return a
		}
		a.Tokens = append(a.Tokens, b.GetTokens()...)
		a.NRows++
	}
	return a
}

// flush (the epoch ended) sends what is queued, within write deadlines,
// before the standby's stream closes.
func (f *headFeed) flush(seam *Seam) {
	for !f.dropped.Load() {
		msg := f.held
		f.held = nil
		if msg == nil {
			select {
			case msg = <-f.q:
			default:
				return
			}
		}
		if f.send(seam, msg) != nil {
			return
		}
	}
}

// idsFrame is the message of token-id frame a (no tensors).
func idsFrame(a *meshp2pb.ActivationHeader) *meshp2pb.StreamMessage {
	return &meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Activation{Activation: a}}
}
