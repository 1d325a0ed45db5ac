package perfbench

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/neuron-tai/meshp2p/session"
)

// sleepEngine is a shard whose every Forward takes exactly compute (virtual
// time inside a synctest bubble). Hidden rows carry [token, position]; the
// tail samples token+1, so the output is checkable.
type sleepEngine struct {
	info    session.ShardInfo
	compute time.Duration
	perRow  time.Duration // added per row after the first (verification windows)
	// cpu holds one token: one Forward at a time on a shard, like one
	// CPU (a channel, not a mutex: synctest advances time only while
	// every goroutine is durably blocked, which a mutex wait is not).
	cpu chan struct{}
}

const sleepEmbd, sleepNLayer = 2, 6

func (e *sleepEngine) Info() session.ShardInfo { return e.info }
func (e *sleepEngine) IsEOG(int32) bool        { return false }
func (e *sleepEngine) OpenSession(session.Key, session.EngineParams) (session.EngineSession, error) {
	return &sleepSession{e: e}, nil
}

type sleepSession struct{ e *sleepEngine }

func (s *sleepSession) Close()                              {}
func (s *sleepSession) Truncate(context.Context, int) error { return nil }
func (s *sleepSession) Forward(_ context.Context, in session.Input) (session.Output, error) {
	s.e.cpu <- struct{}{}
	defer func() { <-s.e.cpu }()
	rows := in.Hidden
	if s.e.info.IsHead() {
		for i, t := range in.Tokens {
			rows = append(rows, float32(t), float32(in.Pos+i))
		}
	}
	time.Sleep(s.e.compute + time.Duration(len(rows)/sleepEmbd-1)*s.e.perRow)
	if s.e.info.IsTail() {
		if in.Verify {
			var out session.Output
			for i := 0; i < len(rows); i += sleepEmbd {
				out.Token = int32(rows[i]) + 1
				out.Tokens = append(out.Tokens, out.Token)
				if r := i / sleepEmbd; r >= len(in.Draft) || in.Draft[r] != out.Token {
					break
				}
			}
			return out, nil
		}
		return session.Output{Token: int32(rows[len(rows)-2]) + 1}, nil
	}
	return session.Output{Hidden: rows}, nil
}

func sleepRing(compute [3]time.Duration) []session.Engine {
	var out []session.Engine
	for i, c := range compute {
		out = append(out, &sleepEngine{compute: c, cpu: make(chan struct{}, 1), info: session.ShardInfo{Start: 2 * i, End: 2*i + 2, ParentNLayer: sleepNLayer, NEmbd: sleepEmbd, NCtx: 4096, MaxSessions: 8}})
	}
	return out
}

// TestRingLatencyFloorExact runs a 3-hop route over links with one-way
// delay h in virtual time: the ring must pay each link once per token, so
// every token after the first takes exactly Σcompute + 3h (a protocol
// that waited for the origin, or sent a frame twice, would add h's).
func TestRingLatencyFloorExact(t *testing.T) {
	compute := [3]time.Duration{7 * time.Millisecond, 5 * time.Millisecond, 6 * time.Millisecond}
	for _, h := range []time.Duration{5 * time.Millisecond, 20 * time.Millisecond} {
		t.Run(h.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r, err := NewRing("sleep", sleepRing(compute), h)
				if err != nil {
					t.Fatal(err)
				}
				defer r.Close()
				const n = 16
				res, err := r.Origin.Generate(context.Background(), session.GenerateRequest{Fingerprint: "sleep", NLayer: sleepNLayer, Prompt: []int32{3, 4, 5}, MaxTokens: n})
				if err != nil {
					t.Fatal(err)
				}
				for i, tok := range res.Tokens {
					if tok != int32(6+i) {
						t.Fatalf("token %d is %d, want %d", i, tok, 6+i)
					}
				}
				floor := compute[0] + compute[1] + compute[2] + 3*h
				if got := PerToken(res); got != floor {
					t.Fatalf("per token %v, want exactly the floor Σcompute + 3h = %v", got, floor)
				}
				if got := Floor(res, h); got != floor {
					t.Fatalf("floor from the hops' compute %v, want %v", got, floor)
				}
			})
		})
	}
}

// TestRingSessionsScale is the many-sessions figure in virtual time, as
// if every hop had a CPU of its own: each hop computes one session at a
// time for 10 ms (no batching), links have h = 10 ms. One session gets a
// token per ring cycle (3·10 + 3·10 ms); with 8 the ring keeps every hop
// busy with another session, so the aggregate must reach 5× (the hops'
// compute bounds it at 6×).
func TestRingSessionsScale(t *testing.T) {
	compute := [3]time.Duration{10 * time.Millisecond, 10 * time.Millisecond, 10 * time.Millisecond}
	const h, n = 10 * time.Millisecond, 24
	agg := map[int]float64{}
	for _, k := range []int{1, 2, 4, 8} {
		synctest.Test(t, func(t *testing.T) {
			r, err := NewRing("sleep", sleepRing(compute), h)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			var wg sync.WaitGroup
			var mu sync.Mutex
			for i := range k {
				wg.Go(func() {
					res, err := r.Origin.Generate(context.Background(), session.GenerateRequest{Fingerprint: "sleep", NLayer: sleepNLayer, Prompt: []int32{int32(i + 1)}, MaxTokens: n})
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					agg[k] += 1 / PerToken(res).Seconds()
					mu.Unlock()
				})
			}
			wg.Wait()
		})
	}
	t.Logf("aggregate tok/s (virtual): 1: %.1f, 2: %.1f, 4: %.1f, 8: %.1f (%.2f×)", agg[1], agg[2], agg[4], agg[8], agg[8]/agg[1])
	if want := 1 / (60 * time.Millisecond).Seconds(); agg[1] != want {
		t.Fatalf("one session: %.3f tok/s, want %.3f (one token per 60 ms cycle)", agg[1], want)
	}
	if agg[8] < 5*agg[1] {
		t.Fatalf("8 sessions: %.1f tok/s, %.2f× one session, want >= 5×", agg[8], agg[8]/agg[1])
	}
}

// TestRingSessionsShareTheRing checks in virtual time that concurrent
// sessions overlap: each hop works on another session while one is on
// the links, so 8 sessions take no longer per token than one when the
// links dominate (a shard here computes one session at a time and does
// not batch).
func TestRingSessionsShareTheRing(t *testing.T) {
	compute := [3]time.Duration{time.Millisecond, time.Millisecond, time.Millisecond}
	const h = 10 * time.Millisecond
	synctest.Test(t, func(t *testing.T) {
		r, err := NewRing("sleep", sleepRing(compute), h)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		const sessions, n = 8, 12
		var wg sync.WaitGroup
		per := make([]time.Duration, sessions)
		errs := make([]error, sessions)
		for i := range sessions {
			wg.Go(func() {
				res, err := r.Origin.Generate(context.Background(), session.GenerateRequest{Fingerprint: "sleep", NLayer: sleepNLayer, Prompt: []int32{int32(i + 1)}, MaxTokens: n})
				errs[i] = err
				if err == nil {
					per[i] = PerToken(res)
				}
			})
		}
		wg.Wait()
		// The ring's cycle is 3 ms of compute + 30 ms of links; 8
		// sessions need 24 ms of compute per hop-cycle, so each still
		// gets one token per cycle.
		for i := range sessions {
			if errs[i] != nil {
				t.Fatal(errs[i])
			}
			if per[i] != 3*time.Millisecond+3*h {
				t.Fatalf("session %d: %v per token, want %v", i, per[i], 3*time.Millisecond+3*h)
			}
		}
	})
}
