package engine

/*
#include <stdlib.h>
#include "mp.h"
*/
import "C"

import (
	"fmt"
	"math"
	"sync/atomic"
	"time"
	"unsafe"
)

// Sampling configures token selection on the tail. Filtering (penalties,
// top-k, top-p, min-p, temperature) runs through llama.cpp's sampler chain;
// the final random draw uses a generator keyed on (Seed, step), so a
// session re-created after a reroute draws exactly the same numbers.
type Sampling struct {
	Temperature   float32 // <= 0: greedy
	TopK          int32   // 0: off
	TopP          float32 // 0 or 1: off
	MinP          float32 // 0: off
	RepeatPenalty float32 // 0 or 1: off
	RepeatLastN   int32   // tokens the penalties look back: 0 = DefaultRepeatLastN, -1 = the shard's n_ctx (all of the session)
	// FrequencyPenalty and PresencePenalty (OpenAI's, in [-2, 2]; 0: off)
	// subtract count × frequency and, once a token appeared, presence from
	// its logit, over the same window as RepeatPenalty.
	FrequencyPenalty float32
	PresencePenalty  float32
	Seed             uint64
	// Generated are tokens this session already produced (after a reroute):
	// they feed the repetition penalty, rebuild the grammar's state and
	// offset the draw counter.
	Generated []int32
	// Grammar (GBNF, root rule "root"; "": none) constrains every token:
	// those it forbids are never drawn, end-of-generation only where it
	// may end (grammar.go bounds its size and cost).
	Grammar string
	// Logprobs asks for each sampled token's log-probability and
	// TopLogprobs (at most MaxTopLogprobs) alternatives, from the raw
	// logits that chose it (before penalties, grammar and filters).
	Logprobs    bool
	TopLogprobs int
}

// MaxTopLogprobs bounds Sampling.TopLogprobs.
const MaxTopLogprobs = 20

// TokenLogprob is a sampled token's log-probability (natural log, under
// the model's raw distribution) and the most likely tokens at its step.
type TokenLogprob struct {
	Logprob float32
	Top     []TokenProb // most likely first
}

// TokenProb is one token and its log-probability.
type TokenProb struct {
	Token   int32
	Logprob float32
}

func (p Sampling) validate() error {
	switch {
	case math.IsNaN(float64(p.Temperature)) || p.Temperature > 100:
		return fmt.Errorf("%w: temperature %v", ErrBadInput, p.Temperature)
	case p.TopK < 0:
		return fmt.Errorf("%w: top_k %d", ErrBadInput, p.TopK)
	case !(p.TopP >= 0 && p.TopP <= 1):
		return fmt.Errorf("%w: top_p %v outside [0,1]", ErrBadInput, p.TopP)
	case !(p.MinP >= 0 && p.MinP <= 1):
		return fmt.Errorf("%w: min_p %v outside [0,1]", ErrBadInput, p.MinP)
	case !(p.RepeatPenalty >= 0 && p.RepeatPenalty <= 10):
		return fmt.Errorf("%w: repeat_penalty %v outside [0,10]", ErrBadInput, p.RepeatPenalty)
	case !(p.FrequencyPenalty >= -2 && p.FrequencyPenalty <= 2):
		return fmt.Errorf("%w: frequency_penalty %v outside [-2,2]", ErrBadInput, p.FrequencyPenalty)
	case !(p.PresencePenalty >= -2 && p.PresencePenalty <= 2):
		return fmt.Errorf("%w: presence_penalty %v outside [-2,2]", ErrBadInput, p.PresencePenalty)
	case p.RepeatLastN < -1 || p.RepeatLastN > 1<<16:
		return fmt.Errorf("%w: repeat_last_n %d", ErrBadInput, p.RepeatLastN)
	case p.TopLogprobs < 0 || p.TopLogprobs > MaxTopLogprobs:
		return fmt.Errorf("%w: top_logprobs %d outside [0,%d]", ErrBadInput, p.TopLogprobs, MaxTopLogprobs)
	case len(p.Grammar) > MaxGrammarBytes:
		return fmt.Errorf("%w: grammar of %d bytes, more than the %d allowed", ErrBadInput, len(p.Grammar), MaxGrammarBytes)
	}
	return nil
}

