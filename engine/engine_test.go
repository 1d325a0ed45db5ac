package engine

import (
	"context"
	"errors"
	"testing"

	"github.com/neuron-tai/meshp2p/internal/testmodels"
)

func loadWhole(t testing.TB, path string) (*Model, *Shard) {
	t.Helper()
	m, err := LoadModel(context.Background(), path, LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	s, err := NewShard(context.Background(), m, Config{NCtx: 512, NBatch: 64, MaxSessions: 4, Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return m, s
}

func TestWholeModelGreedyIsDeterministic(t *testing.T) {
	m, s := loadWhole(t, testmodels.Path(t, "stories260K.gguf"))
	prompt, err := m.Tokenize("Once upon a time", true, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(prompt) < 3 || prompt[0] != m.BOS() {
		t.Fatalf("tokenize: %v (bos %d)", prompt, m.BOS())
	}
	run := func(key byte) []int32 {
		sess, err := s.OpenSession(SessionKey{ID: [16]byte{key}}, SessionParams{KVTokens: 64})
		if err != nil {
			t.Fatal(err)
		}
		defer sess.Close()
		out, err := sess.Forward(context.Background(), Input{Pos: 0, Tokens: prompt, Sample: true})
		if err != nil {
			t.Fatal(err)
		}
		toks := []int32{out.Token}
		for i := 0; i < 16; i++ {
			out, err = sess.Forward(context.Background(), Input{Pos: len(prompt) + i, Tokens: []int32{toks[len(toks)-1]}, Sample: true})
			if err != nil {
				t.Fatal(err)
			}
			toks = append(toks, out.Token)
		}
		return toks
	}
	a, b := run(1), run(2)
	if len(a) != len(b) {
		t.Fatal("length differs")
	}
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("greedy runs differ at %d: %v vs %v", i, a, b)
		}
	}
	text, err := m.Detokenize(a)
	if err != nil || text == "" {
		t.Fatalf("detokenize: %q %v", text, err)
	}
	t.Logf("generated: %q", text)
}

func TestAdmissionAndBadInput(t *testing.T) {
	_, s := loadWhole(t, testmodels.Path(t, "stories260K.gguf"))
	var open []*Session
	for i := range 4 {
		sess, err := s.OpenSession(SessionKey{ID: [16]byte{byte(i)}}, SessionParams{KVTokens: 64})
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, sess)
	}
	if _, err := s.OpenSession(SessionKey{ID: [16]byte{9}}, SessionParams{KVTokens: 8}); !errors.Is(err, ErrNoCapacity) {
		t.Fatalf("5th session: got %v, want ErrNoCapacity", err)
	}
	if _, err := s.OpenSession(SessionKey{ID: [16]byte{0}}, SessionParams{}); !errors.Is(err, ErrSessionExists) {
		t.Fatalf("duplicate: got %v", err)
	}
	ctx := context.Background()
	cases := []struct {
		name string
		in   Input
	}{
		{"hidden on head", Input{Hidden: make([]float32, 64)}},
		{"token out of vocab", Input{Tokens: []int32{1 << 20}}},
		{"negative token", Input{Tokens: []int32{-1}}},
		{"no rows", Input{Tokens: []int32{}}},
		{"wrong position", Input{Pos: 5, Tokens: []int32{1}}},
		{"beyond reservation", Input{Tokens: make([]int32, 65)}},
	}
	for _, c := range cases {
		if _, err := open[0].Forward(ctx, c.in); !errors.Is(err, ErrBadInput) && !errors.Is(err, ErrNoCapacity) {
			t.Errorf("%s: got %v", c.name, err)
		}
	}
	// The session still works after rejected input.
	if _, err := open[0].Forward(ctx, Input{Tokens: []int32{1, 2}, Sample: true}); err != nil {
		t.Fatal(err)
	}
	open[1].Close()
	if c := s.Capacity(); c.FreeSessions != 1 {
		t.Fatalf("capacity after close: %+v", c)
	}
	if _, err := s.OpenSession(SessionKey{ID: [16]byte{9}}, SessionParams{KVTokens: 64}); err != nil {
		t.Fatalf("slot not reused: %v", err)
	}
}
