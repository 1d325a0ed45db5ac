package api

import (
	"context"
	"errors"

	"github.com/neuron-tai/meshp2p/client"
	"github.com/neuron-tai/meshp2p/p2p"
	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/route"
	"github.com/neuron-tai/meshp2p/session"
)

// SwarmConfig configures Swarm.
type SwarmConfig struct {
	// MaxTokens is the default max_tokens of chat requests (0:
	// DefaultChatMaxTokens; completions default to
	// DefaultCompletionMaxTokens, as OpenAI's).
	MaxTokens int
	// WireDType between hops (0: f32, bit-exact).
	WireDType meshp2pb.DType
	// Speculation for every request (client.ParseSpeculation; nil: off).
	// The output is the same either way.
	Speculation *meshp2pb.Speculation
}

// Swarm is the Backend over the swarm: every request runs through a
// client.Client (model resolution by name, fingerprint or prefix — never a
// file —, vocabulary, chat template, text, re-routes), and its errors
// become OpenAI error objects here, the only place that builds them.
type Swarm struct {
	c   *client.Client
	cfg SwarmConfig
}

var _ Backend = (*Swarm)(nil)

// NewSwarm returns the Backend over c.
func NewSwarm(c *client.Client, cfg SwarmConfig) *Swarm {
	if cfg.MaxTokens <= 0 {
		cfg.MaxTokens = DefaultChatMaxTokens
	}
	return &Swarm{c: c, cfg: cfg}
}

// Models lists what the swarm can route.
func (b *Swarm) Models(context.Context) ([]Model, error) {
	return b.c.Models(), nil
}

// Generate runs one request through the swarm.
func (b *Swarm) Generate(ctx context.Context, req *GenerateRequest, onDelta func(Delta)) (*GenerateResult, error) {
	onText := func(s string) { onDelta(Delta{Text: s}) }
	maxTok := req.MaxTokens
	if maxTok <= 0 {
		maxTok = b.cfg.MaxTokens
	}
	cr := client.Request{Model: req.Model, Wait: client.APIResolveWait, Prompt: client.Prompt{Text: req.Prompt},
		MaxTokens: maxTok, Sampling: req.sampling(), Stops: req.Stops, WireDType: b.cfg.WireDType, Speculation: b.cfg.Speculation, OnText: onText,
		Logprobs: req.Logprobs, TopLogprobs: req.TopLogprobs, Standby: req.Standby, NoStandby: req.NoStandby}
	if req.Messages != nil {
		cr.Prompt.Messages = req.Messages
	}
	if len(req.Tools) > 0 {
		tools := make([]client.Tool, len(req.Tools))
		for i, t := range req.Tools {
			tools[i] = t.Tool
		}
		cr.Prompt.Tools = tools
		cr.Tools = client.Tools{List: tools, Choice: req.ToolChoice.Mode, Function: req.ToolChoice.Name, Parallel: req.ParallelToolCalls}
		cr.OnToolCall = func(d client.ToolCallDelta) { onDelta(Delta{ToolCalls: []ToolCallDelta{d}}) }
	}
	switch req.Format.Type {
	case FormatJSONObject:
		cr.Format = client.Format{JSONObject: true}
	case FormatJSONSchema:
		cr.Format = client.Format{Schema: req.Format.Schema}
	}
	if req.Logprobs {
		cr.OnLogprob = func(lp client.TokenLogprob) { onDelta(Delta{Logprobs: []TokenLogprob{lp}}) }
	}
	if req.OnRoute != nil {
		cr.OnRoute = func(m client.Model, rt *route.Route, reroutes int) {
			req.OnRoute(RouteInfo{Model: m.ID, Fingerprint: m.Fingerprint, Hops: hops(rt), Reroutes: reroutes})
		}
	}
	res, err := b.c.Generate(ctx, cr)
	var out *GenerateResult
	if res != nil {
		out = &GenerateResult{Model: res.Model.ID, Fingerprint: res.Model.Fingerprint, PromptTokens: res.PromptTokens,
			CompletionTokens: len(res.Tokens), CachedTokens: res.CachedTokens, Length: res.Finish == client.FinishLength, Stop: res.Stop}
		out.ToolCalls = res.ToolCalls
		if s := res.Session; s != nil {
			out.Reroutes = s.Reroutes
			if s.Route != nil {
				out.Route = hops(s.Route)
			}
			if b.cfg.Speculation != nil {
				sp := s.Spec
				out.Speculation = &SpecInfo{Mode: client.SpecModeName(b.cfg.Speculation), Proposer: sp.Proposer, Windows: sp.Windows, Proposed: sp.Proposed,
					Accepted: sp.Accepted, AcceptedPerWindow: sp.AcceptedPerWindow(), K: sp.K, W: sp.W}
			}
		}
	}
	if err != nil {
		return out, swarmError(ctx, req, err)
	}
	return out, nil
}