type sampler struct {
	p     Sampling
	chain *C.struct_llama_sampler // nil when no filter is active
	gram  *grammar                // nil without a grammar
	step  uint64
	// gramTime is the time the grammar took so far (MaxGrammarTime);
	// spent is the same, readable from other goroutines (GrammarTime).
	gramTime time.Duration
	spent    atomic.Int64
}

// DefaultRepeatLastN is the penalty window when none is given (llama.cpp's
// default).
const DefaultRepeatLastN = 64

// newSampler builds the tail's sampler; nCtx is the shard's context size
// (RepeatLastN -1 looks back over all of it: the whole session).
func newSampler(m *Model, p Sampling, nCtx int) (*sampler, error) {
	smp := &sampler{p: p, step: uint64(len(p.Generated))}
	cp := C.llama_sampler_chain_default_params()
	cp.no_perf = true
	chain := C.llama_sampler_chain_init(cp)
	n := 0
	repeat := p.RepeatPenalty
	if repeat <= 0 {
		repeat = 1
	}
	if repeat != 1 || p.FrequencyPenalty != 0 || p.PresencePenalty != 0 {
		last := p.RepeatLastN
		switch {
		case last == 0:
			last = DefaultRepeatLastN
		case last < 0:
			last = int32(nCtx)
		}
		C.llama_sampler_chain_add(chain, C.llama_sampler_init_penalties(C.int32_t(last), C.float(repeat), C.float(p.FrequencyPenalty), C.float(p.PresencePenalty)))
		n++
	}
	if p.Temperature > 0 {
		if p.TopK > 0 {
			C.llama_sampler_chain_add(chain, C.llama_sampler_init_top_k(C.int32_t(p.TopK)))
			n++
		}
		if p.TopP > 0 && p.TopP < 1 {
			C.llama_sampler_chain_add(chain, C.llama_sampler_init_top_p(C.float(p.TopP), 1))
			n++
		}
		if p.MinP > 0 {
			C.llama_sampler_chain_add(chain, C.llama_sampler_init_min_p(C.float(p.MinP), 1))
			n++
		}
		C.llama_sampler_chain_add(chain, C.llama_sampler_init_temp(C.float(p.Temperature)))
		n++
	}
	if n == 0 {
		C.llama_sampler_free(chain)
	} else {
		smp.chain = chain
		for _, t := range p.Generated {
			C.llama_sampler_accept(chain, C.llama_token(t))
		}
	}
	if p.Grammar != "" {
		g, err := newGrammar(m, p.Grammar)
		if err != nil {
			smp.free()
			return nil, err
		}
		smp.gram = g
		// A re-routed session's grammar is where its tokens so far left it.
		for i, t := range p.Generated {
			if err := g.accept(t); err != nil {
				smp.free()
				return nil, fmt.Errorf("replaying generated token %d of %d: %w", i, len(p.Generated), err)
			}
		}
	}
	return smp, nil
}

func (smp *sampler) free() {
	if smp.chain != nil {
		C.llama_sampler_free(smp.chain)
		smp.chain = nil
	}
	smp.gram.free()
	smp.gram = nil
}

