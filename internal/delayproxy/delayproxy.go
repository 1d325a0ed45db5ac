// Package delayproxy is a loopback TCP proxy that stands in for a network
// link in real-time benchmarks (internal/perfbench), on machines whose
// kernel has no netem qdisc. In each direction it holds every chunk it
// reads for a one-way delay before writing it on: Start gives a link with
// a fixed delay h, StartLink a Link profile that adds seeded jitter, a
// rate cap per direction and seeded stalls that mimic loss-driven TCP
// retransmits (Broadband and the other presets model home links). It
// keeps the bytes and their order; each direction buffers at most
// MaxChunks chunks of ChunkSize bytes, and a full buffer stops reading
// (TCP back-pressure) instead of growing.
package delayproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// ChunkSize is the most bytes one read takes; MaxChunks is how many read
// chunks one direction may hold while they wait out the delay.
const (
	ChunkSize = 32 << 10
	MaxChunks = 64
)

// Link describes the link the proxy mimics. The zero Link forwards at
// once; Link{Delay: h} is what Start(ctx, listen, target, h) gives.
//
// "Upload" is the client→target direction (bytes the proxy reads from
// the accepted connection and writes to target), "download" the
// target→client one. Each direction of each connection has its own delay
// queue, pacer and stall clock.
type Link struct {
	// Delay is the one-way base delay: a chunk read at t is written no
	// earlier than t+Delay.
	Delay time.Duration
	// Jitter adds a uniform [0, Jitter) to each chunk's delay. Order is
	// kept: a chunk is never released before the one read before it, so
	// a large jitter also delays the chunks behind a slow one.
	Jitter time.Duration
	// UploadBytesPerSec caps the client→target rate (bytes per second,
	// decimal: 2_500_000 is 20 Mbit/s); 0 is no cap. Writes are paced by
	// a token bucket of two segments, a segment being about 10 ms of the
	// rate (at least 1 KiB, at most ChunkSize), so a 64 KiB frame at
	// 1 MB/s takes about 64 ms to leave the proxy.
	UploadBytesPerSec int64
	// DownloadBytesPerSec is the same cap for target→client.
	DownloadBytesPerSec int64
	// StallEvery is the mean busy time between stalls, 0 for none. A
	// direction is busy while it holds data (read and not yet written);
	// a loss only hits data in flight, so an idle link never stalls. The
	// intervals are exponential, drawn from Seed.
	StallEvery time.Duration
	// Stall is how long a stall stops the direction, as a retransmit
	// timeout would (200 ms is about one minimum RTO): everything it has
	// not yet written, the chunk in flight and those queued behind it,
	// goes out Stall later than it would have, and the rate cap's bucket
	// earns nothing meanwhile. It must be positive when StallEvery is set.
	Stall time.Duration
	// Seed makes the randomness deterministic (math/rand/v2 PCG): the
	// n-th accepted connection's upload direction draws the same jitter
	// sequence (one draw per read chunk) and the same stall intervals in
	// every run with the same Seed. Which chunk gets which draw depends
	// on how the kernel splits the reads.
	Seed uint64
}

// Validate reports every negative field and a StallEvery without a Stall,
// each error naming the field.
func (l Link) Validate() error {
	var errs []error
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"Delay", l.Delay}, {"Jitter", l.Jitter}, {"StallEvery", l.StallEvery}, {"Stall", l.Stall}} {
		if f.d < 0 {
			errs = append(errs, fmt.Errorf("delayproxy: negative Link.%s %v", f.name, f.d))
		}
	}
	for _, f := range []struct {
		name string
		v    int64
	}{{"UploadBytesPerSec", l.UploadBytesPerSec}, {"DownloadBytesPerSec", l.DownloadBytesPerSec}} {
		if f.v < 0 {
			errs = append(errs, fmt.Errorf("delayproxy: negative Link.%s %d", f.name, f.v))
		}
	}
	if l.StallEvery > 0 && l.Stall <= 0 {
		errs = append(errs, fmt.Errorf("delayproxy: Link.Stall is %v, want > 0 when Link.StallEvery is set", l.Stall))
	}
	return errors.Join(errs...)
}

