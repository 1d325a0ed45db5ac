package engine

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/internal/testmodels"
)

const testBlock = 16

// testPrefix chains toks' whole blocks of testBlock tokens for owner.
func testPrefix(owner string, toks []int32) Prefix {
	p := Prefix{Owner: owner, Scope: sha256.Sum256([]byte("scope/" + owner)), Block: testBlock}
	var h [16]byte
	for i := 0; i+testBlock <= len(toks); i += testBlock {
		d := sha256.New()
		d.Write(h[:])
		for _, t := range toks[i : i+testBlock] {
			d.Write(binary.LittleEndian.AppendUint32(nil, uint32(t)))
		}
		copy(h[:], d.Sum(nil))
		p.Hashes = append(p.Hashes, h)
	}
	return p
}

// adopt adopts p on every shard of x's chain; every shard must find the
// same positions.
func (x *invSession) adopt(t *testing.T, p Prefix) int {
	t.Helper()
	n := -1
	for i, s := range x.ss {
		got, toks, err := s.Adopt(context.Background(), p)
		if err != nil {
			t.Fatal(err)
		}
		if n >= 0 && got != n {
			t.Fatalf("shard %d adopted %d positions, shard 0 %d", i, got, n)
		}
		n = got
		if s.shard.info.IsHead() && len(toks) != got {
			t.Fatalf("head adopted %d positions with %d tokens", got, len(toks))
		}
	}
	x.pos = n
	return n
}

func (x *invSession) keep(p Prefix) {
	for _, s := range x.ss {
		s.Keep(p)
	}
}

// feed runs toks[from:to] through x in chunks of c (a fresh trace).
func feed(t *testing.T, x *invSession, toks []int32, from, to, c int) invTrace {
	t.Helper()
	var tr invTrace
	for i := from; i < to; i += c {
		tr.add(invStep(t, []*invSession{x}, [][]int32{toks[i:min(i+c, to)]})[0])
	}
	return tr
}

// rows is tr's rows [from, len).
func (tr invTrace) rows(from int) invTrace {
	return invTrace{mid: tr.mid[from:], logits: tr.logits[from:]}
}

// A session that adopts a cached prefix computes bitwise what a session
// computing every position itself does, on every shard of a chain: alone,
// after truncating part of the adopted prefix, batched with other
// sessions, and through compactions (the cache's cells restored beside the
// live sessions'). A closing session's longer prefix replaces the entry
// it extends; another owner or scope finds nothing; under pressure the
// least recently used entries go and no live session fails.
func TestPrefixCacheExact(t *testing.T) {
	dir := t.TempDir()
	models := map[string]func(*testing.T) string{
		"stories260K": func(t *testing.T) string { return testmodels.Path(t, "stories260K.gguf") },
	}
	// Sliding windows of 8 (gpt-oss, gemma3): the 96 positions slide far
	// past them, and an entry's cells must stay put (NewShard's swa_full).
	// glm4moe's shards fed hidden states restore a compaction in one
	// piece (kvmerge.go), the entries' cells with the live ones'.
	names := []string{"stories260K", "qwen3_q8_0", "gpt_oss_f32", "gemma3_f16", "glm4moe_q4_k_m"}
	for _, name := range names[1:] {
		models[name] = func(t *testing.T) string { return makeParityModel(t, invarianceModel(t, name), dir) }
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			cfg := Config{NCtx: 256, NBatch: 128, MaxSessions: 8, Threads: 2, PrefixCacheCells: 256, PrefixCacheEntries: 4}
			chain := loadShards(t, models[name](t), 3, cfg)
			nv := chain[0].info.NVocab
			id := byte(0)
			openKV := func(kv int) *invSession { id++; return openInv(t, chain, id, kv) }
			open := func() *invSession { return openKV(128) }

			// Reference: 96 positions one at a time (prompt, then greedy).
			x := open()
			toks := invPromptTokens(nv, 0)
			var ref invTrace
			for p := 0; p < 96; p++ {
				if p >= len(toks) {
					toks = append(toks, argmax(ref.logits[p-1]))
				}
				ref.add(invStep(t, []*invSession{x}, [][]int32{{toks[p]}})[0])
			}
			x.close()
			if c := chain[1].Capacity(); c.PrefixEntries != 0 {
				t.Fatalf("a session without Keep left %d entries", c.PrefixEntries)
			}

			// A first turn: 40 positions in chunks, kept (2 whole blocks).
			x = open()
			feed(t, x, toks, 0, 40, 13)
			x.keep(testPrefix("alice", toks[:40]))
			x.close()
			requireCache(t, chain, 1, 32)

			// The second turn adopts them and computes the rest.
			y := open()
			if n := y.adopt(t, testPrefix("alice", toks[:95])); n != 32 {
				t.Fatalf("adopted %d positions, want 32", n)
			}
			sameTrace(t, "after an adopted prefix", feed(t, y, toks, 32, 96, 7), ref.rows(32))
			y.keep(testPrefix("alice", toks[:96]))
			y.close()
			requireCache(t, chain, 1, 96) // the longer prefix replaced the one it extends

			// Another owner, or a prefix that differs in its first block,
			// finds nothing.
			z := open()
			if n := z.adopt(t, testPrefix("bob", toks[:95])); n != 0 {
				t.Fatalf("another owner adopted %d positions", n)
			}
			other := slices.Clone(toks[:95])
			other[3]++
			if n := z.adopt(t, testPrefix("alice", other)); n != 0 {
				t.Fatalf("a different first block adopted %d positions", n)
			}
			z.close()

			// Adopted, then cut back (the origin started lower: the first
			// frame's position), batched with others, through compactions.
			before, mergedBefore := compactions(chain), mergedRestores(chain)
			y = open()
			if n := y.adopt(t, testPrefix("alice", toks[:80])); n != 80 {
				t.Fatalf("adopted %d positions, want 80", n)
			}
			y.truncate(t, 50)
			got := batchedWithChurn(t, y, toks, 50, 96, func() *invSession { return openKV(churnKV) }, nv)
			sameTrace(t, "adopted, truncated, batched with churn", got, ref.rows(50))
			y.close()
			if compactions(chain) == before {
				t.Fatal("no compaction: the test no longer covers the cache's cells through one")
			}
			requireMerged(t, chain, mergedBefore)
			requireCache(t, chain, 1, 96)

			// Pressure: more prefixes than the cache's 4 entries and 256
			// cells; the least recently used go, the entry just used stays.
			for i := range 6 {
				w := open()
				p := invPromptTokens(nv, 20+i)
				p = slices.Concat(p, p, p)[:48]
				feed(t, w, p, 0, 48, 48)
				if i == 3 { // restored by the compaction above, and reused
					u := open()
					if n := u.adopt(t, testPrefix("alice", toks[:95])); n != 80 {
						t.Fatalf("the 96-position entry is gone after %d others (adopted %d)", i, n)
					}
					sameTrace(t, "adopted after a compaction", feed(t, u, toks, 80, 96, 16), ref.rows(80))
					u.close()
				}
				w.keep(testPrefix("carol", p))
				w.close()
			}
			c := chain[1].Capacity()
			if c.PrefixEntries > 4 || c.PrefixHeld > 256 || c.PrefixEvicted == 0 {
				t.Fatalf("over budget or nothing evicted: %+v", c)
			}
			requireReturned(t, chain, "after all sessions closed")
		})
	}
}

