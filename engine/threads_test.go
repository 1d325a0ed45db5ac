package engine

import (
	"context"
	"slices"
	"sync"
	"testing"

	"github.com/neuron-tai/meshp2p/internal/testmodels"
)

// SetThreads swaps the shard's thread pool between decodes, and the
// logits stay bitwise the same: every product and attention row is
// computed by one thread whatever the count.
func TestSetThreadsKeepsOutput(t *testing.T) {
	m, s := loadWhole(t, testmodels.Path(t, "stories260K.gguf"))
	prompt, err := m.Tokenize("Once upon a time there was", true, false)
	if err != nil {
		t.Fatal(err)
	}
	run := func(key byte, threads []int) [][]float32 {
		sess, err := s.OpenSession(SessionKey{ID: [16]byte{key}}, SessionParams{KVTokens: 64})
		if err != nil {
			t.Fatal(err)
		}
		defer sess.Close()
		var all [][]float32
		in := Input{Pos: 0, Tokens: prompt, Sample: true, Logits: true}
		for i, n := range threads {
			s.SetThreads(n)
			out, err := sess.Forward(context.Background(), in)
			if err != nil {
				t.Fatal(err)
			}
			// The loop applied it before this step's decode (its answer
			// orders the read).
			if got := s.Threads(); got != n || s.threads != n {
				t.Fatalf("step %d: Threads() = %d, the pool's %d after SetThreads(%d)", i, got, s.threads, n)
			}
			all = append(all, slices.Clone(out.Logits))
			in = Input{Pos: in.Pos + len(in.Tokens), Tokens: []int32{out.Token}, Sample: true, Logits: true}
		}
		return all
	}
	steady := run(1, []int{2, 2, 2, 2, 2, 2})
	swapped := run(2, []int{1, 2, 1, 3, 1, 2})
	for i := range steady {
		if !slices.Equal(steady[i], swapped[i]) {
			t.Fatalf("step %d: logits differ after a thread-count change", i)
		}
	}
	s.SetThreads(0) // ignored
	if got := s.Threads(); got != 2 {
		t.Fatalf("SetThreads(0) changed the count to %d", got)
	}
}

// scriptGate hands out a scripted thread count per decode (limit caps
// it) and counts claims.
type scriptGate struct {
	mu       sync.Mutex
	script   []int
	limits   []int
	held     int
	acquired int
	last     int // the last count handed out
}

func (g *scriptGate) Acquire(limit int) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	k := min(limit, g.script[g.acquired%len(g.script)])
	g.acquired++
	g.limits = append(g.limits, limit)
	g.held += k
	g.last = k
	return k
}

func (g *scriptGate) Release(n int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.held -= n
}

// A gate sizes each decode's threads (at most the pool's), every claim is
// given back, and the logits are bitwise those of a fixed count.
func TestGateSizesEachDecode(t *testing.T) {
	path := testmodels.Path(t, "stories260K.gguf")
	m, fixed := loadWhole(t, path)
	g := &scriptGate{script: []int{1, 3, 2, 1}}
	gated, err := NewShard(context.Background(), m, Config{NCtx: 512, NBatch: 64, MaxSessions: 4, Threads: 2, Gate: g})
	if err != nil {
		t.Fatal(err)
	}
	defer gated.Close()
	prompt, err := m.Tokenize("Once upon a time there was", true, false)
	if err != nil {
		t.Fatal(err)
	}
	run := func(s *Shard) [][]float32 {
		sess, err := s.OpenSession(SessionKey{ID: [16]byte{9}}, SessionParams{KVTokens: 64})
		if err != nil {
			t.Fatal(err)
		}
		defer sess.Close()
		var all [][]float32
		in := Input{Pos: 0, Tokens: prompt, Sample: true, Logits: true}
		for i := range 6 {
			out, err := sess.Forward(context.Background(), in)
			if err != nil {
				t.Fatal(err)
			}
			// One decode per step; the loop's answer orders the read.
			if s == gated {
				g.mu.Lock()
				want := g.last
				g.mu.Unlock()
				if s.running != want {
					t.Fatalf("step %d computed on %d threads, want the gate's %d", i, s.running, want)
				}
			}
			all = append(all, slices.Clone(out.Logits))
			in = Input{Pos: in.Pos + len(in.Tokens), Tokens: []int32{out.Token}, Sample: true, Logits: true}
		}
		return all
	}
	want, got := run(fixed), run(gated)
	for i := range want {
		if !slices.Equal(want[i], got[i]) {
			t.Fatalf("step %d: logits differ under the gate's thread counts", i)
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.acquired < 6 || g.held != 0 {
		t.Fatalf("gate: %d decodes claimed, %d threads still held; want ≥ 6 and 0", g.acquired, g.held)
	}
	for _, l := range g.limits {
		if l != 2 {
			t.Fatalf("a decode asked for up to %d threads; the pool has 2", l)
		}
	}
}