// sample picks a token from logits (and its log-probabilities when
// asked); cands is scratch of n_vocab entries. An error (ErrGrammar) fails
// the session: its grammar allows no token or costs too much.
func (smp *sampler) sample(cands []C.llama_token_data, logits []float32) (int32, *TokenLogprob, error) {
	step := smp.step
	smp.step++
	var tok int32
	if smp.chain == nil && smp.gram == nil {
		tok = argmax(logits)
	} else {
		for i, l := range logits {
			cands[i] = C.llama_token_data{id: C.llama_token(i), logit: C.float(l), p: 0}
		}
		arr := C.llama_token_data_array{data: &cands[0], size: C.size_t(len(logits)), selected: -1, sorted: false}
		if smp.gram != nil {
			t0 := time.Now()
			err := smp.gram.apply(&arr)
			smp.gramTime += time.Since(t0)
			smp.spent.Store(int64(smp.gramTime))
			if err == nil && smp.gramTime > MaxGrammarTime {
				err = fmt.Errorf("%w: the grammar took %v of the tail's time, more than the %v allowed per session", ErrGrammar, smp.gramTime.Round(time.Millisecond), MaxGrammarTime)
			}
			if err != nil {
				return 0, nil, err
			}
		}
		if smp.chain != nil {
			C.llama_sampler_apply(smp.chain, &arr)
		}
		view := cands[:arr.size]
		if arr.data != &cands[0] {
			view = unsafeTokenData(arr.data, int(arr.size))
		}
		best := -1
		for i := range view {
			if !math.IsInf(float64(view[i].logit), -1) && (best < 0 || view[i].logit > view[best].logit) {
				best = i
			}
		}
		if best < 0 {
			return 0, nil, fmt.Errorf("%w: no token is allowed at step %d", ErrGrammar, step)
		}
		if smp.p.Temperature <= 0 {
			tok = int32(view[best].id)
		} else {
			tok = draw(view, rand01(smp.p.Seed, step))
		}
		if smp.chain != nil {
			C.llama_sampler_accept(smp.chain, C.llama_token(tok))
		}
		if smp.gram != nil {
			if err := smp.gram.accept(tok); err != nil {
				return 0, nil, err
			}
		}
	}
	if !smp.p.Logprobs {
		return tok, nil, nil
	}
	return tok, logprobOf(logits, tok, smp.p.TopLogprobs), nil
}

// logprobOf is tok's log-probability under softmax(logits) and the top
// most likely tokens (ties: the lower id first).
func logprobOf(logits []float32, tok int32, top int) *TokenLogprob {
	maxL := math.Inf(-1)
	for _, l := range logits {
		maxL = math.Max(maxL, float64(l))
	}
	sum := 0.0
	for _, l := range logits {
		sum += math.Exp(float64(l) - maxL)
	}
	norm := maxL + math.Log(sum)
	out := &TokenLogprob{Logprob: float32(float64(logits[tok]) - norm)}
	if top <= 0 {
		return out
	}
	best := make([]TokenProb, 0, top+1)
	for i, l := range logits {
		if len(best) == top && l <= best[top-1].Logprob {
			continue
		}
		j := len(best)
		best = append(best, TokenProb{})
		for j > 0 && best[j-1].Logprob < l {
			best[j] = best[j-1]
			j--
		}
		best[j] = TokenProb{Token: int32(i), Logprob: l}
		if len(best) > top {
			best = best[:top]
		}
	}
	for i := range best {
		best[i].Logprob = float32(float64(best[i].Logprob) - norm)
	}
	out.Top = best
	return out
}

func argmax(v []float32) int32 {
	best := 0
	for i := range v {
		if v[i] > v[best] {
			best = i
		}
	}
	return int32(best)
}

// draw samples from softmax(logit) over view with u in [0,1).
func draw(view []C.llama_token_data, u float64) int32 {
	maxL := math.Inf(-1)
	for _, c := range view {
		maxL = math.Max(maxL, float64(c.logit))
	}
	sum := 0.0
	for _, c := range view {
		if !math.IsInf(float64(c.logit), -1) {
			sum += math.Exp(float64(c.logit) - maxL)
		}
	}
	target := u * sum
	acc := 0.0
	for _, c := range view {
		if math.IsInf(float64(c.logit), -1) {
			continue
		}
		acc += math.Exp(float64(c.logit) - maxL)
		if acc > target {
			return int32(c.id)
		}
	}
	return int32(view[len(view)-1].id)
}

// rand01 is splitmix64 keyed on (seed, step): a uniform value in [0,1).
func rand01(seed, step uint64) float64 {
	z := seed + 0x9E3779B97F4A7C15*(step+1)
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	z ^= z >> 31
	return float64(z>>11) / float64(1<<53)
}

func unsafeTokenData(p *C.llama_token_data, n int) []C.llama_token_data {
	return unsafe.Slice(p, n)
}