// Ideal is a link with only the one-way delay h: what Start gives.
func Ideal(h time.Duration) Link { return Link{Delay: h} }

// Fibre is a symmetric 100 Mbit/s fibre line with one-way delay h:
// jitter h/10, 12.5 MB/s each way, a 200 ms stall every ~30 s busy.
func Fibre(h time.Duration) Link {
	return Link{Delay: h, Jitter: h / 10, UploadBytesPerSec: 12_500_000, DownloadBytesPerSec: 12_500_000,
		StallEvery: 30 * time.Second, Stall: 200 * time.Millisecond}
}

// Broadband is an asymmetric home cable/DSL line with one-way delay h:
// jitter h/4, upload 2.5 MB/s (20 Mbit/s), download 12.5 MB/s
// (100 Mbit/s), a 200 ms stall every ~5 s busy.
func Broadband(h time.Duration) Link {
	return Link{Delay: h, Jitter: h / 4, UploadBytesPerSec: 2_500_000, DownloadBytesPerSec: 12_500_000,
		StallEvery: 5 * time.Second, Stall: 200 * time.Millisecond}
}

// Mobile is a 4G link with one-way delay h: jitter h/2, upload
// 1.25 MB/s (10 Mbit/s), download 5 MB/s (40 Mbit/s), a 300 ms stall
// every ~2 s busy.
func Mobile(h time.Duration) Link {
	return Link{Delay: h, Jitter: h / 2, UploadBytesPerSec: 1_250_000, DownloadBytesPerSec: 5_000_000,
		StallEvery: 2 * time.Second, Stall: 300 * time.Millisecond}
}

// PresetNames lists the names Preset knows, in order of link quality.
func PresetNames() []string { return []string{"ideal", "fibre", "broadband", "mobile"} }

// Preset returns the named preset (see PresetNames) with one-way delay h,
// for a benchmark flag.
func Preset(name string, h time.Duration) (Link, error) {
	switch name {
	case "ideal":
		return Ideal(h), nil
	case "fibre":
		return Fibre(h), nil
	case "broadband":
		return Broadband(h), nil
	case "mobile":
		return Mobile(h), nil
	}
	return Link{}, fmt.Errorf("delayproxy: unknown preset %q (want one of %v)", name, PresetNames())
}

// Stats are a Proxy's counters since it started.
type Stats struct {
	Conns          int64         // connections proxied (both ends connected)
	UploadBytes    int64         // bytes written to target (client→target)
	DownloadBytes  int64         // bytes written to clients (target→client)
	UploadStalls   int64         // stalls injected client→target
	DownloadStalls int64         // stalls injected target→client
	Stalled        time.Duration // the delay all stalls added: their count × Link.Stall
}

// Stalls is the number of stalls injected in both directions.
func (s Stats) Stalls() int64 { return s.UploadStalls + s.DownloadStalls }

// Proxy accepts on a loopback address and forwards every connection to
// one target over a mimicked Link in each direction.
type Proxy struct {
	ln     net.Listener
	target string
	link   Link
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  map[net.Conn]struct{}

	accepted             uint64 // accept order, only the accept goroutine touches it
	nconns, up, down     atomic.Int64
	upStalls, downStalls atomic.Int64
	stalled              atomic.Int64 // nanoseconds
}

// Start listens on listen (e.g. "127.0.0.1:0") and forwards to target
// with the given one-way delay until ctx is done or Close is called.
func Start(ctx context.Context, listen, target string, delay time.Duration) (*Proxy, error) {
	if delay < 0 {
		return nil, fmt.Errorf("delayproxy: negative delay %v", delay)
	}
	return start(ctx, listen, target, Ideal(delay))
}

// StartLink listens on listen (e.g. "127.0.0.1:0") and forwards to
// target over the link l until ctx is done or Close is called. An invalid
// l (see Link.Validate) is an error.
func StartLink(ctx context.Context, listen, target string, l Link) (*Proxy, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	return start(ctx, listen, target, l)
}

