package session

import (
	"bytes"
	"context"
	"slices"
	"sync"
	"testing"

	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/route"
)

// fakeCache is a fake engine's prefix cache: what its sessions kept, with
// the head's tokens, so a test sees which tokens a hop reused.
type fakeCache struct {
	mu      sync.Mutex
	entries []fakeEntry
	// adopted and first are every session's adopted positions and the
	// position of its first Forward, in order.
	adopted, first []int
	adoptedToks    [][]int32
	// poison, if set, makes the entries keep other rows than their
	// sessions were fed (a hop poisoning its own cache).
	poison bool
}

type fakeEntry struct {
	p    Prefix
	toks []int32
	rows []float32 // KeepInputs: the input rows of its positions
}

// withCache gives f's engine a prefix cache (its sessions implement
// PrefixSession).
func (f *fakeHop) withCache() *fakeCache {
	f.eng.mu.Lock()
	defer f.eng.mu.Unlock()
	f.eng.cache = &fakeCache{}
	return f.eng.cache
}

func (c *fakeCache) snapshot() (adopted, first []int, toks [][]int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.adopted), slices.Clone(c.first), slices.Clone(c.adoptedToks)
}

func (c *fakeCache) clear() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.entries = nil
}

// cachedSession is a fake session with the engine's prefix cache.
type cachedSession struct {
	*fakeSession
	c     *fakeCache
	keep  *Prefix
	toks  []int32 // head: the tokens of its positions
	first bool
	// keepRows (EngineParams.KeepInputs, not the head): rows are the
	// input rows of its positions, adoptedRows those Adopt gave.
	keepRows          bool
	rows, adoptedRows []float32
}

func (s *cachedSession) Adopt(_ context.Context, p Prefix) (int, []int32, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	n := 0
	var toks []int32
	for _, e := range s.c.entries {
		if !scopesMeet(e.p, p) || e.p.Owner != p.Owner || e.p.Block != p.Block {
			continue
		}
		k := 0
		for k < len(e.p.Hashes) && k < len(p.Hashes) && e.p.Hashes[k] == p.Hashes[k] {
			k++
		}
		if k*p.Block > n {
			n, toks = k*p.Block, e.toks[:min(len(e.toks), k*p.Block)]
			s.adoptedRows = nil
			if w := k * p.Block * fakeEmbd; s.keepRows && len(e.rows) >= w {
				s.adoptedRows = slices.Clone(e.rows[:w])
			}
		}
	}
	s.nextPos = n
	s.toks = slices.Clone(toks)
	s.rows = slices.Clone(s.adoptedRows)
	s.c.adopted = append(s.c.adopted, n)
	s.c.adoptedToks = append(s.c.adoptedToks, s.toks)
	return n, slices.Clone(toks), nil
}

// scopesMeet is the engine's rule: a scope in common, the alternative
// ones (a session's own) included.
func scopesMeet(a, b Prefix) bool {
	var zero [32]byte
	meet := func(x, y [32]byte) bool { return x != zero && x == y }
	return a.Scope == b.Scope || meet(a.AltScope, b.Scope) || meet(a.Scope, b.AltScope) || meet(a.AltScope, b.AltScope)
}

func (s *cachedSession) Keep(p Prefix) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keep = &p
}

func (s *cachedSession) Forward(ctx context.Context, in Input) (Output, error) {
	if !s.first {
		s.first = true
		s.c.mu.Lock()
		s.c.first = append(s.c.first, in.Pos)
		s.c.mu.Unlock()
	}
	out, err := s.fakeSession.Forward(ctx, in)
	if err == nil && in.Tokens != nil {
		s.mu.Lock()
		s.toks = append(s.toks[:min(len(s.toks), in.Pos)], in.Tokens...)
		s.mu.Unlock()
	}
	if err == nil && s.keepRows {
		s.mu.Lock()
		if len(s.rows) == in.Pos*fakeEmbd {
			s.rows = append(s.rows, in.Hidden...)
		} else {
			s.rows = nil // a position's rows unknown: none kept
		}
		s.mu.Unlock()
	}
	return out, err
}

// AdoptedInputs are the rows of the positions Adopt gave (InputKeeper).
func (s *cachedSession) AdoptedInputs() []float32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.adoptedRows
}

func (s *cachedSession) Truncate(ctx context.Context, pos int) error {
	if err := s.fakeSession.Truncate(ctx, pos); err != nil {
		return err
	}
	s.mu.Lock()
	s.toks = s.toks[:min(len(s.toks), pos)]
	s.rows = s.rows[:min(len(s.rows), pos*fakeEmbd)]
	s.mu.Unlock()
	return nil
}