// requireCache fails unless every shard of chain holds n entries and
// cells cells in its prefix cache.
func requireCache(t *testing.T, chain []*Shard, n, cells int) {
	t.Helper()
	for i, s := range chain {
		if c := s.Capacity(); c.PrefixEntries != n || c.PrefixHeld != cells {
			t.Fatalf("shard %d: %d entries holding %d cells, want %d holding %d", i, c.PrefixEntries, c.PrefixHeld, n, cells)
		}
	}
}

// churnKV is the KV cells each of batchedWithChurn's sessions reserves.
const churnKV = 20

// batchedWithChurn feeds toks[from:to] to y one row at a time, batched
// with 6 other sessions (opened by open), half of which close every 5
// rows and are replaced (their cells fill the cache up to a compaction).
// It returns y's rows.
func batchedWithChurn(t *testing.T, y *invSession, toks []int32, from, to int, open func() *invSession, nv int) invTrace {
	t.Helper()
	others := make([]*invSession, 6)
	for j := range others {
		others[j] = open()
		invStep(t, []*invSession{others[j]}, [][]int32{invPromptTokens(nv, j+1)[:3+5*j%invPrompt]})
	}
	var got invTrace
	for p := from; p < to; p++ {
		if (p-from)%5 == 4 {
			for j := (p - from) / 5 % 2; j < len(others); j += 2 {
				others[j].close()
				others[j] = open()
				invStep(t, []*invSession{others[j]}, [][]int32{invPromptTokens(nv, 9+j)})
			}
		}
		xs, in := []*invSession{y}, [][]int32{{toks[p]}}
		for j, o := range others {
			if o.pos+2 <= churnKV {
				xs = append(xs, o)
				in = append(in, invPromptTokens(nv, j+3)[o.pos%invPrompt:][:min(1+(p+j)%2, invPrompt-o.pos%invPrompt)])
			}
		}
		got.add(invStep(t, xs, in)[0])
	}
	for _, o := range others {
		o.close()
	}
	return got
}

