package session

import (
	"io"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/network"

	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// Per-hop timing (HopTiming on the wire): each hop reports, for every
// frame, how long it waited for it, read it, converted it, computed,
// converted the result and wrote the previous one on. The origin averages
// them per hop over the decode steps (HopStat); what no hop accounts for is
// the network.

// timedReader is a frame reader that knows when each frame's first byte
// arrived, which splits waiting for a frame from reading it. frame.Reader
// does no read-ahead, so the first Read of a ReadStream is the frame's.
type timedReader struct {
	*frame.Reader
	src *firstByteReader
	// call and end bound the last ReadStream; first is its first byte.
	call, end time.Time
}

// newTimedReader is streamReader (frames charged to the stream's scope)
// with the first-byte clock.
func newTimedReader(s network.Stream, lim frame.Limits) *timedReader {
	src := &firstByteReader{r: s}
	return &timedReader{Reader: frame.NewReader(src, lim).ChargeTo(s.Scope()), src: src}
}

// ReadStream reads one frame and records its timing.
func (t *timedReader) ReadStream() (*meshp2pb.StreamMessage, [][]byte, error) {
	t.call = time.Now()
	t.src.first = time.Time{}
	msg, tensors, err := t.Reader.ReadStream()
	t.end = time.Now()
	return msg, tensors, err
}

// timing is the last frame's wait (call to first byte) and read (first
// byte to decoded frame).
func (t *timedReader) timing() readTiming {
	first := t.src.first
	if first.IsZero() || first.Before(t.call) {
		first = t.call
	}
	return readTiming{wait: first.Sub(t.call), read: t.end.Sub(first)}
}

type firstByteReader struct {
	r     io.Reader
	first time.Time // when the first byte since it was zeroed arrived
}

func (f *firstByteReader) Read(p []byte) (int, error) {
	n, err := f.r.Read(p)
	if n > 0 && f.first.IsZero() {
		f.first = time.Now()
	}
	return n, err
}

// readTiming is how a frame reached this hop.
type readTiming struct{ wait, read, decode time.Duration }

// hopClock holds what a frame cannot report about itself: the time this
// hop took to write its previous frame on (and, on the head, the previous
// token up to the origin). Atomic: the head's prefill and decode frames
// arrive on different goroutines.
type hopClock struct {
	write, up atomic.Int64 // µs
}

func usOf(d time.Duration) uint32 {
	if d <= 0 {
		return 0
	}
	return uint32(min(d.Microseconds(), 1<<32-1))
}

// ownTiming appends this hop's timing to the ones before it, keeping at
// most idx earlier entries (hop idx receives exactly idx; the header limit
// bounds the rest anyway).
func ownTiming(prev []*meshp2pb.HopTiming, idx int, own *meshp2pb.HopTiming) []*meshp2pb.HopTiming {
	if len(prev) > idx {
		prev = prev[:idx]
	}
	return append(append(make([]*meshp2pb.HopTiming, 0, len(prev)+1), prev...), own)
}

// timingSums accumulates the hops' timings over decode steps at the origin.
type timingSums struct {
	n    int
	hops [][7]uint64 // wait, read, decode, compute, encode, write, up
}

func (s *timingSums) add(t []*meshp2pb.HopTiming) {
	if len(t) != len(s.hops) {
		return
	}
	for i, h := range t {
		v := &s.hops[i]
		for j, x := range [7]uint32{h.GetWaitUs(), h.GetReadUs(), h.GetDecodeUs(), h.GetComputeUs(), h.GetEncodeUs(), h.GetWriteUs(), h.GetUpUs()} {
			v[j] += uint64(x)
		}
	}
	s.n++
}

// fill writes the means into stats (one per hop).
func (s *timingSums) fill(stats []HopStat) {
	if s.n == 0 {
		return
	}
	for i := range stats {
		if i >= len(s.hops) {
			return
		}
		m := func(j int) float64 { return float64(s.hops[i][j]) / float64(s.n) }
		stats[i].WaitUs, stats[i].ReadUs, stats[i].DecodeUs = m(0), m(1), m(2)
		stats[i].EncodeUs, stats[i].WriteUs, stats[i].UpUs = m(4), m(5), m(6)
	}
}

// BusyUs is the hop's mean time per token on the critical path: everything
// but waiting for input.
func (h HopStat) BusyUs() float64 {
	return h.ReadUs + h.DecodeUs + h.MeanUs + h.EncodeUs + h.WriteUs + h.UpUs
}
