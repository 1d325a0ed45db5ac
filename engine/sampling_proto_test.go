package engine

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/neuron-tai/meshp2p/internal/testmodels"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

func TestSamplingFromProto(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      *meshp2pb.SamplingParams
		want    Sampling
		invalid bool
	}{
		{"nil is greedy", nil, Sampling{}, false},
		{"64-bit seed kept", &meshp2pb.SamplingParams{Temperature: 0.8, Seed: 1<<63 + 5}, Sampling{Temperature: 0.8, Seed: 1<<63 + 5}, false},
		{"repeat_last_n -1 is the whole context", &meshp2pb.SamplingParams{RepeatPenalty: 1.1, RepeatLastN: -1}, Sampling{RepeatPenalty: 1.1, RepeatLastN: -1}, false},
		{"repeat_last_n below -1", &meshp2pb.SamplingParams{RepeatLastN: -2}, Sampling{RepeatLastN: -2}, true},
	} {
		got := SamplingFromProto(tc.in)
		if got.Seed != tc.want.Seed || got.RepeatLastN != tc.want.RepeatLastN || got.Temperature != tc.want.Temperature || got.RepeatPenalty != tc.want.RepeatPenalty {
			t.Errorf("%s: got %+v, want %+v", tc.name, got, tc.want)
		}
		if err := got.validate(); (err != nil) != tc.invalid || (err != nil && !errors.Is(err, ErrBadInput)) {
			t.Errorf("%s: validate = %v", tc.name, err)
		}
	}
}

// OpenAI's frequency and presence penalties reach llama.cpp's penalty
// sampler: on a model that repeats itself, greedy output changes with
// either, and the wire form carries both.
func TestPenaltiesChangeGreedyOutput(t *testing.T) {
	got := SamplingFromProto(&meshp2pb.SamplingParams{FrequencyPenalty: 1.5, PresencePenalty: -0.5})
	if got.FrequencyPenalty != 1.5 || got.PresencePenalty != -0.5 || got.validate() != nil {
		t.Fatalf("penalties lost: %+v", got)
	}
	if (Sampling{FrequencyPenalty: 2.5}).validate() == nil || (Sampling{PresencePenalty: -3}).validate() == nil {
		t.Fatal("penalties outside [-2,2] accepted")
	}
	ctx := context.Background()
	m, err := LoadModel(ctx, testmodels.Path(t, "stories260K.gguf"), LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	sh, err := NewShard(ctx, m, Config{NCtx: 256, NBatch: 64, MaxSessions: 1, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Close()
	prompt, err := m.Tokenize("Once upon a time", true, false)
	if err != nil {
		t.Fatal(err)
	}
	run := func(s Sampling) string {
		res, err := RunChain(ctx, []*Shard{sh}, prompt, ChainOptions{Steps: 63, Chunk: 64, Sampling: s})
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprint(res.Tokens)
	}
	plain := run(Sampling{})
	freq, pres := run(Sampling{FrequencyPenalty: 1.5, RepeatLastN: -1}), run(Sampling{PresencePenalty: 1.5, RepeatLastN: -1})
	if freq == plain || pres == plain {
		t.Fatalf("penalties did not change greedy output:\nplain %s\nfreq  %s\npres  %s", plain, freq, pres)
	}
	if again := run(Sampling{FrequencyPenalty: 1.5, RepeatLastN: -1}); again != freq {
		t.Fatal("penalised greedy output is not deterministic")
	}
}
