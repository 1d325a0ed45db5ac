package delayproxy

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// echo serves a loopback echo server until the test ends.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
				_ = c.(*net.TCPConn).CloseWrite()
			})
		}
	})
	return ln.Addr().String()
}

// TestBytesIntactInOrder sends more than the proxy can buffer through it
// to an echo server and back, on several connections at once: every byte
// must come back, in order, and the half-close must pass through.
func TestBytesIntactInOrder(t *testing.T) {
	for _, delay := range []time.Duration{0, 2 * time.Millisecond} {
		t.Run(delay.String(), func(t *testing.T) {
			p, err := Start(context.Background(), "127.0.0.1:0", echo(t), delay)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			var wg sync.WaitGroup
			for i := range 4 {
				wg.Go(func() {
					want := make([]byte, 3*ChunkSize*MaxChunks+12345) // more than one direction buffers
					r := rand.New(rand.NewPCG(uint64(i), 1))
					for j := range want {
						want[j] = byte(r.Uint32())
					}
					c, err := net.Dial("tcp", p.Addr().String())
					if err != nil {
						t.Error(err)
						return
					}
					defer c.Close()
					go func() {
						// writes of odd sizes, so chunks split and merge
						for off := 0; off < len(want); {
							n := min(len(want)-off, 1+r.IntN(70000))
							if _, err := c.Write(want[off : off+n]); err != nil {
								return
							}
							off += n
						}
						_ = c.(*net.TCPConn).CloseWrite()
					}()
					got, err := io.ReadAll(c)
					if err != nil {
						t.Error(err)
						return
					}
					if !bytes.Equal(got, want) {
						t.Errorf("conn %d: %d bytes back, want %d, equal=%v", i, len(got), len(want), bytes.Equal(got, want))
					}
				})
			}
			wg.Wait()
		})
	}
}

// TestCloseEndsConnections: Close (or the context) ends open proxied
// connections, so a reader on one sees EOF or an error instead of hanging.
func TestCloseEndsConnections(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	p, err := Start(ctx, "127.0.0.1:0", echo(t), time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", p.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 4)
	if _, err := io.ReadFull(c, b); err != nil || string(b) != "ping" {
		t.Fatalf("echo: %q, %v", b, err)
	}
	cancel()
	_ = p.Close()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second)) // a hang fails, never a timing
	if _, err := c.Read(b); err == nil {
		t.Fatal("read after Close succeeded, want EOF or an error")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("connection still open after Close")
	}
	if _, err := Start(context.Background(), "127.0.0.1:0", "x", -time.Second); err == nil {
		t.Fatal("negative delay accepted")
	}
}

// pattern is a counting byte pattern whose period (251, a prime) matches
// no chunk or segment size, so a lost, repeated or reordered piece shows.
func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i % 251)
	}
	return b
}

// roundTrip sends want through the proxy at addr to an echo server in
// writes of random sizes, half-closes, and reads everything back. It
// returns what came back and how long it took from the first write.
// A deadline turns a hang into a failure, never a timing.
func roundTrip(t *testing.T, addr string, want []byte, seed uint64) ([]byte, time.Duration) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Error(err)
		return nil, 0
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(60 * time.Second))
	r := rand.New(rand.NewPCG(seed, 2))
	sizes := make([]int, 0, 64)
	for off := 0; off < len(want); {
		n := min(len(want)-off, 1+r.IntN(20000))
		sizes = append(sizes, n)
		off += n
	}
	start := time.Now()
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		off := 0
		for _, n := range sizes {
			if _, err := c.Write(want[off : off+n]); err != nil {
				return
			}
			off += n
		}
		_ = c.(*net.TCPConn).CloseWrite()
	})
	got, err := io.ReadAll(c)
	if err != nil {
		t.Errorf("read back: %v", err)
	}
	return got, time.Since(start)
}

