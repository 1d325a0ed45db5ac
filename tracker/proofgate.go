package tracker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"golang.org/x/time/rate"

	"github.com/neuron-tai/meshp2p/p2p/peerlimit"
	"github.com/neuron-tai/meshp2p/route"
)

// What one proof may cost the tracker (issue 37, row 5: 8 streams each
// declaring 160 MiB, all but one byte sent, then stalled, held 2.3 GB for
// the whole 5-minute deadline).
//
// The proof protocol is refused before any byte is read when the tracker
// judges no proofs; otherwise a proof must pass, in order:
//   - at most one proof in flight per peer, MaxProofsInFlight in all, and
//     a per-peer rate (ProofBurst, then one per ProofInterval): refused at
//     once with a retry hint;
//   - its declared size is charged to a budget of MaxProofMemory bytes
//     across every proof in flight before any payload byte is read (the
//     libp2p stream scope's 32 MiB is below an honest proof of a long
//     context on a large model, so proofs have a budget of their own):
//     over it, refused;
//   - it must keep arriving: no read may wait more than ProofIdleTimeout,
//     and the whole proof must arrive within ProofGrace plus its size at
//     MinProofRate;
//   - judging (a replay through the model: CPU) runs one proof at a time,
//     each for at most ProofTimeout.
//
// So the memory proofs hold is bounded by MaxProofMemory whatever the
// number of identities, and a stalled stream gives its share back after
// ProofIdleTimeout. Many identities can still keep the slots busy (other
// proofs are refused with a retry hint meanwhile): they must send real
// bytes at MinProofRate to do it.
const (
	MaxProofsInFlight = 4
	MaxProofMemory    = 2 * route.MaxProofBytes
	ProofBurst        = 4
	ProofInterval     = 30 * time.Second
	ProofIdleTimeout  = 10 * time.Second
	ProofGrace        = 10 * time.Second
	MinProofRate      = 1 << 20 // bytes per second
)

// errProofBusy refuses a proof for now; a later one may pass.
var errProofBusy = errors.New("tracker: proof refused for now")

// proofGate is the tracker's accounting of proofs in flight.
type proofGate struct {
	idle  time.Duration
	rate  *peerlimit.Limiter
	judge chan struct{} // one judging at a time

	mu       sync.Mutex
	inFlight map[peer.ID]bool
	reserved int64 // declared bytes of the proofs in flight
}

func newProofGate(idle time.Duration) *proofGate {
	if idle <= 0 {
		idle = ProofIdleTimeout
	}
	return &proofGate{idle: idle, rate: peerlimit.NewLimiter(rate.Every(ProofInterval), ProofBurst, MaxTrackedClients),
		judge: make(chan struct{}, 1), inFlight: map[peer.ID]bool{}}
}

// admit takes p's slot; done gives it back with any memory charged.
func (g *proofGate) admit(p peer.ID, now time.Time) (done func(), err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case g.inFlight[p]:
		return nil, fmt.Errorf("%w: a proof of yours is being read or judged", errProofBusy)
	case len(g.inFlight) >= MaxProofsInFlight:
		return nil, fmt.Errorf("%w: %d proofs in flight, the most this tracker takes at once; retry in a minute", errProofBusy, MaxProofsInFlight)
	}
	if ok, wait := g.rate.Take(p, now); !ok {
		return nil, fmt.Errorf("%w: more than %d proofs then one per %s from one peer; retry in %s", errProofBusy, ProofBurst, ProofInterval, wait.Round(time.Second))
	}
	g.inFlight[p] = true
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			delete(g.inFlight, p)
			g.mu.Unlock()
		})
	}, nil
}

// Reserved is the declared bytes of the proofs in flight.
func (g *proofGate) Reserved() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.reserved
}

// proofRead is one proof's stream as it is read: a frame.MemoryScope
// charging the gate's budget, and an io.Reader enforcing the idle timeout
// and the minimum rate.
type proofRead struct {
	g       *proofGate
	s       network.Stream
	start   time.Time
	end     time.Time // the whole proof's deadline
	charged int64
}

func (g *proofGate) reader(s network.Stream, now time.Time) *proofRead {
	return &proofRead{g: g, s: s, start: now, end: now.Add(ProofGrace)}
}

// ReserveMemory charges the declared payload size: called by the frame
// reader before it reads a payload byte. It also sets the proof's
// deadline from its size.
func (r *proofRead) ReserveMemory(size int, _ uint8) error {
	r.g.mu.Lock()
	defer r.g.mu.Unlock()
	if r.g.reserved+int64(size) > MaxProofMemory {
		return fmt.Errorf("%w: %d bytes of proofs are being read, %d more is over the %d-byte budget", errProofBusy, r.g.reserved, size, MaxProofMemory)
	}
	r.g.reserved += int64(size)
	r.charged += int64(size)
	r.end = r.start.Add(ProofGrace + time.Duration(float64(r.charged)/MinProofRate*float64(time.Second)))
	return nil
}

// ReleaseMemory gives size bytes back.
func (r *proofRead) ReleaseMemory(size int) {
	r.g.mu.Lock()
	defer r.g.mu.Unlock()
	n := min(int64(size), r.charged)
	r.g.reserved -= n
	r.charged -= n
}

// release gives back everything still charged.
func (r *proofRead) release() { r.ReleaseMemory(int(r.charged)) }

// Read reads from the stream with a deadline: the idle timeout, or the
// proof's whole deadline when that comes first.
func (r *proofRead) Read(p []byte) (int, error) {
	d := time.Now().Add(r.g.idle)
	if r.end.Before(d) {
		d = r.end
	}
	_ = r.s.SetReadDeadline(d)
	return r.s.Read(p)
}

// judgeSlot waits for the judging slot (one proof replays at a time) or
// ctx.
func (g *proofGate) judgeSlot(ctx context.Context) (release func(), err error) {
	select {
	case g.judge <- struct{}{}:
		return func() { <-g.judge }, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("tracker: waiting to judge the proof: %w", ctx.Err())
	}
}
