// Package delayproxy is a loopback TCP proxy that holds every chunk it
// reads for a fixed one-way delay before writing it on, in each direction:
// a link with latency h for real-time benchmarks (internal/perfbench). It
// keeps the bytes and their order; each direction buffers at most
// MaxChunks chunks of ChunkSize bytes, and a full buffer stops reading
// (TCP back-pressure) instead of growing.
package delayproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// ChunkSize is the most bytes one read takes; MaxChunks is how many read
// chunks one direction may hold while they wait out the delay.
const (
	ChunkSize = 32 << 10
	MaxChunks = 64
)

// Proxy accepts on a loopback address and forwards every connection to
// one target with a one-way delay in each direction.
type Proxy struct {
	ln     net.Listener
	target string
	delay  time.Duration
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
}

// Start listens on listen (e.g. "127.0.0.1:0") and forwards to target
// with the given one-way delay until ctx is done or Close is called.
func Start(ctx context.Context, listen, target string, delay time.Duration) (*Proxy, error) {
	if delay < 0 {
		return nil, fmt.Errorf("delayproxy: negative delay %v", delay)
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("delayproxy: listen: %w", err)
	}
	p := &Proxy{ln: ln, target: target, delay: delay, conns: map[net.Conn]struct{}{}}
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
			var pw sync.WaitGroup
			pw.Go(func() { p.pipe(out, in) })
			pw.Go(func() { p.pipe(in, out) })
			pw.Wait()
		}()
	}
}

type chunk struct {
	b   []byte
	due time.Time
}

// pipe copies src to dst, each chunk delivered delay after it was read.
// At src's EOF it half-closes dst once the queue is written; on an error
// it closes both.
func (p *Proxy) pipe(dst, src net.Conn) {
	q := make(chan chunk, MaxChunks)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTimer(0)
		defer t.Stop()
		for c := range q {
			if w := time.Until(c.due); w > 0 {
				t.Reset(w)
				select {
				case <-t.C:
				case <-p.ctx.Done():
					return
				}
			}
			if _, err := dst.Write(c.b); err != nil {
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
			case q <- chunk{b: append([]byte(nil), buf[:n]...), due: time.Now().Add(p.delay)}:
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