// firstDiff is where a and b first differ, for a readable failure.
func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestLinkBytesIntact: whatever the link does (jitter larger than the
// gaps between chunks, rate caps, stalls, a preset), every byte comes
// back, in order, on several connections at once, and Stats counts each
// byte once each way.
func TestLinkBytesIntact(t *testing.T) {
	bb := Broadband(2 * time.Millisecond)
	bb.StallEvery, bb.Stall = 50*time.Millisecond, 10*time.Millisecond // stall often enough to matter here
	for _, tc := range []struct {
		name string
		l    Link
	}{
		{"jitter", Link{Jitter: 5 * time.Millisecond, Seed: 1}},
		{"delay+jitter", Link{Delay: 2 * time.Millisecond, Jitter: 10 * time.Millisecond, Seed: 2}},
		{"capped", Link{Jitter: time.Millisecond, UploadBytesPerSec: 8_000_000, DownloadBytesPerSec: 4_000_000}},
		{"stalls", Link{Delay: time.Millisecond, StallEvery: 10 * time.Millisecond, Stall: 3 * time.Millisecond, Seed: 3}},
		{"broadband", bb},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := StartLink(context.Background(), "127.0.0.1:0", echo(t), tc.l)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			const conns, size = 3, 300<<10 + 17
			want := pattern(size)
			var wg sync.WaitGroup
			for i := range conns {
				wg.Go(func() {
					got, _ := roundTrip(t, p.Addr().String(), want, uint64(i))
					if !bytes.Equal(got, want) {
						t.Errorf("conn %d: %d bytes back, want %d, first difference at %d", i, len(got), len(want), firstDiff(got, want))
					}
				})
			}
			wg.Wait()
			_ = p.Close() // the counts are final once Close has waited
			s := p.Stats()
			if s.Conns != conns || s.UploadBytes != conns*size || s.DownloadBytes != conns*size {
				t.Errorf("stats %+v, want %d conns and %d bytes each way", s, conns, conns*size)
			}
			if s.Stalled != time.Duration(s.Stalls())*tc.l.Stall {
				t.Errorf("stats %+v: Stalled is not Stalls×%v", s, tc.l.Stall)
			}
		})
	}
}

// TestRateCapAndDelay: a transfer through a capped or delayed link takes
// at least what physics says. The bucket lets at most two segments
// (≤ ChunkSize each) through at once, so n bytes at rate r take at least
// (n − 2·ChunkSize)/r; a round trip pays the delay twice. Only lower
// bounds are checked, so a busy machine cannot fail it.
func TestRateCapAndDelay(t *testing.T) {
	const size = 384 << 10
	capped := func(rate int64) time.Duration {
		return time.Duration(int64(size-2*ChunkSize) * int64(time.Second) / rate)
	}
	bb := Broadband(0)
	bb.StallEvery = 0
	for _, tc := range []struct {
		name string
		l    Link
		min  time.Duration
	}{
		{"upload 1MB/s", Link{UploadBytesPerSec: 1_000_000}, capped(1_000_000)},
		{"download 1MB/s", Link{DownloadBytesPerSec: 1_000_000}, capped(1_000_000)},
		{"both 1MB/s", Link{UploadBytesPerSec: 1_000_000, DownloadBytesPerSec: 1_000_000}, capped(1_000_000)},
		{"delay 30ms", Link{Delay: 30 * time.Millisecond}, 60 * time.Millisecond},
		{"delay+cap", Link{Delay: 30 * time.Millisecond, UploadBytesPerSec: 2_000_000}, 60*time.Millisecond + capped(2_000_000)},
		{"broadband upload", bb, capped(bb.UploadBytesPerSec)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := StartLink(context.Background(), "127.0.0.1:0", echo(t), tc.l)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			want := pattern(size)
			got, took := roundTrip(t, p.Addr().String(), want, 1)
			if !bytes.Equal(got, want) {
				t.Fatalf("%d bytes back, want %d, first difference at %d", len(got), len(want), firstDiff(got, want))
			}
			if took < tc.min {
				t.Errorf("%d bytes round trip took %v, physics says at least %v", size, took, tc.min)
			}
			t.Logf("%d bytes round trip in %v (at least %v)", size, took, tc.min)
		})
	}
}

