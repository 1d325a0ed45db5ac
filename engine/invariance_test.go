package engine

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/internal/testmodels"
)

// The batch-invariance gate (issue 23): for every weight type the project
// produces and three architectures, a session's middle-shard activations
// and every row's logits are bitwise the same however its tokens are
// batched: (a) K-row batches against K single steps, (b) alone against
// batched with 1, 3 and 7 other sessions at other positions (and among the
// cells of sessions that closed, through a compaction), (c) a prompt
// prefilled in chunks of 1, 7, 64 or at once, then 16 greedy steps. Each
// check runs a 3-shard chain, so (d), the middle shard's output rows, is
// compared in every case alongside the tail's logits.
var invarianceModels = []parityModel{
	{name: "llama_f32", spec: smallSpec("llama", gguf.TypeF32)},
	{name: "llama_f16", spec: smallSpec("llama", gguf.TypeF16)},
	{name: "llama_q8_0", spec: smallSpec("llama", gguf.TypeF16), quant: QuantQ8_0, wantTypes: []string{"Q8_0"}},
	{name: "llama_q4_0", spec: smallSpec("llama", gguf.TypeF16), quant: QuantQ4_0, wantTypes: []string{"Q4_0"}},
	{name: "llama_q6_k", spec: smallSpec("llama", gguf.TypeF16), quant: QuantQ6_K, wantTypes: []string{"Q6_K"}},
	{name: "llama_q4_k_m", spec: smallSpec("llama", gguf.TypeF16), quant: QuantQ4_KM, wantTypes: []string{"Q4_K", "Q6_K"}},
	{name: "qwen3_f32", spec: smallSpec("qwen3", gguf.TypeF32)},
	{name: "qwen3_f16", spec: smallSpec("qwen3", gguf.TypeF16)},
	{name: "qwen3_q8_0", spec: smallSpec("qwen3", gguf.TypeF16), quant: QuantQ8_0, wantTypes: []string{"Q8_0"}},
	{name: "qwen3_q4_0", spec: smallSpec("qwen3", gguf.TypeF16), quant: QuantQ4_0, wantTypes: []string{"Q4_0"}},
	{name: "qwen3_q6_k", spec: smallSpec("qwen3", gguf.TypeF16), quant: QuantQ6_K, wantTypes: []string{"Q6_K"}},
	{name: "qwen3_q4_k_m", spec: smallSpec("qwen3", gguf.TypeF16), quant: QuantQ4_KM, wantTypes: []string{"Q4_K", "Q6_K"}},
	{name: "qwen3moe_f16", spec: smallSpec("qwen3moe", gguf.TypeF16)},
	{name: "qwen3moe_q4_k_m", spec: smallSpec("qwen3moe", gguf.TypeF16), quant: QuantQ4_KM, wantTypes: []string{"Q4_K", "Q6_K"}},
	{name: "deepseek2_q4_k_m", spec: smallSpec("deepseek2", gguf.TypeF16), quant: QuantQ4_KM, wantTypes: []string{"Q4_K", "Q6_K"}, fallback: deepseek2Fallback},
	{name: "minimax_m2_q4_k_m", spec: smallSpec("minimax-m2", gguf.TypeF16), quant: QuantQ4_KM, wantTypes: []string{"Q4_K", "Q6_K"}},
	{name: "mistral3_q8_0", spec: smallSpec("mistral3", gguf.TypeF16), quant: QuantQ8_0, wantTypes: []string{"Q8_0"}},
	// Sliding-window attention (windows of 8: the 36 positions a session
	// reaches slide past them) with a full-size window cache (NewShard).
	{name: "gpt_oss_f32", spec: smallSpec("gpt-oss", gguf.TypeF32)},
	{name: "gpt_oss_mxfp4", spec: smallSpec("gpt-oss", gguf.TypeF16), quant: QuantMXFP4, wantTypes: []string{"MXFP4", "Q8_0"}},
	{name: "gemma3_f16", spec: smallSpec("gemma3", gguf.TypeF16)},
	{name: "gemma3_q4_k_m", spec: smallSpec("gemma3", gguf.TypeF16), quant: QuantQ4_KM, wantTypes: []string{"Q4_K", "Q6_K"}},
	// Chunked attention (chunks of 8192: the sessions stay in the first).
	{name: "llama4_q8_0", spec: smallSpec("llama4", gguf.TypeF16), quant: QuantQ8_0, wantTypes: []string{"Q8_0"}},
	// M-RoPE on the shards fed hidden states (4 positions per row), also
	// through compaction's save and restore.
	{name: "glm4moe_q4_k_m", spec: smallSpec("glm4moe", gguf.TypeF16), quant: QuantQ4_KM, wantTypes: []string{"Q4_K", "Q6_K"}},
}

