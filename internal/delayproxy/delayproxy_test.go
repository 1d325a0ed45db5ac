package delayproxy

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"net"
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