// TestStalls: with a fixed Seed whose first stall interval is shorter
// than the time the capped upload is certainly busy, a long transfer
// injects at least one stall, and each upload stall adds its Stall to
// the transfer's lower bound; without StallEvery it injects none.
func TestStalls(t *testing.T) {
	const size = 384 << 10
	busy := time.Duration(int64(size-2*ChunkSize) * int64(time.Second) / 1_000_000) // upload busy at least this long
	for _, tc := range []struct {
		name      string
		l         Link
		minStalls int64
	}{
		{"seeded", Link{UploadBytesPerSec: 1_000_000, StallEvery: 40 * time.Millisecond, Stall: 10 * time.Millisecond, Seed: 7}, 1},
		{"seeded+delay", Link{Delay: 5 * time.Millisecond, UploadBytesPerSec: 1_000_000, StallEvery: 100 * time.Millisecond, Stall: 20 * time.Millisecond, Seed: 9}, 1},
		{"none", Link{UploadBytesPerSec: 1_000_000, Stall: 5 * time.Millisecond, Seed: 7}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.l.StallEvery > 0 {
				w := (&Proxy{link: tc.l, ctx: context.Background()}).newWriter(nil, upload, 0)
				w.timer.Stop()
				if w.left >= busy {
					t.Fatalf("seed %d draws a first interval of %v ≥ %v: pick another seed", tc.l.Seed, w.left, busy)
				}
			}
			p, err := StartLink(context.Background(), "127.0.0.1:0", echo(t), tc.l)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			want := pattern(size)
			got, took := roundTrip(t, p.Addr().String(), want, 3)
			if !bytes.Equal(got, want) {
				t.Fatalf("%d bytes back, want %d, first difference at %d", len(got), len(want), firstDiff(got, want))
			}
			_ = p.Close()
			s := p.Stats()
			t.Logf("%v, stats %+v", took, s)
			switch {
			case tc.minStalls == 0 && s.Stalls() != 0:
				t.Errorf("%d stalls without StallEvery", s.Stalls())
			case s.UploadStalls < tc.minStalls:
				t.Errorf("%d upload stalls, want at least %d", s.UploadStalls, tc.minStalls)
			case s.Stalled != time.Duration(s.Stalls())*tc.l.Stall:
				t.Errorf("Stalled %v, want %d×%v", s.Stalled, s.Stalls(), tc.l.Stall)
			}
			if least := busy + 2*tc.l.Delay + time.Duration(s.UploadStalls)*tc.l.Stall; took < least {
				t.Errorf("took %v, at least %v with %d upload stalls of %v", took, least, s.UploadStalls, tc.l.Stall)
			}
		})
	}
}

// TestSeedDeterministic: the jitter and stall draws of a connection's
// direction depend only on (Seed, connection, direction), and jitter
// stays in [0, Jitter).
func TestSeedDeterministic(t *testing.T) {
	l := Link{Jitter: 7 * time.Millisecond, StallEvery: time.Second, Stall: time.Millisecond, Seed: 42}
	draws := func(l Link, d direction, conn uint64) []time.Duration {
		w := (&Proxy{link: l, ctx: context.Background()}).newWriter(nil, d, conn)
		defer w.timer.Stop()
		out := []time.Duration{w.left}
		for range 50 {
			j := w.nextJitter()
			if j < 0 || j >= l.Jitter {
				t.Fatalf("jitter %v outside [0, %v)", j, l.Jitter)
			}
			out = append(out, j, w.nextInterval())
		}
		return out
	}
	base := draws(l, upload, 0)
	other := l
	other.Seed++
	for _, tc := range []struct {
		name string
		got  []time.Duration
		same bool
	}{
		{"same", draws(l, upload, 0), true},
		{"other seed", draws(other, upload, 0), false},
		{"other direction", draws(l, download, 0), false},
		{"other connection", draws(l, upload, 1), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if eq := slices.Equal(tc.got, base); eq != tc.same {
				t.Errorf("draws equal = %v, want %v", eq, tc.same)
			}
		})
	}
}

