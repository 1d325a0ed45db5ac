package engine

import (
	"context"
	"slices"
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