// A session longer than the whole cache keeps its first blocks that fit,
// and the next session adopts them.
func TestPrefixCacheKeepsWhatFits(t *testing.T) {
	path := testmodels.Path(t, "stories260K.gguf")
	const cells = 5*testBlock + testBlock/2 // 5 whole blocks fit
	chain := loadShards(t, path, 1, Config{NCtx: 256, NBatch: 64, MaxSessions: 4, Threads: 2, PrefixCacheCells: cells, PrefixCacheEntries: 2})
	var toks []int32
	for i := range 6 {
		toks = append(toks, invPromptTokens(chain[0].info.NVocab, i)...)
	}
	x := openInv(t, chain, 1, 128)
	feed(t, x, toks, 0, 100, 50)
	x.keep(testPrefix("a", toks[:100]))
	x.close()
	requireCache(t, chain, 1, 5*testBlock)
	y := openInv(t, chain, 2, 128)
	if n := y.adopt(t, testPrefix("a", toks[:100])); n != 5*testBlock {
		t.Fatalf("adopted %d positions, want %d", n, 5*testBlock)
	}
	y.close()
}

// Adopt is for new sessions only, and a shard without a cache adopts
// nothing and keeps nothing.
func TestPrefixCacheOff(t *testing.T) {
	path := testmodels.Path(t, "stories260K.gguf")
	chain := loadShards(t, path, 1, Config{NCtx: 256, NBatch: 64, MaxSessions: 4, Threads: 2})
	x := openInv(t, chain, 1, 64)
	toks := invPromptTokens(chain[0].info.NVocab, 0)
	feed(t, x, append(toks, toks...), 0, 40, 40)
	x.keep(testPrefix("a", toks))
	x.close()
	if c := chain[0].Capacity(); c.PrefixCells != 0 || c.PrefixEntries != 0 {
		t.Fatalf("no cache configured, yet %+v", c)
	}
	y := openInv(t, chain, 2, 64)
	if n, _, err := y.ss[0].Adopt(context.Background(), testPrefix("a", append(toks, toks...))); n != 0 || err != nil {
		t.Fatalf("adopt without a cache: %d, %v", n, err)
	}
	feed(t, y, toks, 0, 3, 3)
	if _, _, err := y.ss[0].Adopt(context.Background(), testPrefix("a", toks)); err == nil {
		t.Fatal("adopt after rows: no error")
	}
	y.close()
}

// The prefix cache's gain in compute (MESHP2P_PREFIX_BENCH=1): a
// conversation's turn n on one shard of a random-weight llama (n_embd 512,
// 6 layers, F16) prefilled whole, against the same turn adopting the turn
// before's prefix and computing the rest: the process's CPU time (one
// compute thread: robust to a loaded machine), best of 3. The logits of
// the last row are bitwise the same.
func TestPrefixCachePrefillTime(t *testing.T) {
	if os.Getenv("MESHP2P_PREFIX_BENCH") == "" {
		t.Skip("measurement: set MESHP2P_PREFIX_BENCH=1")
	}
	spec := gguf.DefaultSpec("llama")
	spec.Layers, spec.Embd, spec.Heads, spec.KVHeads, spec.FF, spec.Type = 6, 512, 8, 4, 1536, gguf.TypeF16
	path := filepath.Join(t.TempDir(), "bench512.gguf")
	if err := gguf.Synth(context.Background(), spec, path); err != nil {
		t.Fatal(err)
	}
	chain := loadShards(t, path, 1, Config{NCtx: 2048, NBatch: 256, MaxSessions: 4, Threads: 1, PrefixCacheCells: 2048})
	s := chain[0]
	nv := s.info.NVocab
	toks := make([]int32, 1600)
	for i := range toks {
		toks[i] = int32(3 + (i*131)%(nv-3))
	}
	id := byte(0)
	prefill := func(n, from int, p *Prefix) (time.Duration, []float32) {
		id++
		x, err := s.OpenSession(SessionKey{ID: [16]byte{id}}, SessionParams{KVTokens: n})
		if err != nil {
			t.Fatal(err)
		}
		defer x.Close()
		t0 := cpuTime(t)
		if p != nil {
			if got, _, err := x.Adopt(context.Background(), *p); err != nil || got != from {
				t.Fatalf("adopted %d, %v; want %d", got, err, from)
			}
		}
		var out *Output
		for i := from; i < n; i += 256 {
			if out, err = x.Forward(context.Background(), Input{Pos: i, Tokens: toks[i:min(i+256, n)], Logits: i+256 >= n}); err != nil {
				t.Fatal(err)
			}
		}
		return cpuTime(t) - t0, out.Logits
	}
	for _, n := range []int{616, 932, 1248, 1564} {
		prev := n - 316
		k := testPrefix("a", toks[:prev])
		// Keep the turn before's prefix (a session that computed it).
		id++
		x, _ := s.OpenSession(SessionKey{ID: [16]byte{id}}, SessionParams{KVTokens: prev})
		for i := 0; i < prev; i += 256 {
			if _, err := x.Forward(context.Background(), Input{Pos: i, Tokens: toks[i:min(i+256, prev)]}); err != nil {
				t.Fatal(err)
			}
		}
		x.Keep(k)
		x.Close()
		var whole, reuse time.Duration
		var want, got []float32
		for range 3 {
			d, l := prefill(n, 0, nil)
			whole, want = minDur(whole, d), l
			p := testPrefix("a", toks[:n-1])
			d, l = prefill(n, len(k.Hashes)*testBlock, &p)
			reuse, got = minDur(reuse, d), l
		}
		if i := firstDiff(got, want); i >= 0 {
			t.Fatalf("%d tokens: logits differ at %d", n, i)
		}
		t.Logf("turn of %4d tokens: prefill %v CPU whole, %v reusing %d cached: %.1f×", n, whole.Round(time.Millisecond), reuse.Round(time.Millisecond),
			len(k.Hashes)*testBlock, float64(whole)/float64(reuse))
	}
}

