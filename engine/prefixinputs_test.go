package engine

import (
	"context"
	"slices"
	"testing"

	"github.com/neuron-tai/meshp2p/internal/testmodels"
)

// rowsChain is a head and a tail shard's sessions of one conversation; the
// tail's keep their input rows when keepInputs.
type rowsChain struct {
	head, tail *Session
	fed        []float32 // the rows the tail got, by position
}

func openRows(t *testing.T, chain []*Shard, id byte, keepInputs bool) *rowsChain {
	t.Helper()
	var ss []*Session
	for _, s := range chain {
		sess, err := s.OpenSession(SessionKey{ID: [16]byte{id}, Epoch: 1}, SessionParams{KVTokens: 128, KeepInputs: keepInputs})
		if err != nil {
			t.Fatal(err)
		}
		ss = append(ss, sess)
	}
	return &rowsChain{head: ss[0], tail: ss[1]}
}

// run feeds toks at the chain's position.
func (c *rowsChain) run(t *testing.T, toks []int32) {
	t.Helper()
	ctx := context.Background()
	pos := c.head.NextPos()
	h, err := c.head.Forward(ctx, Input{Pos: pos, Tokens: toks})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.tail.Forward(ctx, Input{Pos: pos, Hidden: h.Hidden, Sample: true}); err != nil {
		t.Fatal(err)
	}
	w := c.head.shard.info.NEmbd
	c.fed = append(c.fed[:pos*w], h.Hidden...)
}

func (c *rowsChain) truncate(t *testing.T, pos int) {
	t.Helper()
	for _, s := range []*Session{c.head, c.tail} {
		if err := s.Truncate(context.Background(), pos); err != nil {
			t.Fatal(err)
		}
	}
	c.fed = c.fed[:pos*c.head.shard.info.NEmbd]
}

func (c *rowsChain) keepClose(p Prefix) {
	c.head.Keep(p)
	c.tail.Keep(p)
	c.head.Close()
	c.tail.Close()
}

// adopt adopts p on both shards: the positions, and the tail's adopted
// input rows.
func (c *rowsChain) adopt(t *testing.T, p Prefix) (int, []float32) {
	t.Helper()
	n, toks, err := c.head.Adopt(context.Background(), p)
	if err != nil || len(toks) != n {
		t.Fatalf("head adopted %d positions, %d tokens, %v", n, len(toks), err)
	}
	if c.head.AdoptedInputs() != nil {
		t.Fatal("the head has adopted input rows")
	}
	m, _, err := c.tail.Adopt(context.Background(), p)
	if err != nil || m != n {
		t.Fatalf("tail adopted %d positions, head %d (%v)", m, n, err)
	}
	return n, c.tail.AdoptedInputs()
}

// A session after the head that keeps its inputs keeps, with its cells,
// the rows it was fed at each position (those truncated away replaced by
// the rows fed after), and its adopter gets exactly them back; adopting
// and keeping a longer prefix carries them on; a session that does not
// keep inputs gets none; past the bound an entry keeps no rows but still
// serves.
func TestPrefixCacheKeepsInputs(t *testing.T) {
	path := testmodels.Path(t, "stories260K.gguf")
	chain := loadShards(t, path, 2, Config{NCtx: 512, NBatch: 64, MaxSessions: 4, Threads: 2, PrefixCacheCells: 256})
	nv := chain[0].info.NVocab
	toks := slices.Concat(invPromptTokens(nv, 0), invPromptTokens(nv, 1), invPromptTokens(nv, 2), invPromptTokens(nv, 4), invPromptTokens(nv, 5))
	other := slices.Concat(invPromptTokens(nv, 3), invPromptTokens(nv, 6))
	x := openRows(t, chain, 1, true)
	x.run(t, toks[:20])
	x.run(t, other[:20]) // positions 20-39, truncated away below
	x.truncate(t, 24)
	x.run(t, toks[24:40])
	want := slices.Clone(x.fed)
	got24 := slices.Concat(toks[:20], other[:4], toks[24:40])
	x.keepClose(testPrefix("a", got24))

	y := openRows(t, chain, 2, true)
	n, rows := y.adopt(t, testPrefix("a", slices.Concat(got24, toks[40:64])))
	w := chain[0].info.NEmbd
	if n != 2*testBlock || !slices.Equal(rows, want[:n*w]) {
		t.Fatalf("adopted %d positions with %d rows; want %d, the rows fed", n, len(rows)/w, 2*testBlock)
	}
	y.fed = slices.Clone(rows)
	y.run(t, slices.Concat(got24, toks[40:64])[n:64])
	want = slices.Clone(y.fed)
	y.keepClose(testPrefix("a", slices.Concat(got24, toks[40:64])))

	z := openRows(t, chain, 3, true)
	if n, rows := z.adopt(t, testPrefix("a", slices.Concat(got24, toks[40:64]))); n != 4*testBlock || !slices.Equal(rows, want[:n*w]) {
		t.Fatalf("second adopter: %d positions, %d rows", n, len(rows)/w)
	}
	z.keepClose(Prefix{})
	v := openRows(t, chain, 4, false)
	if n, rows := v.adopt(t, testPrefix("a", got24)); n != 2*testBlock || rows != nil {
		t.Fatalf("a session that keeps no inputs: %d positions, %d rows", n, len(rows))
	}
	v.keepClose(Prefix{})

	small := loadShards(t, path, 2, Config{NCtx: 512, NBatch: 64, MaxSessions: 4, Threads: 2, PrefixCacheCells: 256, PrefixCacheInputBytes: int64(testBlock * w * 4)})
	x = openRows(t, small, 1, true)
	x.run(t, toks[:40])
	x.keepClose(testPrefix("a", toks[:40]))
	y = openRows(t, small, 2, true)
	if n, rows := y.adopt(t, testPrefix("a", toks[:40])); n != 2*testBlock || rows != nil {
		t.Fatalf("over the bound: %d positions, %d rows (want the cells without rows)", n, len(rows)/w)
	}
	y.keepClose(Prefix{})
}
