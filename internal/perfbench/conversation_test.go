package perfbench

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/neuron-tai/meshp2p/engine"
	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/session"
)

// ConvSpec is the conversation section's model: a random-weight llama of
// 6 layers × 512 (F16, 8 heads, 4 KV heads), small enough that ten turns
// of a 2,000-token conversation run in a minute on 2 cores, big enough
// that prefill is compute, not overhead.
func ConvSpec() gguf.Spec {
	s := gguf.DefaultSpec("llama")
	s.Layers, s.Embd, s.Heads, s.KVHeads, s.FF, s.Type, s.Seed = 6, 512, 8, 4, 1536, gguf.TypeF16, 3
	return s
}

// The agent conversation of issue 40: a 2,000-token system prompt (tools
// included), then turns that each add 100 user tokens to everything
// before and take a 16-token answer, through 3 real nodes on loopback.
const (
	convSystem, convUser, convAnswer, convTurns = 2000, 100, 16, 10
)

// conversation measures each turn's time to first token through the route
// with the prefix cache (the default), without it (the origin's
// NoPrefixCache: every turn prefills everything), and the anchor: the
// whole model in one process keeping its KV between turns (llama.cpp's own
// prefix reuse: a turn prefills only its new tokens). The goal: turn n
// with the cache within 1.3× of the anchor. The tokens with and without
// the cache must be equal.
func conversation(b *testing.B, t *Table, threads int) {
	ctx := context.Background()
	whole, shards, err := FilesOf(ctx, ConvSpec(), 3)
	if err != nil {
		b.Fatal(err)
	}
	cells := convSystem + convTurns*(convUser+convAnswer) + 64
	ec := engineCfg(threads)
	// Twice the conversation's cells: a turn's session may open while a
	// hop's advert still counts the turn before's reservation (adverts
	// follow within a second), which with room for one session only made
	// the origin wait for a route (measured: +1.8 s on half the turns).
	ec.NCtx, ec.NBatch, ec.PrefixCacheCells = 2*cells, 256, cells
	lb, err := StartLoopback(ctx, shards, ec)
	if err != nil {
		b.Fatal(err)
	}
	defer lb.Close()
	anchor := newAnchor(b, whole, ec)
	defer anchor.close()
	words := func(n, seed int) []int32 {
		w := make([]int32, n)
		for i := range w {
			w[i] = int32(3 + (i*131+seed*977)%250)
		}
		return w
	}
	convo := [2][]int32{words(convSystem, 0), words(convSystem, 0)}
	var with, without, local []time.Duration
	var cached []int
	for turn := range convTurns {
		var outs [2][]int32
		for mode, noCache := range []bool{true, false} {
			convo[mode] = slices.Concat(convo[mode], words(convUser, turn+1))
			o := lb.Client.Origin(nil)
			o.NoPrefixCache = noCache
			res, err := o.Generate(ctx, session.GenerateRequest{Fingerprint: lb.FP, NLayer: lb.NLayer, Prompt: convo[mode], MaxTokens: convAnswer})
			if err != nil {
				b.Fatal(err)
			}
			if noCache {
				without = append(without, res.TTFT)
			} else {
				with, cached = append(with, res.TTFT), append(cached, res.CachedTokens)
			}
			outs[mode] = res.Tokens
			convo[mode] = slices.Concat(convo[mode], res.Tokens)
		}
		if !slices.Equal(outs[0], outs[1]) {
			b.Fatalf("turn %d: %v with the cache, %v without", turn, outs[1], outs[0])
		}
		local = append(local, anchor.turn(b, convo[1][:len(convo[1])-len(outs[1])], outs[1]))
		b.Logf("conversation turn %d: %d tokens, %d reused: TTFT %v with the cache, %v without, %v whole model keeping its KV", turn,
			len(convo[1])-len(outs[1]), cached[turn], with[turn].Round(time.Millisecond), without[turn].Round(time.Millisecond), local[turn].Round(time.Millisecond))
	}
	later := func(ds []time.Duration) []time.Duration { return ds[1:] } // turn 0 has nothing to reuse
	t.Add(Row{Name: fmt.Sprintf("conversation turn 0 (%d tokens), TTFT", convSystem+convUser), Value: float64(with[0]) / 1e6, Unit: "ms",
		Baseline: float64(local[0]) / 1e6, BaseName: "whole model, same prefill"})
	t.Add(Row{Name: "conversation turns 1-9, TTFT, prefix cache", Value: medianMs(later(with)), Unit: "ms",
		Baseline: medianMs(later(local)), BaseName: "whole model keeping its KV", Goal: "<= 1.3"})
	t.Add(Row{Name: "conversation turns 1-9, TTFT, no prefix cache", Value: medianMs(later(without)), Unit: "ms",
		Baseline: medianMs(later(with)), BaseName: "with the prefix cache"})
	last := convTurns - 1
	t.Add(Row{Name: fmt.Sprintf("  turn %d: %d tokens, %d reused", last, len(convo[1])-convAnswer, cached[last]), Value: float64(with[last]) / 1e6, Unit: "ms",
		Baseline: float64(without[last]) / 1e6, BaseName: "no prefix cache"})
}

// anchor is the whole model in one process with one session kept open
// across a conversation's turns.
type anchor struct {
	l     *Loaded
	s     *engine.Session
	fed   int
	batch int
	stop  func()
}

func newAnchor(b *testing.B, whole string, ec engine.Config) *anchor {
	l, err := Load(context.Background(), whole, ec)
	if err != nil {
		b.Fatal(err)
	}
	s, err := l.Shard.OpenSession(engine.SessionKey{Epoch: 1}, engine.SessionParams{KVTokens: ec.NCtx})
	if err != nil {
		l.Close()
		b.Fatal(err)
	}
	return &anchor{l: l, s: s, batch: ec.NBatch, stop: func() { s.Close(); l.Close() }}
}

func (a *anchor) close() { a.stop() }

// turn prefills the prompt's tokens past what the session holds, timed
// to its first token, then feeds the answer but its last token (which the
// next turn's prompt brings), as a conversation continues.
func (a *anchor) turn(b *testing.B, prompt, answer []int32) time.Duration {
	ctx := context.Background()
	t0 := time.Now()
	for off := a.fed; off < len(prompt); off += a.batch {
		end := min(off+a.batch, len(prompt))
		if _, err := a.s.Forward(ctx, engine.Input{Pos: off, Tokens: prompt[off:end], Sample: end == len(prompt)}); err != nil {
			b.Fatal(err)
		}
	}
	took := time.Since(t0)
	a.fed = len(prompt)
	for _, tok := range answer[:len(answer)-1] {
		if _, err := a.s.Forward(ctx, engine.Input{Pos: a.fed, Tokens: []int32{tok}, Sample: true}); err != nil {
			b.Fatal(err)
		}
		a.fed++
	}
	return took
}