func (s *cachedSession) Close() {
	s.mu.Lock()
	keep, pos, toks, rows := s.keep, s.nextPos, s.toks, s.rows
	s.mu.Unlock()
	if keep != nil {
		n := min(len(keep.Hashes), pos/keep.Block)
		keep.Hashes = keep.Hashes[:n]
		e := fakeEntry{p: *keep, toks: toks[:min(len(toks), n*keep.Block)]}
		s.c.mu.Lock()
		if len(rows) >= n*keep.Block*fakeEmbd {
			e.rows = slices.Clone(rows[:n*keep.Block*fakeEmbd])
			if s.c.poison && len(e.rows) > 3 {
				e.rows[3]++ // position 0's last value: the fake checks the others
			}
		}
		s.c.entries = append(s.c.entries, e)
		s.c.mu.Unlock()
	}
	s.fakeSession.Close()
}

// A conversation's second turn starts where the first one left its KV on
// every hop: the head tells the origin the route's minimum, the origin
// sends only the rest of the prompt, and the tokens are the reference's.
// The reused positions hold the first turn's tokens (the head's cache
// says so), another namespace reuses nothing, and a hop without a cache
// (an older peer) makes the route reuse nothing: every hop starts over.
// Alike with transcripts (the close goes down with the final statements).
func TestPrefixCacheAcrossTurns(t *testing.T) {
	for _, transcripts := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "transcripts"}[transcripts], func(t *testing.T) {
			testPrefixCacheAcrossTurns(t, transcripts)
		})
	}
}

func testPrefixCacheAcrossTurns(t *testing.T, transcripts bool) {
	hops := []*fakeHop{startHop(t, 0, 2, nil), startHop(t, 2, 4, nil), startHop(t, 4, 6, nil)}
	caches := []*fakeCache{hops[0].withCache(), hops[1].withCache(), hops[2].withCache()}
	o, _ := newOrigin(t, stagePlanner{[][]*fakeHop{{hops[0]}, {hops[1]}, {hops[2]}}}, hops...)
	o.Chunk = 16
	if transcripts {
		o.Audit = &Auditor{Rate: 0.5, Draw: func() float64 { return 0.99 }} // statements, never an audit
	}
	gen := func(prompt []int32, ns string) *Result {
		t.Helper()
		res, err := o.Generate(context.Background(), GenerateRequest{Fingerprint: fakeFP, NLayer: fakeNLay, Prompt: prompt, MaxTokens: 20,
			Sampling: &meshp2pb.SamplingParams{Seed: 3}, CacheNamespace: ns})
		if err != nil {
			t.Fatal(err)
		}
		if want := reference(prompt, 20, 3); !equal(res.Tokens, want) {
			t.Fatalf("tokens %v, want %v", res.Tokens, want)
		}
		waitReleased(t, hops...)
		return res
	}
	turn1 := make([]int32, 50)
	for i := range turn1 {
		turn1[i] = int32(i%90 + 1)
	}
	res1 := gen(turn1, "alice")
	if res1.CachedTokens != 0 || len(res1.lastOpen.GetFollows()) != 0 {
		t.Fatalf("the first turn reused %d tokens, follows session %x", res1.CachedTokens, res1.lastOpen.GetFollows())
	}
	// Turn 1 fed 50 + 19 tokens: 2 whole blocks kept on every hop, one
	// of them from the chain its close continued.
	turn2 := slices.Concat(turn1, reference(turn1, 20, 3), []int32{40, 41, 42, 43, 44, 45, 46, 47, 48, 49})
	res := gen(turn2, "alice")
	if res.CachedTokens != 64 || !slices.Equal(res.HopCached, []int{64, 64, 64}) {
		t.Fatalf("second turn: %d cached, per hop %v; want 64 on every hop", res.CachedTokens, res.HopCached)
	}
	if f := res.lastOpen.GetFollows(); !bytes.Equal(f, res1.lastOpen.GetSessionId()) {
		t.Fatalf("the second turn's open follows session %x, want the first turn's %x", f, res1.lastOpen.GetSessionId())
	}
	for i, c := range caches {
		adopted, first, toks := c.snapshot()
		if adopted[1] != 64 || first[1] != 64 {
			t.Fatalf("hop %d: adopted %v, first frames at %v", i, adopted, first)
		}
		if i == 0 && !slices.Equal(toks[1], turn2[:64]) {
			t.Fatalf("the head reused tokens %v, want the second turn's first 64", toks[1])
		}
	}
	if res := gen(turn2, "bob"); res.CachedTokens != 0 {
		t.Fatalf("another namespace reused %d tokens", res.CachedTokens)
	}
	// The middle hop loses its cache: the route holds nothing, every hop
	// starts at 0 (the head and tail cut back what they adopted).
	caches[1].clear()
	res = gen(turn2, "alice")
	adopted, first, _ := caches[0].snapshot()
	if res.CachedTokens != 0 || res.HopCached[1] != 0 || adopted[3] == 0 || first[3] != 0 {
		t.Fatalf("middle hop without the prefix: %d cached (%v); the head adopted %v and started at %v", res.CachedTokens, res.HopCached, adopted, first)
	}
}