// TestValidate: a negative field is an error naming it, StartLink
// refuses it, and the presets are valid.
func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		l     Link
		wants []string // substrings of the error; none for a valid link
	}{
		{"zero", Link{}, nil},
		{"Delay", Link{Delay: -1}, []string{"Link.Delay"}},
		{"Jitter", Link{Jitter: -time.Millisecond}, []string{"Link.Jitter"}},
		{"UploadBytesPerSec", Link{UploadBytesPerSec: -1}, []string{"Link.UploadBytesPerSec"}},
		{"DownloadBytesPerSec", Link{DownloadBytesPerSec: -5}, []string{"Link.DownloadBytesPerSec"}},
		{"StallEvery", Link{StallEvery: -time.Second}, []string{"Link.StallEvery"}},
		{"Stall", Link{Stall: -time.Second}, []string{"Link.Stall "}},
		{"StallEvery without Stall", Link{StallEvery: time.Second}, []string{"Link.Stall is 0s"}},
		{"several", Link{Delay: -1, DownloadBytesPerSec: -1}, []string{"Link.Delay", "Link.DownloadBytesPerSec"}},
		{"Stall without StallEvery", Link{Stall: time.Second}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.l.Validate()
			if (err != nil) != (len(tc.wants) > 0) {
				t.Fatalf("Validate() = %v, want error %v", err, tc.wants)
			}
			for _, w := range tc.wants {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate() = %q, want it to name %q", err, w)
				}
			}
			p, err := StartLink(context.Background(), "127.0.0.1:0", "127.0.0.1:1", tc.l)
			if err == nil {
				_ = p.Close()
			}
			if (err != nil) != (len(tc.wants) > 0) {
				t.Errorf("StartLink error %v, want error %v", err, len(tc.wants) > 0)
			}
		})
	}
	for _, name := range PresetNames() {
		for _, h := range []time.Duration{0, 20 * time.Millisecond} {
			l, err := Preset(name, h)
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Validate(); err != nil || l.Delay != h {
				t.Errorf("preset %s(%v) = %+v: %v", name, h, l, err)
			}
		}
	}
	if l, _ := Preset("broadband", time.Millisecond); l != Broadband(time.Millisecond) {
		t.Errorf("Preset(broadband) = %+v, want Broadband's", l)
	}
	if _, err := Preset("dialup", 0); err == nil {
		t.Error("unknown preset accepted")
	}
}

// TestCloseMidTransfer: Close in the middle of a slow, stalling transfer
// returns (it would hang on a writer stuck in its pacer or a stall), the
// client sees EOF or an error, and no goroutine outlives the proxy and
// its echo server.
func TestCloseMidTransfer(t *testing.T) {
	before := runtime.NumGoroutine()
	t.Run("transfer", func(t *testing.T) {
		l := Link{Delay: 5 * time.Millisecond, UploadBytesPerSec: 100_000, DownloadBytesPerSec: 100_000,
			StallEvery: 20 * time.Millisecond, Stall: 50 * time.Millisecond, Seed: 1}
		p, err := StartLink(context.Background(), "127.0.0.1:0", echo(t), l)
		if err != nil {
			t.Fatal(err)
		}
		c, err := net.Dial("tcp", p.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		var wg sync.WaitGroup
		defer wg.Wait()
		wg.Go(func() { _, _ = c.Write(pattern(1 << 20)) }) // ~10 s at the cap: still going at Close
		b := make([]byte, 1)
		if _, err := io.ReadFull(c, b); err != nil {
			t.Fatal(err)
		}
		closed := make(chan struct{})
		go func() { _ = p.Close(); close(closed) }()
		select {
		case <-closed:
		case <-time.After(20 * time.Second):
			t.Fatal("Close hung")
		}
		if _, err := io.Copy(io.Discard, c); err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatal("connection still open after Close")
			}
		}
		_ = c.Close() // ends the writer
	})
	for deadline := time.Now().Add(20 * time.Second); runtime.NumGoroutine() > before; {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines after Close, %d before", runtime.NumGoroutine(), before)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