// invarianceModel is the row of invarianceModels called name.
func invarianceModel(t *testing.T, name string) parityModel {
	t.Helper()
	for _, m := range invarianceModels {
		if m.name == name {
			return m
		}
	}
	t.Fatalf("no invariance model %q", name)
	return parityModel{}
}

// invTrace is what one session's rows produced: the middle shard's output
// row and the tail's logits, per position.
type invTrace struct {
	mid, logits [][]float32
}

const (
	invPrompt = 20
	invSteps  = 16
)

func invPromptTokens(nVocab, salt int) []int32 {
	p := make([]int32, invPrompt)
	p[0] = 1
	for i := 1; i < len(p); i++ {
		p[i] = int32((i*37 + salt*101 + 250) % nVocab)
	}
	return p
}

// invSession is one session open on every shard of a chain.
type invSession struct {
	ss  []*Session
	pos int
}

func openInv(t *testing.T, chain []*Shard, id byte, kv int) *invSession {
	t.Helper()
	x := &invSession{}
	for _, s := range chain {
		sess, err := s.OpenSession(SessionKey{ID: [16]byte{id}, Epoch: 1}, SessionParams{KVTokens: kv})
		if err != nil {
			t.Fatal(err)
		}
		x.ss = append(x.ss, sess)
	}
	return x
}

func (x *invSession) close() {
	for _, s := range x.ss {
		s.Close()
	}
}

// invStep runs one batch per shard: sessions xs[i] feed toks[i] (several
// rows each), every session's rows in the same forwardMany call. It returns
// each session's middle rows and logits rows.
func invStep(t *testing.T, xs []*invSession, toks [][]int32) []invTrace {
	t.Helper()
	ctx := context.Background()
	n := len(xs[0].ss)
	ins := make([]Input, len(xs))
	for i, x := range xs {
		ins[i] = Input{Pos: x.pos, Tokens: toks[i]}
	}
	res := make([]invTrace, len(xs))
	for h := 0; h < n; h++ {
		ss := make([]*Session, len(xs))
		for i, x := range xs {
			ss[i] = x.ss[h]
			if h == n-1 {
				ins[i].AllLogits = true
			}
		}
		outs, err := forwardMany(ctx, ss, ins)
		if err != nil {
			t.Fatalf("shard %d: %v", h, err)
		}
		ne := ss[0].shard.info.NEmbd
		nv := ss[0].shard.info.NVocab
		for i, o := range outs {
			rows := len(toks[i])
			if h == n-1 {
				for r := 0; r < rows; r++ {
					res[i].logits = append(res[i].logits, o.Logits[r*nv:(r+1)*nv])
				}
				continue
			}
			if h == n/2 {
				for r := 0; r < rows; r++ {
					res[i].mid = append(res[i].mid, o.Hidden[r*ne:(r+1)*ne])
				}
			}
			ins[i] = Input{Pos: xs[i].pos, Hidden: o.Hidden}
		}
	}
	for i, x := range xs {
		x.pos += len(toks[i])
	}
	return res
}

func (tr *invTrace) add(o invTrace) {
	tr.mid = append(tr.mid, o.mid...)
	tr.logits = append(tr.logits, o.logits...)
}

// sameTrace fails unless got's rows [from, len(got)) equal want's bitwise.
func sameTrace(t *testing.T, what string, got, want invTrace) {
	t.Helper()
	if len(got.mid) != len(want.mid) || len(got.logits) != len(want.logits) {
		t.Fatalf("%s: %d middle / %d logit rows, want %d / %d", what, len(got.mid), len(got.logits), len(want.mid), len(want.logits))
	}
	for p := range want.mid {
		if i := firstDiff(got.mid[p], want.mid[p]); i >= 0 {
			t.Fatalf("%s: middle shard output at position %d differs (element %d: %g vs %g)", what, p, i, got.mid[p][i], want.mid[p][i])
		}
		if i := firstDiff(got.logits[p], want.logits[p]); i >= 0 {
			t.Fatalf("%s: logits at position %d differ (token %d: %g vs %g, max |Δ| %g)", what, p, i, got.logits[p][i], want.logits[p][i], MaxAbsDiff(got.logits[p], want.logits[p]))
		}
	}
}

