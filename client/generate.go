package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/route"
	"github.com/neuron-tai/meshp2p/session"
)

// Request is one generation.
type Request struct {
	// Model is a network name, fingerprint or unique fingerprint prefix.
	Model string
	// Wait bounds how long the model's discovery is waited for (0:
	// DefaultWait). With WaitForRoute it also waits for a known model's
	// missing layers (`generate`: nodes may still be starting, Resolve);
	// without, those are reported at once (the API, Lookup).
	Wait         time.Duration
	WaitForRoute bool
	Prompt       Prompt
	// MaxTokens is the most tokens to generate (required, > 0).
	MaxTokens int
	// Sampling is the one sampling representation, from here to the tail
	// (nil: greedy).
	Sampling *meshp2pb.SamplingParams
	// Stops end the text at the first of them (never emitted).
	Stops     []string
	WireDType meshp2pb.DType
	// Speculation asks the route's head to propose tokens and verify them
	// several per pass (ParseSpeculation; nil: off). The tokens are the
	// same either way.
	Speculation *meshp2pb.Speculation
	// OnText gets the text that became final after every token ("" when
	// nothing did) and the rest at the end: concatenated, it is
	// Result.Text. Called from one goroutine.
	OnText func(delta string)
	// OnRoute sees each route the generation runs on: the first, then one
	// per re-route or capacity retry, with the re-routes so far.
	OnRoute func(m Model, rt *route.Route, reroutes int)
}

// Result is what a generation produced.
type Result struct {
	Model        Model
	Text         string
	PromptTokens int
	// Tokens are the generated tokens (an end-of-generation token
	// included; tokens after a stop string's start included).
	Tokens []int32
	Finish string // FinishStop, FinishEOS, FinishLength
	// Session is the route session's report: route, re-routes and their
	// failures, hop timings, TTFT.
	Session    *session.Result
	FirstToken time.Time
}

// Generate runs req through the swarm: resolves the model, gets its
// vocabulary, renders and tokenizes the prompt, checks the context the
// peers offer, and runs a route session (session.Origin plans, re-routes
// around failed hops and waits for room on full ones). The result is
// returned with an error too when some tokens were generated.
func (c *Client) Generate(ctx context.Context, req Request) (*Result, error) {
	if c.cfg.Origin == nil {
		return nil, errors.New("client: Config needs Origin to generate")
	}
	if req.MaxTokens <= 0 {
		return nil, fmt.Errorf("client: max_tokens must be positive, got %d", req.MaxTokens)
	}
	wait := req.Wait
	if wait <= 0 {
		wait = DefaultWait
	}
	m, err := c.resolve(ctx, req.Model, wait, req.WaitForRoute)
	if err != nil {
		return nil, err
	}
	v, err := c.Vocab(ctx, m.Fingerprint)
	if err != nil {
		return nil, err
	}
	prompt, err := req.Prompt.Tokens(v)
	if err != nil {
		return nil, err
	}
	if limit := contextLimit(c.cfg.Table.Shards(m.Fingerprint), m.NLayer); limit > 0 && len(prompt)+req.MaxTokens+1 > limit {
		return nil, &ContextError{Model: m.ID, PromptTokens: len(prompt), MaxTokens: req.MaxTokens, Limit: limit}
	}
	st := NewStream(v, req.Stops, req.OnText)
	sreq := session.GenerateRequest{Fingerprint: m.Fingerprint, NLayer: m.NLayer, Prompt: prompt, MaxTokens: req.MaxTokens,
		Sampling: req.Sampling, WireDType: req.WireDType, Speculation: req.Speculation, OnToken: st.Token}
	if req.OnRoute != nil {
		sreq.OnRoute = func(rt *route.Route, reroutes int) { req.OnRoute(m, rt, reroutes) }
	}
	sres, err := c.cfg.Origin.Generate(ctx, sreq)
	st.End()
	out := &Result{Model: m, Text: st.Text(), PromptTokens: len(prompt), Tokens: st.Tokens(), Finish: st.Finish(req.MaxTokens),
		Session: sres, FirstToken: st.FirstToken()}
	if sres != nil && sres.Reroutes > 0 {
		c.log.Warn("generation re-routed", "model", m.ID, "reroutes", sres.Reroutes, "failures", sres.Failures)
	}
	if err != nil && ctx.Err() != nil {
		err = ctx.Err()
	}
	return out, err
}