// sampling is the request's SamplingParams: OpenAI's fields plus the
// llama.cpp-server extensions top_k, min_p and repeat_penalty.
func (r *GenerateRequest) sampling() *meshp2pb.SamplingParams {
	sp := &meshp2pb.SamplingParams{Temperature: r.Temperature, TopP: r.TopP, TopK: int32(r.TopK), MinP: r.MinP,
		RepeatPenalty: r.RepeatPenalty, Seed: r.Seed, FrequencyPenalty: r.FrequencyPenalty, PresencePenalty: r.PresencePenalty}
	if sp.FrequencyPenalty != 0 || sp.PresencePenalty != 0 {
		sp.RepeatLastN = -1 // OpenAI's penalties count the whole completion
	}
	return sp
}

func hops(rt *route.Route) []Hop {
	out := make([]Hop, len(rt.Hops))
	for i, h := range rt.Hops {
		out[i] = Hop{Peer: h.Peer.String(), Start: h.Start, End: h.End}
	}
	return out
}

// swarmError is the OpenAI error a client error becomes; errors of the
// request's own context pass through (the client left).
func swarmError(ctx context.Context, req *GenerateRequest, err error) error {
	model := req.Model
	var ce *client.ContextError
	var we *client.WarmingError
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case errors.Is(err, route.ErrAmbiguousModel):
		return BadRequest("model", "%v", err)
	case errors.As(err, &we):
		return Warming(we.RetryAfter, "%v", we)
	case errors.Is(err, client.ErrWarmingGaveUp):
		e := ModelNotFound(model)
		e.Message = err.Error()
		return e
	case errors.Is(err, client.ErrModelNotFound):
		return ModelNotFound(model)
	case errors.As(err, &ce):
		return BadRequest("max_tokens", "%v", ce)
	case errors.Is(err, client.ErrNoChatTemplate):
		return BadRequest("messages", "model %s has no chat template in its GGUF file: use /v1/completions with a prompt, or give the gateway one (--chat-template chatml or a Jinja file)", model)
	case errors.Is(err, client.ErrChatTemplate), errors.Is(err, client.ErrEmptyPrompt):
		return BadRequest("messages", "model %s: %v", model, err)
	case errors.Is(err, client.ErrGrammar):
		// The converter or the grammar compiler names what it refused.
		return BadRequest(grammarParam(req), "model %s: %v", model, err)
	case errors.Is(err, client.ErrNoGrammar):
		return BadRequest(grammarParam(req), "%v", err)
	case errors.Is(err, client.ErrNoVocab), errors.Is(err, client.ErrTooManyModels), errors.Is(err, p2p.ErrNoPeers):
		return Unavailable("model %s: %v", model, err)
	case errors.Is(err, route.ErrNoRoute):
		return Unavailable("model %s: %v", model, err)
	case frame.Code(err) == meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST:
		// A hop refused the request itself (e.g. more KV cells than it
		// gives one session).
		return BadRequest("max_tokens", "model %s: %v", model, err)
	case errors.Is(err, session.ErrGeneration) && frame.Code(err) != meshp2pb.ErrorCode_ERROR_CODE_UNSPECIFIED:
		// The swarm refused or failed it (a hop's report, e.g. a missing
		// route ticket), not this gateway: 503 with the report, not 500.
		return SwarmFailed("model %s: %v", model, err)
	}
	return err
}

// grammarParam is the field a grammar error blames.
func grammarParam(req *GenerateRequest) string {
	if len(req.Tools) > 0 && req.ToolChoice.Mode != ToolNone && req.Format.Type == "" {
		return "tools"
	}
	return "response_format"
}