// prefillThenGreedy feeds prompt in chunks of c, then invSteps greedy
// single steps; the returned tokens are prompt + generated.
func prefillThenGreedy(t *testing.T, x *invSession, prompt []int32, c int) (invTrace, []int32) {
	t.Helper()
	var tr invTrace
	for i := 0; i < len(prompt); i += c {
		tr.add(invStep(t, []*invSession{x}, [][]int32{prompt[i:min(i+c, len(prompt))]})[0])
	}
	toks := append([]int32(nil), prompt...)
	for s := 0; s < invSteps; s++ {
		next := argmax(tr.logits[len(tr.logits)-1])
		toks = append(toks, next)
		tr.add(invStep(t, []*invSession{x}, [][]int32{{next}})[0])
	}
	return tr, toks
}

func TestBatchInvariance(t *testing.T) {
	dir := t.TempDir()
	for _, m := range invarianceModels {
		t.Run(m.name, func(t *testing.T) {
			path := makeParityModel(t, m, dir)
			cfg := Config{NCtx: 512, NBatch: 128, MaxSessions: 8, Threads: 2}
			chain := loadShards(t, path, 3, cfg)
			nv := chain[0].info.NVocab
			const kv = 64 // 8 sessions × 64 cells = NCtx
			id := byte(0)
			open := func() *invSession { id++; return openInv(t, chain, id, kv) }

			// Reference: the prompt one token at a time, then greedy.
			x := open()
			ref, toks := prefillThenGreedy(t, x, invPromptTokens(nv, 0), 1)
			x.close()

			// (c) prompt in chunks of 7, 64 (at once), then greedy.
			for _, c := range []int{7, 64} {
				x := open()
				got, gtoks := prefillThenGreedy(t, x, invPromptTokens(nv, 0), c)
				x.close()
				if fmt.Sprint(gtoks) != fmt.Sprint(toks) {
					t.Fatalf("prefill in chunks of %d: greedy tokens %v, one at a time %v", c, gtoks[invPrompt:], toks[invPrompt:])
				}
				sameTrace(t, fmt.Sprintf("prefill in chunks of %d", c), got, ref)
			}

			// (a) the whole sequence in K-row batches.
			for _, k := range []int{2, 3, 4, 5, 8, 16} {
				x := open()
				var got invTrace
				for i := 0; i < len(toks); i += k {
					got.add(invStep(t, []*invSession{x}, [][]int32{toks[i:min(i+k, len(toks))]})[0])
				}
				x.close()
				sameTrace(t, fmt.Sprintf("%d-row batches", k), got, ref)
			}

			// (b) one token at a time, batched with m others at other
			// positions (some feeding 2 rows at once). With 7 others, half
			// of them close midway and new ones take their place, so the
			// target runs among cells left by closed sessions and through
			// a compaction.
			for _, m := range []int{1, 3, 7} {
				before, mergedBefore := compactions(chain), mergedRestores(chain)
				others := make([]*invSession, m)
				for j := range others {
					others[j] = open()
					p := invPromptTokens(nv, j+1)[:3+5*j%invPrompt]
					invStep(t, []*invSession{others[j]}, [][]int32{p})
				}
				x := open()
				var got invTrace
				for p := range toks {
					if m == 7 && p == len(toks)/2 {
						for j := 0; j < m; j += 2 {
							others[j].close()
							others[j] = open()
							invStep(t, []*invSession{others[j]}, [][]int32{invPromptTokens(nv, 9+j)})
						}
					}
					xs := []*invSession{x}
					in := [][]int32{{toks[p]}}
					for j, o := range others {
						if o.pos+2 > kv {
							continue
						}
						r := 1 + (p+j)%2
						xs = append(xs, o)
						in = append(in, invPromptTokens(nv, j+3)[o.pos%invPrompt:][:min(r, invPrompt-o.pos%invPrompt)])
					}
					got.add(invStep(t, xs, in)[0])
				}
				x.close()
				for _, o := range others {
					o.close()
				}
				sameTrace(t, fmt.Sprintf("batched with %d others", m), got, ref)
				if m == 7 && compactions(chain) == before {
					t.Fatalf("with 7 others and churn no shard compacted its KV cache (%d cells): the test no longer covers compaction", chain[0].nCtx)
				}
				if m == 7 {
					requireMerged(t, chain, mergedBefore)
				}
			}
			requireReturned(t, chain, "after all sessions closed")
		})
	}
}

// mergedRestores counts the chain's compactions, and those restored in
// one piece, per shard.
func mergedRestores(chain []*Shard) map[*Shard][2]int64 {
	n := map[*Shard][2]int64{}
	for _, s := range chain {
		n[s] = [2]int64{s.kv.compactions.Load(), s.kv.merged.Load()}
	}
	return n
}

