package engine

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/neuron-tai/meshp2p/engine/gguf"
)

// benchSpec is a ~114M-parameter llama (embd 1024, 10 layers, 16 heads /
// 4 KV heads, ff 2816, F16): big enough that per-hop overhead shows against
// real matmul work, small enough for a 2-core CI box.
func benchSpec() gguf.Spec {
	s := gguf.DefaultSpec("llama")
	s.Embd, s.Layers, s.Heads, s.KVHeads, s.FF, s.Type, s.Seed = 1024, 10, 16, 4, 2816, gguf.TypeF16, 1
	return s
}

// benchFiles returns the benchmark model and its even k-way shards, cached
// under os.TempDir()/meshp2p-bench keyed by the spec (generated once).
func benchFiles(b *testing.B, k int) []string {
	b.Helper()
	ctx := context.Background()
	s := benchSpec()
	key := fmt.Sprintf("%s-e%d-l%d-h%d-kv%d-ff%d-%v-seed%d", s.Arch, s.Embd, s.Layers, s.Heads, s.KVHeads, s.FF, s.Type, s.Seed)
	dir := filepath.Join(os.TempDir(), "meshp2p-bench")
	model := filepath.Join(dir, key+".gguf")
	if f, err := gguf.Open(model); err == nil {
		f.Close()
	} else {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			b.Fatal(err)
		}
		b.Logf("generating %s (once)", model)
		if err := gguf.Synth(ctx, s, model); err != nil {
			b.Fatal(err)
		}
	}
	if k == 1 {
		return []string{model}
	}
	ranges := gguf.EvenSplit(s.Layers, k)
	splitDir := filepath.Join(dir, fmt.Sprintf("%s.split%d", key, k))
	var paths []string
	missing := false
	for _, r := range ranges {
		p := filepath.Join(splitDir, gguf.ShardName(model, r))
		if f, err := gguf.Open(p); err == nil {
			f.Close()
		} else {
			missing = true
		}
		paths = append(paths, p)
	}
	if missing {
		if _, err := gguf.Split(ctx, model, ranges, splitDir, nil); err != nil {
			b.Fatal(err)
		}
	}
	return paths
}

func benchChain(b *testing.B, k int, cfg Config) []*Shard {
	b.Helper()
	var shards []*Shard
	for _, p := range benchFiles(b, k) {
		m, err := LoadModel(context.Background(), p, LoadOptions{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(m.Close)
		s, err := NewShard(context.Background(), m, cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		shards = append(shards, s)
	}
	return shards
}

// chainStep forwards rows through every shard's session (as the mesh does,
// in-process, f32 hidden states) and returns the tail's greedy token.
func chainStep(b *testing.B, sess []*Session, toks []int32, pos int) int32 {
	out, err := forwardChain(context.Background(), sess, toks, pos, true, false, nil)
	if err != nil {
		b.Fatal(err)
	}
	return out.Token
}

func openChain(b *testing.B, shards []*Shard, key SessionKey, kv int) []*Session {
	b.Helper()
	sess := make([]*Session, len(shards))
	for i, s := range shards {
		x, err := s.OpenSession(key, SessionParams{KVTokens: kv})
		if err != nil {
			b.Fatal(err)
		}
		sess[i] = x
	}
	return sess
}

func closeChain(sess []*Session) {
	for _, x := range sess {
		x.Close()
	}
}

// BenchmarkChain measures decode (ms/token, one token per step after a
// 16-token prompt) and prefill (tokens/s, 128-token prompts in one batch) of
// the whole model and of even 2- and 3-shard chains run in-process (no
// network: the hop cost measured is the engine's: capture, copy, extra graph
// and context per shard). Split sub-benchmarks also report their ratio to
// the whole model measured in the same run ("x_whole"; needs the whole
// sub-benchmark to run first, i.e. no -bench filter that skips it).
//
//	go test -run '^$' -bench BenchmarkChain -benchtime 64x ./engine
func BenchmarkChain(b *testing.B) {
	cfg := Config{NCtx: 2048, NBatch: 512, MaxSessions: 2}
	const promptLen, prefillLen = 16, 128
	prompt := make([]int32, promptLen)
	long := make([]int32, prefillLen)
	for i := range long {
		long[i] = int32(3 + (i*37)%360)
		if i < promptLen {
			prompt[i] = long[i]
		}
	}
	decodeWhole, prefillWhole := 0.0, 0.0
	for _, k := range []int{1, 2, 3} {
		name := "whole"
		if k > 1 {
			name = fmt.Sprintf("split%d", k)
		}
		b.Run("decode/"+name, func(b *testing.B) {
			shards := benchChain(b, k, cfg)
			limit := cfg.NCtx - 8
			epoch := uint64(0)
			var sess []*Session
			var tok int32
			pos := 0
			restart := func() {
				closeChain(sess)
				epoch++
				sess = openChain(b, shards, SessionKey{ID: [16]byte{1}, Epoch: epoch}, limit)
				tok = chainStep(b, sess, prompt, 0)
				pos = len(prompt)
			}
			restart()
			defer func() { closeChain(sess) }()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if pos >= limit {
					b.StopTimer()
					restart()
					b.StartTimer()
				}
				tok = chainStep(b, sess, []int32{tok}, pos)
				pos++
			}
			b.StopTimer()
			ms := float64(b.Elapsed().Nanoseconds()) / 1e6 / float64(b.N)
			b.ReportMetric(ms, "ms/token")
			if k == 1 {
				decodeWhole = ms
			} else if decodeWhole > 0 {
				b.ReportMetric(ms/decodeWhole, "x_whole")
			}
		})
		b.Run("prefill/"+name, func(b *testing.B) {
			shards := benchChain(b, k, cfg)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				sess := openChain(b, shards, SessionKey{ID: [16]byte{2}, Epoch: uint64(i)}, prefillLen+1)
				chainStep(b, sess, long, 0)
				closeChain(sess)
			}
			b.StopTimer()
			tps := float64(b.N*prefillLen) / b.Elapsed().Seconds()
			b.ReportMetric(tps, "tokens/s")
			if k == 1 {
				prefillWhole = tps
			} else if prefillWhole > 0 {
				b.ReportMetric(prefillWhole/tps, "x_whole") // time ratio, chain/whole
			}
		})
	}
}
