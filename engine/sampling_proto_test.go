package engine

import (
	"errors"
	"testing"

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
