package engine

import "github.com/neuron-tai/meshp2p/proto/meshp2pb"

// SamplingFromProto is the tail's sampling for a session's wire parameters
// (nil: greedy).
func SamplingFromProto(sp *meshp2pb.SamplingParams) Sampling {
	if sp == nil {
		return Sampling{}
	}
	return Sampling{Temperature: sp.GetTemperature(), TopK: sp.GetTopK(), TopP: sp.GetTopP(), MinP: sp.GetMinP(),
		RepeatPenalty: sp.GetRepeatPenalty(), RepeatLastN: max(sp.GetRepeatLastN(), 0), Seed: uint64(sp.GetSeed())}
}
