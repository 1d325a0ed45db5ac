package engine

import "github.com/neuron-tai/meshp2p/proto/meshp2pb"

// SamplingFromProto is the tail's sampling for a session's wire parameters
// (nil: greedy). The wire form, meshp2pb.SamplingParams, is the one
// representation from the CLI to the tail: `generate` builds it once, the
// swarm carries it in SessionOpen, and both the tail and `generate --local`
// turn it into Sampling here, so they sample alike.
func SamplingFromProto(sp *meshp2pb.SamplingParams) Sampling {
	if sp == nil {
		return Sampling{}
	}
	return Sampling{Temperature: sp.GetTemperature(), TopK: sp.GetTopK(), TopP: sp.GetTopP(), MinP: sp.GetMinP(),
		RepeatPenalty: sp.GetRepeatPenalty(), RepeatLastN: sp.GetRepeatLastN(), Seed: sp.GetSeed(),
		FrequencyPenalty: sp.GetFrequencyPenalty(), PresencePenalty: sp.GetPresencePenalty(),
		Grammar: sp.GetGrammar(), Logprobs: sp.GetLogprobs(), TopLogprobs: int(min(sp.GetTopLogprobs(), MaxTopLogprobs+1))}
}