// A chain continued at the close is the chain of the longer input;
// another namespace's chain differs from the first block; a hop takes only
// chains of its block size, whole hashes and at most MaxPrefixBlocks; and
// the origin refuses a head that answers positions its chain does not
// cover.
func TestPrefixChain(t *testing.T) {
	key := newTestHost(t).key()
	seed := PrefixSeed(key, "a")
	in := make([]int32, 200)
	for i := range in {
		in[i] = int32(i * 7)
	}
	c := prefixOf(seed, in[:100])
	if len(c.GetHashes()) != 3*prefixHashLen || c.GetBlockTokens() != PrefixBlock {
		t.Fatalf("chain of 100 tokens: %d bytes, blocks of %d", len(c.GetHashes()), c.GetBlockTokens())
	}
	more := prefixMore(seed, c, in[:130])
	if whole := prefixOf(seed, in[:129]); !slices.Equal(append(slices.Clone(c.GetHashes()), more...), whole.GetHashes()) {
		t.Fatal("the close's continuation is not the chain of the longer input")
	}
	if other := prefixOf(PrefixSeed(key, "b"), in[:100]); slices.Equal(other.GetHashes()[:prefixHashLen], c.GetHashes()[:prefixHashLen]) {
		t.Fatal("two namespaces share a first block")
	}
	for _, bad := range []*meshp2pb.PrefixChain{nil, {BlockTokens: 16, Hashes: c.GetHashes()}, {BlockTokens: PrefixBlock, Hashes: c.GetHashes()[:20]},
		{BlockTokens: PrefixBlock, Hashes: make([]byte, (MaxPrefixBlocks+1)*prefixHashLen)}} {
		if validChain(bad, nil) {
			t.Fatalf("chain %v taken", bad)
		}
	}
	if !validChain(c, more) || validChain(c, more[:3]) {
		t.Fatal("a valid chain refused, or a torn continuation taken")
	}
	e := &epochRun{chain: c, rt: &route.Route{Hops: make([]route.Hop, 2)}}
	res := &Result{}
	for _, acc := range []*meshp2pb.SessionAccept{{CachedTokens: 128}, {CachedTokens: 40}, {CachedTokens: 32, HopCached: []uint32{32, 32, 32}}} {
		e.accept = acc
		if _, _, err := e.cachedFrom(res, 100); err == nil {
			t.Fatalf("accept %v taken for a chain of 3 blocks on 2 hops", acc)
		}
	}
	e.accept = &meshp2pb.SessionAccept{CachedTokens: 64, HopCached: []uint32{96, 64}}
	if n, starts, err := e.cachedFrom(res, 90); n != 64 || starts != nil || err != nil || res.CachedTokens != 64 || !slices.Equal(res.HopCached, []int{96, 64}) {
		t.Fatalf("from %d %v (%v), result %+v", n, starts, err, res)
	}
	e.accept = &meshp2pb.SessionAccept{CachedTokens: 32, HopCached: []uint32{96, 128}}
	if _, _, err := e.cachedFrom(res, 90); err == nil {
		t.Fatal("a hop's count past the chain taken")
	}
	// With each hop's records: the head re-sends what the tail lacks.
	e.accept = &meshp2pb.SessionAccept{CachedTokens: 0, HopCached: []uint32{96, 0}, HopReplay: []uint32{96, 0}}
	if n, starts, err := e.cachedFrom(res, 90); n != 96 || !slices.Equal(starts, []uint32{96, 0}) || err != nil || res.CachedTokens != 0 {
		t.Fatalf("from %d %v (%v), result %+v", n, starts, err, res)
	}
}
