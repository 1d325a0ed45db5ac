package specdecode

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
)

func seq(vals ...int32) []int32 { return vals }

func TestNGramProposals(t *testing.T) {
	passage := seq(40, 41, 42, 43, 44, 45, 46, 47, 48, 49)
	for _, tc := range []struct {
		name       string
		nMin, nMax int
		hist       []int32
		k          int
		want       []int32
		wantN      int
	}{
		{"copy: the answer quotes the prompt's passage", 2, 4,
			append(append(seq(1, 2, 3), passage...), 9, 9, 40, 41, 42), 5, seq(43, 44, 45, 46, 47), 3},
		{"k caps the draft", 2, 4, append(append(seq(1), passage...), 40, 41, 42), 2, seq(43, 44), 3},
		{"the draft stops at the history's end", 1, 3, seq(5, 6, 7, 5), 8, seq(6, 7, 5), 1},
		{"novel text: nothing", 1, 3, seq(1, 2, 3, 4, 5, 6), 4, nil, 0},
		{"the longest match wins", 1, 3,
			seq(7, 100, 1, 2, 7, 200, 9, 1, 2, 7), 1, seq(200), 3},
		{"the most recent occurrence wins", 2, 2, seq(3, 4, 10, 3, 4, 20, 3, 4), 1, seq(20), 2},
		{"a repeating pattern continues", 2, 3, seq(1, 2, 1, 2, 1, 2), 4, seq(1, 2), 3},
		{"too short for nMin", 3, 4, seq(1, 2), 4, nil, 0},
		{"k 0", 1, 2, seq(1, 2, 1), 0, nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, err := NewNGram(tc.nMin, tc.nMax)
			if err != nil {
				t.Fatal(err)
			}
			g.Append(tc.hist...)
			got, n := g.Propose(tc.k)
			if !slices.Equal(got, tc.want) || n != tc.wantN {
				t.Fatalf("Propose(%d) = %v (n %d), want %v (n %d)", tc.k, got, n, tc.want, tc.wantN)
			}
		})
	}
}

func TestNGramBounds(t *testing.T) {
	for _, p := range [][2]int{{0, 1}, {2, 1}, {1, MaxN + 1}, {-1, 3}} {
		if _, err := NewNGram(p[0], p[1]); !errors.Is(err, ErrBadParams) {
			t.Errorf("NewNGram(%d, %d) = %v, want ErrBadParams", p[0], p[1], err)
		}
	}
	g, _ := NewNGram(1, 2)
	g.Append(1, 2, 3)
	for range MaxDraft {
		g.Append(1, 2, 3)
	}
	if d, _ := g.Propose(1 << 20); len(d) > MaxDraft {
		t.Fatalf("draft of %d tokens, cap %d", len(d), MaxDraft)
	}
	// Past MaxHistory the oldest half goes; proposals still come from
	// what is kept, and Len counts everything appended.
	h, _ := NewNGram(2, 3)
	h.Append(7, 8, 9) // only at the very start
	for i := range MaxHistory {
		h.Append(int32(1000 + i%5000))
	}
	h.Append(7, 8)
	if h.Len() != MaxHistory+5 || len(h.hist) > MaxHistory {
		t.Fatalf("Len %d, kept %d", h.Len(), len(h.hist))
	}
	if d, n := h.Propose(1); d != nil {
		t.Fatalf("proposed %v (n %d) from dropped history", d, n)
	}
	h.Append(1000, 1001)
	if d, _ := h.Propose(3); !slices.Equal(d, seq(1002, 1003, 1004)) {
		t.Fatalf("after the drop: %v", d)
	}
}

// A rejected draft is truncated away: its tokens are never proposed
// from afterwards.
func TestNGramTruncate(t *testing.T) {
	g, _ := NewNGram(1, 2)
	g.Append(1, 2, 3, 4)
	g.Append(1, 2, 99) // 99: a rejected draft token
	g.Truncate(6)
	if d, _ := g.Propose(2); slices.Contains(d, 99) {
		t.Fatalf("after truncation: %v proposes the rejected token", d)
	}
	g.Append(3, 4, 1, 2)
	if d, _ := g.Propose(2); !slices.Equal(d, seq(3, 4)) {
		t.Fatalf("after truncation: %v, want [3 4]", d)
	}
	g.Truncate(100) // past the end: nothing
	if g.Len() != 10 {
		t.Fatalf("Len %d", g.Len())
	}
	g.Truncate(0)
	if d, _ := g.Propose(4); d != nil || g.Len() != 0 {
		t.Fatalf("empty history proposes %v (len %d)", d, g.Len())
	}
}

// check verifies a proposal against the kept history by brute force: the
// last n tokens occurred earlier, ending right before a position from
// which the draft is the history.
func check(t *testing.T, g *NGram, draft []int32, n int) {
	t.Helper()
	if draft == nil {
		return
	}
	h := g.hist
	if n < g.nMin || n > g.nMax || n > len(h) {
		t.Fatalf("matched n %d outside %d..%d (history %d)", n, g.nMin, g.nMax, len(h))
	}
	suffix := h[len(h)-n:]
	for at := len(h) - 1; at >= n; at-- {
		if slices.Equal(h[at-n:at], suffix) && slices.Equal(h[at:min(len(h), at+len(draft))], draft) {
			return
		}
	}
	t.Fatalf("draft %v (n %d) does not continue any earlier occurrence of %v in %v", draft, n, suffix, h)
}

func TestNGramRandomAgainstBruteForce(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		g, _ := NewNGram(1+r.IntN(3), 4)
		for range 300 {
			switch r.IntN(10) {
			case 0:
				g.Truncate(r.IntN(g.Len() + 1))
			default:
				g.Append(int32(r.IntN(6)))
			}
			d, n := g.Propose(1 + r.IntN(8))
			check(t, g, d, n)
		}
	}
}

func FuzzNGram(f *testing.F) {
	f.Add([]byte{1, 2, 3, 1, 2, 0, 5}, uint8(1), uint8(3))
	f.Fuzz(func(t *testing.T, ops []byte, lo, hi uint8) {
		g, err := NewNGram(int(lo%4), int(hi%10))
		if err != nil {
			return
		}
		ops = ops[:min(len(ops), 512)] // check is quadratic in the history
		for i, b := range ops {
			switch {
			case b == 255:
				g.Truncate(int(ops[(i+1)%len(ops)]) % (g.Len() + 1))
			default:
				g.Append(int32(b % 16))
			}
			d, n := g.Propose(int(b % 70))
			check(t, g, d, n)
		}
	})
}