func start(ctx context.Context, listen, target string, l Link) (*Proxy, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("delayproxy: listen: %w", err)
	}
	p := &Proxy{ln: ln, target: target, link: l, conns: map[net.Conn]struct{}{}}
	p.ctx, p.cancel = context.WithCancel(ctx)
	p.wg.Add(2)
	go func() {
		defer p.wg.Done()
		<-p.ctx.Done()
		_ = ln.Close()
		p.mu.Lock()
		for c := range p.conns {
			_ = c.Close()
		}
		p.mu.Unlock()
	}()
	go p.accept()
	return p, nil
}

// Addr is the address the proxy listens on.
func (p *Proxy) Addr() *net.TCPAddr { return p.ln.Addr().(*net.TCPAddr) }

// Stats returns the proxy's counters. A byte is counted once the proxy
// has written it on; after Close the counts are final.
func (p *Proxy) Stats() Stats {
	return Stats{
		Conns:          p.nconns.Load(),
		UploadBytes:    p.up.Load(),
		DownloadBytes:  p.down.Load(),
		UploadStalls:   p.upStalls.Load(),
		DownloadStalls: p.downStalls.Load(),
		Stalled:        time.Duration(p.stalled.Load()),
	}
}

// Close stops accepting, closes every proxied connection and waits for
// the proxy's goroutines.
func (p *Proxy) Close() error {
	p.cancel()
	p.wg.Wait()
	return nil
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ctx.Err() != nil {
		_ = c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	_ = c.Close()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(in) {
			continue
		}
		n := p.accepted
		p.accepted++
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer p.untrack(in)
			var d net.Dialer
			out, err := d.DialContext(p.ctx, "tcp", p.target)
			if err != nil {
				return
			}
			if !p.track(out) {
				return
			}
			defer p.untrack(out)
			p.nconns.Add(1)
			var pw sync.WaitGroup
			pw.Go(func() { p.pipe(out, in, p.newWriter(out, upload, n)) })
			pw.Go(func() { p.pipe(in, out, p.newWriter(in, download, n)) })
			pw.Wait()
		}()
	}
}

type chunk struct {
	b    []byte
	read time.Time
}

// pipe copies src to dst through w, which delivers each chunk on the
// link's schedule. At src's EOF it half-closes dst once the queue is
// written; on an error it closes both.
func (p *Proxy) pipe(dst, src net.Conn, w *writer) {
	q := make(chan chunk, MaxChunks)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer w.timer.Stop()
		for c := range q {
			if err := w.write(c); err != nil {
				if p.ctx.Err() != nil {
					return
				}
				_ = src.Close()
				for range q { // drain so the reader is never stuck
				}
				return
			}
		}
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
	}()
	buf := make([]byte, ChunkSize)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			select {
			case q <- chunk{b: append([]byte(nil), buf[:n]...), read: time.Now()}:
			case <-p.ctx.Done():
				close(q)
				<-done
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				_ = dst.Close()
			}
			break
		}
	}
	close(q)
	<-done
}

type direction uint64

const (
	upload direction = iota
	download
)

// writer is one direction's sending end: delay and jitter, pacer, stall
// clock. Only its pipe's writing goroutine uses it.
type writer struct {
	ctx     context.Context
	dst     net.Conn
	timer   *time.Timer
	bytes   *atomic.Int64
	stalls  *atomic.Int64 // this direction's stall count
	stalled *atomic.Int64 // all stalls' nanoseconds

	delay, jitter time.Duration
	jrng          *rand.Rand // jitter draws; nil without jitter
	lastDue       time.Time  // the previous chunk's release time
	lastDone      time.Time  // when the previous chunk was written

	rate   int64         // bytes per second, 0 for no cap
	seg    int           // pacing segment
	segDur time.Duration // seg at rate
	tat    time.Time     // pacer: when the bucket is next empty

	every, hold time.Duration
	srng        *rand.Rand    // stall intervals; nil without stalls
	left        time.Duration // busy time left before the next stall
}