func minDur(a, b time.Duration) time.Duration {
	if a == 0 || b < a {
		return b
	}
	return a
}

// A session's own later epoch (a re-route) adopts the positions its old
// epoch held past the whole blocks (Prefix.KeepTail, Own), through the
// session's scope only and within Own, and computes the rest bitwise as
// a session computing every position; anyone else gets the whole blocks.
func TestPrefixCacheOwnTail(t *testing.T) {
	chain := loadShards(t, testmodels.Path(t, "stories260K.gguf"), 3, Config{NCtx: 256, NBatch: 64, MaxSessions: 4, Threads: 2, PrefixCacheCells: 256, PrefixCacheEntries: 4})
	nv := chain[0].info.NVocab
	toks := slices.Concat(invPromptTokens(nv, 0), invPromptTokens(nv, 1), invPromptTokens(nv, 2), invPromptTokens(nv, 3))[:64]
	r := openInv(t, chain, 1, 128)
	ref := feed(t, r, toks, 0, 64, 64)
	r.close()
	own := sha256.Sum256([]byte("session/1"))
	kept := testPrefix("a", toks[:45])
	kept.AltScope, kept.KeepTail = own, true
	x := openInv(t, chain, 2, 128)
	feed(t, x, toks, 0, 45, 20)
	x.keep(kept)
	x.close()
	requireCache(t, chain, 1, 45)
	cases := []struct {
		name      string
		alt       [32]byte
		own, want int
	}{
		{"another session", sha256.Sum256([]byte("session/2")), 60, 2 * testBlock},
		{"no own count", own, 0, 2 * testBlock},
		{"own count below the tail", own, 40, 40},
		{"own count past the tail", own, 60, 45},
	}
	for i, c := range cases {
		p := testPrefix("a", toks[:63])
		p.AltScope, p.Own = c.alt, c.own
		y := openInv(t, chain, byte(3+i), 128)
		if n := y.adopt(t, p); n != c.want {
			t.Fatalf("%s: adopted %d positions, want %d", c.name, n, c.want)
		}
		sameTrace(t, c.name, feed(t, y, toks, c.want, 64, 7), ref.rows(c.want))
		y.close()
	}
	// What epoch 1 kept serves a later epoch only below the own of the
	// epoch after it (its rows past that may be proposals epoch 2
	// replaced), and a later epoch's keep of the same blocks replaces it.
	p := testPrefix("a", toks[:63])
	p.AltScope, p.Own = own, 60
	p.OwnFor = func(k uint64) int { return map[uint64]int{0: 41}[k] }
	v := openInv(t, chain, 7, 128)
	if n := v.adopt(t, p); n != 41 {
		t.Fatalf("an epoch-0 tail adopted %d positions past the next epoch's own, want 41", n)
	}
	feed(t, v, toks, 41, 44, 3)
	kept.Epoch = 2
	v.keep(kept)
	v.close()
	requireCache(t, chain, 1, 44)
	p.OwnFor = func(k uint64) int { return map[uint64]int{0: 41, 2: 60}[k] }
	u := openInv(t, chain, 8, 128)
	if n := u.adopt(t, p); n != 44 {
		t.Fatalf("epoch 2's tail adopted %d positions, want 44", n)
	}
	u.close()
	// A clean close keeps whole blocks only.
	z := openInv(t, chain, 9, 128)
	feed(t, z, toks, 0, 50, 50)
	p = testPrefix("b", toks[:50])
	p.AltScope = sha256.Sum256([]byte("session/9"))
	z.keep(p)
	z.close()
	p.Own = 50
	w := openInv(t, chain, 10, 128)
	if n := w.adopt(t, p); n != 3*testBlock {
		t.Fatalf("an entry kept without its tail gave %d positions, want %d", n, 3*testBlock)
	}
	w.close()
	requireReturned(t, chain, "after all sessions closed")
}
