package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/route"
	"github.com/neuron-tai/meshp2p/session"
	"github.com/neuron-tai/meshp2p/toolcall"
)

// Request is one generation.
type Request struct {
	// Model is a network name, fingerprint or unique fingerprint prefix.
	Model string
	// Wait bounds how long the model's discovery is waited for (0:
	// DefaultWait). With WaitForRoute it also waits for a known model's
	// missing layers (`generate`: nodes may still be starting, Resolve),
	// until the swarm's adverts show nobody serves them; without, those
	// are reported at once (the API, Lookup).
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
	// Tools the model may call (Prompt.Tools are rendered; these decide
	// parsing and forcing). While they are active, text that is a call
	// goes to OnToolCall, never to OnText; Result.ToolCalls has them all.
	Tools      Tools
	OnToolCall func(ToolCallDelta)
	// Format constrains the text to JSON by a grammar the tail enforces.
	Format Format
	// CacheNamespace separates the prefix caches of this client's users
	// (session.GenerateRequest.CacheNamespace; "": the client's own).
	CacheNamespace string
	// Standby asks for a hot standby of one hop, NoStandby refuses the one
	// a long prompt gets (session.GenerateRequest).
	Standby, NoStandby bool
	// Logprobs asks the tail for each token's log-probability and
	// TopLogprobs alternatives; OnLogprob gets them in token order.
	Logprobs    bool
	TopLogprobs int
	OnLogprob   func(TokenLogprob)
}

// Result is what a generation produced.
type Result struct {
	Model        Model
	Text         string
	PromptTokens int
	// CachedTokens are the prompt tokens every hop reused from its prefix
	// cache (a conversation's earlier turns): not computed again.
	CachedTokens int
	// Tokens are the generated tokens (an end-of-generation token
	// included; tokens after a stop string's start included).
	Tokens []int32
	Finish string // FinishStop, FinishEOS, FinishLength
	// Stop is the stop string that ended the text (Finish FinishStop).
	Stop string
	// Session is the route session's report: route, re-routes and their
	// failures, hop timings, TTFT.
	Session    *session.Result
	FirstToken time.Time
	// ToolCalls are the calls parsed from the text (Request.Tools).
	ToolCalls []ToolCall
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
	m, err := c.resolveDemanded(ctx, req)
	if err != nil {
		return nil, err
	}
	v, err := c.Vocab(ctx, m.Fingerprint)
	if err != nil {
		return nil, err
	}
	prompt, format, err := req.Prompt.render(ctx, v)
	if err != nil {
		return nil, err
	}
	if limit := contextLimit(c.cfg.Table.Shards(m.Fingerprint), m.NLayer); limit > 0 && len(prompt)+req.MaxTokens+1 > limit {
		return nil, &ContextError{Model: m.ID, PromptTokens: len(prompt), MaxTokens: req.MaxTokens, Limit: limit}
	}
	// The grammar is built and compiled here, with the vocabulary, so a
	// bad one is refused before any hop is touched.
	grammar, err := grammarFor(v, req.Tools, req.Format, format)
	if err != nil {
		return nil, err
	}
	sampling, spec := req.samplingWith(grammar)
	onText := req.OnText
	var calls *callSplitter
	if req.Tools.active() {
		calls = newCallSplitter(format, req.Tools.List, orNop(onText), req.OnToolCall)
		onText = calls.write
	}
	st := NewStream(v, req.Stops, onText)
	if calls != nil && format == toolcall.Mistral {
		// Mistral's [TOOL_CALLS] is a control token: its text must reach
		// the call parser.
		st.special = true
	}
	sreq := req.sessionRequest(m, v, prompt, sampling, spec, st)
	sres, err := c.cfg.Origin.Generate(ctx, sreq)
	st.End()
	c.countSession(m.Fingerprint, sres, err)
	out := &Result{Model: m, Text: st.Text(), PromptTokens: len(prompt), Tokens: st.Tokens(), Finish: st.Finish(req.MaxTokens),
		Session: sres, FirstToken: st.FirstToken(), Stop: st.Stop()}
	if sres != nil {
		out.CachedTokens = sres.CachedTokens
	}
	if calls != nil {
		calls.close()
		out.ToolCalls = calls.calls
	}
	if sres != nil && sres.Reroutes > 0 {
		c.log.Warn("generation re-routed", "model", m.ID, "reroutes", sres.Reroutes, "failures", sres.Failures)
	}
	if err != nil && ctx.Err() != nil {
		err = ctx.Err()
	}
	return out, err
}

