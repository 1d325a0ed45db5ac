package engine

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/neuron-tai/meshp2p/internal/testmodels"
)

// TestVerifyEqualsSteps: verifying proposed tokens several rows at a time
// (speculative decoding) gives exactly the tokens one-row steps give,
// greedy and sampled (penalties and the seeded draw see each committed
// token once), whatever the window size, with or without a proposal
// after the last row, when proposals are wrong at any row (the session
// then truncates the rejected rows and goes on from the correction).
func TestVerifyEqualsSteps(t *testing.T) {
	m, s := loadWhole(t, testmodels.Path(t, "stories260K.gguf"))
	prompt, err := m.Tokenize("Once upon a time there was a", true, false)
	if err != nil {
		t.Fatal(err)
	}
	const n = 64
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		smp  Sampling
	}{
		{"greedy", Sampling{}},
		{"greedy_penalties", Sampling{RepeatPenalty: 1.3, FrequencyPenalty: 0.5}},
		{"t0.7", Sampling{Temperature: 0.7, Seed: 7}},
		{"t1.2_topk_penalties", Sampling{Temperature: 1.2, TopK: 40, RepeatPenalty: 1.1, PresencePenalty: 0.3, Seed: 42}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			open := func(id byte) *Session {
				sess, err := s.OpenSession(SessionKey{ID: [16]byte{id}}, SessionParams{KVTokens: 256, Sampling: tc.smp})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(sess.Close)
				return sess
			}
			// Reference: one row per step.
			ref := open(1)
			out, err := ref.Forward(ctx, Input{Pos: 0, Tokens: prompt, Sample: true})
			if err != nil {
				t.Fatal(err)
			}
			want := []int32{out.Token}
			for len(want) < n {
				out, err = ref.Forward(ctx, Input{Pos: len(prompt) + len(want) - 1, Tokens: want[len(want)-1:], Sample: true})
				if err != nil {
					t.Fatal(err)
				}
				want = append(want, out.Token)
			}
			for _, k := range []int{1, 2, 4, 7} {
				for _, look := range []bool{false, true} {
					x := open(2)
					out, err := x.Forward(ctx, Input{Pos: 0, Tokens: prompt, Sample: true})
					if err != nil {
						t.Fatal(err)
					}
					got := []int32{out.Token}
					windows := 0
					for len(got) < n {
						// A window from the last committed token: the true
						// continuation, wrong at one row in three windows.
						pos := len(prompt) + len(got) - 1
						nd := min(k, n-len(got))
						draft := slices.Clone(want[len(got) : len(got)+nd])
						if windows%3 == 1 {
							draft[windows%len(draft)] = (draft[windows%len(draft)] + 1) % int32(m.Info().NVocab)
						}
						rows := append([]int32{got[len(got)-1]}, draft...)
						if look && len(rows) > 1 {
							rows = rows[:len(rows)-1] // the last proposal rides as the lookahead
						}
						out, err := x.Forward(ctx, Input{Pos: pos, Tokens: rows, Verify: true, Draft: draft})
						if err != nil {
							t.Fatal(err)
						}
						windows++
						if len(out.Tokens) == 0 || len(out.Tokens) > len(draft)+1 || out.Token != out.Tokens[len(out.Tokens)-1] {
							t.Fatalf("window %d: targets %v for draft %v", windows, out.Tokens, draft)
						}
						acc := len(out.Tokens)
						if acc > len(draft) || out.Tokens[acc-1] != draft[acc-1] {
							acc-- // the last target is a correction or a bonus
						}
						if !slices.Equal(out.Tokens[:acc], draft[:acc]) {
							t.Fatalf("window %d: accepted %v, not a prefix of draft %v", windows, out.Tokens[:acc], draft)
						}
						got = append(got, out.Tokens...)
						if len(got) > n {
							got = got[:n]
						}
						if !slices.Equal(got, want[:len(got)]) {
							t.Fatalf("k=%d lookahead=%v window %d: got %v, want %v", k, look, windows, got, want[:len(got)])
						}
						// Rows past the last committed input go.
						if err := x.Truncate(ctx, len(prompt)+len(got)-1); err != nil {
							t.Fatal(err)
						}
					}
					x.Close()
				}
			}
		})
	}
}

func TestVerifyBadInput(t *testing.T) {
	_, s := loadWhole(t, testmodels.Path(t, "stories260K.gguf"))
	sess, err := s.OpenSession(SessionKey{ID: [16]byte{9}}, SessionParams{KVTokens: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	for _, tc := range []struct {
		name string
		in   Input
	}{
		{"draft too long", Input{Tokens: []int32{1, 2}, Verify: true, Draft: []int32{3, 4, 5}}},
		{"draft too short", Input{Tokens: []int32{1, 2, 3}, Verify: true, Draft: []int32{3}}},
		{"draft without verify", Input{Tokens: []int32{1, 2}, Sample: true, Draft: []int32{3}}},
		{"verify with sample", Input{Tokens: []int32{1, 2}, Verify: true, Sample: true, Draft: []int32{3}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := sess.Forward(context.Background(), tc.in); !errors.Is(err, ErrBadInput) {
				t.Fatalf("err %v, want ErrBadInput", err)
			}
		})
	}
}