// seeds: a PCG stream per (seed, connection, direction, kind), so the
// jitter and stall sequences do not depend on each other.
func newRand(seed, conn uint64, d direction, kind uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed, conn<<2|uint64(d)<<1|kind))
}

func (p *Proxy) newWriter(dst net.Conn, d direction, conn uint64) *writer {
	l := p.link
	w := &writer{ctx: p.ctx, dst: dst, timer: time.NewTimer(0), stalled: &p.stalled,
		delay: l.Delay, jitter: l.Jitter, rate: l.UploadBytesPerSec, bytes: &p.up, stalls: &p.upStalls}
	if d == download {
		w.rate, w.bytes, w.stalls = l.DownloadBytesPerSec, &p.down, &p.downStalls
	}
	if w.jitter > 0 {
		w.jrng = newRand(l.Seed, conn, d, 0)
	}
	if w.rate > 0 {
		w.seg = int(min(max(w.rate/100, 1<<10), ChunkSize))
		w.segDur = w.dur(w.seg)
	}
	if l.StallEvery > 0 {
		w.every, w.hold = l.StallEvery, l.Stall
		w.srng = newRand(l.Seed, conn, d, 1)
		w.left = w.nextInterval()
	}
	return w
}

// dur is how long n bytes take at the capped rate.
func (w *writer) dur(n int) time.Duration {
	return time.Duration(int64(n) * int64(time.Second) / w.rate)
}

func (w *writer) nextJitter() time.Duration { return time.Duration(w.jrng.Int64N(int64(w.jitter))) }

func (w *writer) nextInterval() time.Duration {
	d := w.srng.ExpFloat64() * float64(w.every)
	return time.Duration(min(d, math.MaxInt64/4))
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

var errCanceled = errors.New("delayproxy: closed")

func (w *writer) sleepUntil(t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		if w.ctx.Err() != nil {
			return errCanceled
		}
		return nil
	}
	w.timer.Reset(d)
	select {
	case <-w.timer.C:
		return nil
	case <-w.ctx.Done():
		return errCanceled
	}
}

// write delivers c: not before its due time (read + delay + jitter, and
// not before the previous chunk's), in segments no faster than the rate
// cap, and holding for a stall whenever the stall clock, which runs while
// the direction holds data, runs out.
func (w *writer) write(c chunk) error {
	due := c.read.Add(w.delay)
	if w.jrng != nil {
		due = due.Add(w.nextJitter())
	}
	if due.Before(w.lastDue) {
		due = w.lastDue
	}
	w.lastDue = due
	busy := c.read // the stall clock has run up to busy
	if busy.Before(w.lastDone) {
		busy = w.lastDone
	}
	for b := c.b; len(b) > 0; {
		at, n := due, len(b)
		if w.rate > 0 {
			n = min(n, w.seg)
			if floor := time.Now().Add(-w.segDur); w.tat.Before(floor) {
				w.tat = floor // the bucket holds at most two segments
			}
			if w.tat.After(at) {
				at = w.tat
			}
		}
		if w.srng != nil {
			if stallAt := busy.Add(w.left); !stallAt.After(at) {
				// The stall hits before this segment leaves: the
				// direction goes dark for hold from stallAt (or now, if
				// the clock ran out during a blocked write), and every
				// release not yet made comes hold later.
				from := later(stallAt, time.Now())
				pushed := later(at, from).Add(w.hold)
				due, w.lastDue = pushed, later(w.lastDue, pushed)
				if w.rate > 0 {
					w.tat = pushed
				}
				w.stalls.Add(1)
				w.stalled.Add(int64(w.hold))
				w.left, busy = w.nextInterval(), from.Add(w.hold)
				continue
			}
		}
		if err := w.sleepUntil(at); err != nil {
			return err
		}
		if w.rate > 0 {
			w.tat = at.Add(w.dur(n))
		}
		m, err := w.dst.Write(b[:n])
		w.bytes.Add(int64(m))
		if err != nil {
			return err
		}
		b = b[n:]
		if w.srng != nil {
			now := time.Now()
			w.left -= now.Sub(busy)
			busy = now
		}
	}
	w.lastDone = time.Now()
	return nil
}