// resolveDemanded resolves req's model (Request.Wait, WaitForRoute) and
// counts the request as demand: refused, when it does not resolve.
func (c *Client) resolveDemanded(ctx context.Context, req Request) (Model, error) {
	wait := req.Wait
	if wait <= 0 {
		wait = DefaultWait
	}
	m, counted, err := c.resolveCounted(ctx, req.Model, wait, req.WaitForRoute)
	if err != nil {
		if !counted {
			c.countRefused(req.Model, err)
		}
		return m, err
	}
	if !counted {
		c.cfg.Demand.Request(m.Fingerprint)
	}
	return m, nil
}

// samplingWith is the sampling and speculation the route session gets:
// req's, or, with a grammar or log-probabilities, a copy carrying them
// and no speculation.
func (req *Request) samplingWith(grammar string) (*meshp2pb.SamplingParams, *meshp2pb.Speculation) {
	if grammar == "" && !req.Logprobs {
		return req.Sampling, req.Speculation
	}
	sampling := proto.Clone(orGreedy(req.Sampling)).(*meshp2pb.SamplingParams)
	sampling.Grammar, sampling.Logprobs, sampling.TopLogprobs = grammar, req.Logprobs, uint32(max(req.TopLogprobs, 0))
	// Windows of proposals carry no log-probabilities, and a grammar
	// would have to be rolled back over rejected ones: both run token by
	// token.
	return sampling, nil
}

// sessionRequest is the route session's request for req on model m,
// its tokens going to st and its log-probabilities and routes to req's
// callbacks.
func (req *Request) sessionRequest(m Model, v Vocab, prompt []int32, sampling *meshp2pb.SamplingParams, spec *meshp2pb.Speculation, st *Stream) session.GenerateRequest {
	sreq := session.GenerateRequest{Fingerprint: m.Fingerprint, NLayer: m.NLayer, Prompt: prompt, MaxTokens: req.MaxTokens,
		Sampling: sampling, WireDType: req.WireDType, Speculation: spec, OnToken: st.Token, CacheNamespace: req.CacheNamespace, Standby: req.Standby, NoStandby: req.NoStandby}
	if req.OnLogprob != nil && req.Logprobs {
		sreq.OnLogprobs = func(tok int32, lp *meshp2pb.TokenLogprobs) {
			// An end-of-generation token is not text: no entry for it.
			if !v.IsEOG(tok) && !st.Stopped() {
				req.OnLogprob(tokenLogprob(v, tok, lp))
			}
		}
	}
	if req.OnRoute != nil {
		sreq.OnRoute = func(rt *route.Route, reroutes int) { req.OnRoute(m, rt, reroutes) }
	}
	return sreq
}

// countRefused counts a request refused before any route (no route,
// warming, warming gave up: still demand, which is what makes an offering
// peer load the model once it can) for the model it named, when the name
// resolves.
func (c *Client) countRefused(model string, err error) {
	if c.cfg.Demand == nil || !(errors.Is(err, route.ErrNoRoute) || isWarming(err) || errors.Is(err, ErrWarmingGaveUp)) {
		return
	}
	if fp, ferr := c.cfg.Table.Fingerprint(model); ferr == nil {
		c.cfg.Demand.Request(fp)
		c.cfg.Demand.Refused(fp)
	}
}

// countSession counts what a route session says about demand: the tokens
// it generated, whether it waited for room (queued) and whether it ended
// for lack of capacity or route (refused).
func (c *Client) countSession(fp string, res *session.Result, err error) {
	if res != nil {
		c.cfg.Demand.Tokens(fp, len(res.Tokens))
		if res.CapacityRetries > 0 {
			c.cfg.Demand.Queued(fp)
		}
	}
	if err != nil && (errors.Is(err, route.ErrNoRoute) || frame.Code(err) == meshp2pb.ErrorCode_ERROR_CODE_NO_CAPACITY) {
		c.cfg.Demand.Refused(fp)
	}
}

// MaxTopLogprobs bounds the alternatives reported per token (a tail may
// send no more; more are dropped).
const MaxTopLogprobs = 20

func orGreedy(sp *meshp2pb.SamplingParams) *meshp2pb.SamplingParams {
	if sp == nil {
		return &meshp2pb.SamplingParams{}
	}
	return sp
}

func orNop(f func(string)) func(string) {
	if f == nil {
		return func(string) {}
	}
	return f
}

// tokenLogprob gives a token's log-probabilities their text.
func tokenLogprob(v Vocab, tok int32, lp *meshp2pb.TokenLogprobs) TokenLogprob {
	piece := func(t int32) string {
		s, _ := v.TokenPiece(t, true)
		return s
	}
	out := TokenLogprob{Token: piece(tok), Logprob: lp.GetLogprob()}
	out.Bytes = []byte(out.Token)
	tl := lp.GetTopLogprobs()
	for i, t := range lp.GetTopTokens() {
		if i >= len(tl) || i >= MaxTopLogprobs {
			break
		}
		s := piece(t)
		out.Top = append(out.Top, TopLogprob{Token: s, Bytes: []byte(s), Logprob: tl[i]})
	}
	return out
}
