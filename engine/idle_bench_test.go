package engine

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// BenchmarkDecodeAfterIdle measures what a route's hop pays for waiting:
// the 3-shard chain of BenchmarkChain decodes one token per step, in one
// process, and each step either goes from shard to shard straight on (as
// generate --local decodes, layer after layer, token after token) or
// sleeps before each shard's decode as long as the other hops of a
// co-located route compute (idleGap; the CPUs sit idle meanwhile). The two kinds of step are interleaved at random, so
// both see the same machine; it reports the median summed compute of the
// three shards per token each way ("ms_busy", "ms_after_idle") and their
// ratio ("idle_x"). No network and no other process is involved: whatever
// idle_x is above 1 is what each hop of a route pays over the whole model
// before a byte is sent (docs/performance.md, "Where the rest of the gap
// goes").
//
//	go test -run '^$' -bench BenchmarkDecodeAfterIdle -benchtime 400x ./engine
func BenchmarkDecodeAfterIdle(b *testing.B) {
	const idleGap = 7 * time.Millisecond // about two hops' decode of the bench model
	for _, threads := range []int{1, 2} {
		b.Run(map[int]string{1: "threads=1", 2: "threads=2"}[threads], func(b *testing.B) {
			shards := benchChain(b, 3, Config{NCtx: 2048, NBatch: 512, MaxSessions: 2, Threads: threads})
			sess := openChain(b, shards, SessionKey{ID: [16]byte{7}}, 2048)
			defer func() { closeChain(sess) }() // the last sessions opened
			ctx := context.Background()
			prompt := []int32{1, 40, 50, 60}
			tok := chainStep(b, sess, prompt, 0)
			pos := len(prompt)
			var busy, idle []float64
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if pos >= 2048-1 { // a fresh session: the KV is full
					closeChain(sess)
					sess = openChain(b, shards, SessionKey{ID: [16]byte{7, byte(i)}, Epoch: uint64(i)}, 2048)
					tok, pos = chainStep(b, sess, prompt, 0), len(prompt)
				}
				wait := rand.IntN(2) == 0
				var sum time.Duration
				var hidden []float32
				for j, x := range sess {
					in := Input{Pos: pos, Hidden: hidden}
					if j == 0 {
						in.Tokens = []int32{tok}
					}
					if j == len(sess)-1 {
						in.Sample = true
					}
					if wait {
						time.Sleep(idleGap)
					}
					t0 := time.Now()
					out, err := x.Forward(ctx, in)
					if err != nil {
						b.Fatal(err)
					}
					sum += time.Since(t0)
					hidden, tok = out.Hidden, out.Token
				}
				pos++
				if wait {
					idle = append(idle, float64(sum)/1e6)
				} else {
					busy = append(busy, float64(sum)/1e6)
				}
			}
			if len(busy) == 0 || len(idle) == 0 {
				return
			}
			mb, mi := median(busy), median(idle)
			b.ReportMetric(mb, "ms_busy")
			b.ReportMetric(mi, "ms_after_idle")
			b.ReportMetric(mi/mb, "idle_x")
		})
	}
}

func median(x []float64) float64 {
	s := slices.Clone(x)
	slices.Sort(s)
	return s[len(s)/2]
}