// requireMerged fails unless every M-RoPE shard of chain restored each of
// its compactions since before in one piece (kvmerge.go), at least one
// did when the chain has one, and no other shard did.
func requireMerged(t *testing.T, chain []*Shard, before map[*Shard][2]int64) {
	t.Helper()
	mrope, merged := false, int64(0)
	for i, s := range chain {
		c, m := s.kv.compactions.Load()-before[s][0], s.kv.merged.Load()-before[s][1]
		switch {
		case s.mrope && m != c:
			t.Fatalf("shard %d ropes with M-RoPE: %d of its %d compactions restored in one piece, want all", i, m, c)
		case !s.mrope && m != 0:
			t.Fatalf("shard %d restored %d compactions in one piece without M-RoPE", i, m)
		}
		mrope, merged = mrope || s.mrope, merged+m
	}
	if mrope && merged == 0 {
		t.Fatal("no M-RoPE shard compacted: the test no longer covers restores in one piece")
	}
}

func compactions(chain []*Shard) int64 {
	var n int64
	for _, s := range chain {
		n += s.kv.compactions.Load()
	}
	return n
}

func (x *invSession) truncate(t *testing.T, pos int) {
	t.Helper()
	for _, s := range x.ss {
		if err := s.Truncate(context.Background(), pos); err != nil {
			t.Fatal(err)
		}
	}
	x.pos = pos
}

// Rows decoded after a truncation (a rejected speculative window) compute
// bitwise what they compute without the rejected rows, for the truncated
// session and for another one whose rows come next: the dropped cells go to
// the grave, so the cache keeps no holes for the other session's rows to
// fall into below its own cells (with plain seq_rm they would). Both
// sessions follow the reference tokens; truncating past a session's
// position is refused.
func TestTruncateKeepsInvariance(t *testing.T) {
	dir := t.TempDir()
	// Each model is found or made with the subtest's t: a missing fixture
	// skips that subtest (the parent's t.Skip from a subtest failed the
	// whole test on a clone without ../shared/models).
	models := map[string]func(*testing.T) string{
		"stories260K": func(t *testing.T) string { return testmodels.Path(t, "stories260K.gguf") },
	}
	// The sliding-window architectures too: a truncation must not leave
	// the window cache cells the full one does not.
	names := []string{"stories260K", "llama_f16", "qwen3_q8_0", "gpt_oss_mxfp4", "gemma3_f16", "llama4_q8_0", "glm4moe_q4_k_m"}
	for _, name := range names[1:] {
		models[name] = func(t *testing.T) string { return makeParityModel(t, invarianceModel(t, name), dir) }
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			chain := loadShards(t, models[name](t), 3, Config{NCtx: 512, NBatch: 128, MaxSessions: 8, Threads: 2})
			nv := chain[0].info.NVocab
			id := byte(0)
			open := func() *invSession { id++; return openInv(t, chain, id, 128) }
			// Reference: 80 tokens one at a time (prompt, then greedy).
			x := open()
			toks := invPromptTokens(nv, 0)
			var ref invTrace
			for p := 0; p < 80; p++ {
				if p >= len(toks) {
					toks = append(toks, argmax(ref.logits[p-1]))
				}
				ref.add(invStep(t, []*invSession{x}, [][]int32{{toks[p]}})[0])
			}
			x.close()

			y, other := open(), open()
			var gy, gother invTrace
			const cut, window, after = 12, 24, 16
			for p := 0; p < cut; p++ {
				tr := invStep(t, []*invSession{y, other}, [][]int32{{toks[p]}, {toks[p]}})
				gy.add(tr[0])
				gother.add(tr[1])
			}
			next := cut // the other session's next position
			for range 2 {
				// A rejected window next to the other session's next row;
				// then the other session alone for a few rows, into
				// whatever the truncation left.
				bad := make([]int32, window)
				for i := range bad {
					bad[i] = (toks[cut] + 1 + int32(i)) % int32(nv)
				}
				// Two rows, so the loop places them after the window (a
				// single row would go first, below the window's cells).
				gother.add(invStep(t, []*invSession{y, other}, [][]int32{bad, toks[next : next+2]})[1])
				next += 2
				y.truncate(t, cut)
				for range after {
					gother.add(invStep(t, []*invSession{other}, [][]int32{{toks[next]}})[0])
					next++
				}
			}
			if err := y.ss[0].Truncate(context.Background(), cut+1); !errors.Is(err, ErrBadInput) {
				t.Fatalf("truncate past the session's position: %v, want ErrBadInput", err)
			}
			gy.add(invStep(t, []*invSession{y}, [][]int32{toks[cut:]})[0])
			gother.add(invStep(t, []*invSession{other}, [][]int32{toks[next:]})[0])
			sameTrace(t, "the truncated session", gy, ref)
			sameTrace(t, "the session next to it", gother, ref)
			y.close()
			other.close()
			requireReturned(t, chain, "after all sessions closed")
		})
	}
}
