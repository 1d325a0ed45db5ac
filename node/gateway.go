package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/neuron-tai/meshp2p/api"
	"github.com/neuron-tai/meshp2p/engine"
	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/route"
	"github.com/neuron-tai/meshp2p/session"
)

// Gateway defaults.
const (
	// DefaultGatewayMaxTokens is a chat completion's length when the
	// request gives no max_tokens.
	DefaultGatewayMaxTokens = 512
	// GatewayResolveWait bounds how long a request for a model the table
	// does not know waits for discovery before it gets a 404.
	GatewayResolveWait = 3 * time.Second
	// GatewayWarmInterval is how often the gateway re-pulls adverts from
	// its peers, on top of gossip, to keep its table warm.
	GatewayWarmInterval = 30 * time.Second
	// maxGatewayVocabs bounds the vocabularies a gateway keeps loaded.
	maxGatewayVocabs = 32
)

// GatewayConfig configures a Gateway.
type GatewayConfig struct {
	// Planner plans routes (nil: the local planner over the node's table).
	Planner route.Planner
	// MaxTokens is the default max_tokens of chat requests (0:
	// DefaultGatewayMaxTokens).
	MaxTokens int
	// WireDType between hops (0: f32, bit-exact).
	WireDType meshp2pb.DType
	Logger    *slog.Logger
}

// Gateway serves the OpenAI-compatible API (api.Backend) through the
// swarm from a node that holds no weights: it resolves models from the
// node's capability table, fetches and verifies each model's vocabulary
// once, renders chats with the model's own chat template, and runs every
// request as a route session of the node's origin, which re-routes around
// hops that die.
type Gateway struct {
	n      *Node
	cfg    GatewayConfig
	log    *slog.Logger
	origin *session.Origin

	mu      sync.Mutex
	vocabs  map[string]*gatewayVocab
	created map[string]int64 // fingerprint → unix time first seen

	ctx    context.Context // ends at Close
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

type gatewayVocab struct {
	ready chan struct{}
	m     *engine.Model
	err   error
}

var _ api.Backend = (*Gateway)(nil)

// NewGateway returns a gateway over n (a client node: a host cannot open a
// route session to itself). Close it before n.
func NewGateway(n *Node, cfg GatewayConfig) *Gateway {
	if cfg.MaxTokens <= 0 {
		cfg.MaxTokens = DefaultGatewayMaxTokens
	}
	if cfg.Logger == nil {
		cfg.Logger = n.log
	}
	g := &Gateway{n: n, cfg: cfg, log: cfg.Logger, origin: n.Origin(cfg.Planner),
		vocabs: map[string]*gatewayVocab{}, created: map[string]int64{}}
	g.ctx, g.cancel = context.WithCancel(context.Background())
	g.wg.Add(1)
	go func() { defer g.wg.Done(); g.warm(g.ctx) }()
	return g
}

// Close stops the gateway and frees its vocabularies.
func (g *Gateway) Close() {
	g.cancel()
	g.wg.Wait()
	g.mu.Lock()
	defer g.mu.Unlock()
	for fp, v := range g.vocabs {
		if v.m != nil { // every fetch has ended (wg)
			v.m.Close()
		}
		delete(g.vocabs, fp)
	}
}

// warm keeps the capability table current beyond gossip: a periodic pull
// of the adverts every connected peer holds.
func (g *Gateway) warm(ctx context.Context) {
	t := time.NewTicker(GatewayWarmInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			sctx, cancel := context.WithTimeout(ctx, LookupTimeout)
			g.n.p2p.Discovery().Sync(sctx)
			cancel()
		}
	}
}

// Models lists every model whose layers the known peers cover, under its
// name (or its fingerprint when several models share a name).
func (g *Gateway) Models(context.Context) ([]api.Model, error) {
	byFP := map[string][]route.Shard{}
	for _, s := range g.n.table.Shards("") {
		byFP[s.Fingerprint] = append(byFP[s.Fingerprint], s)
	}
	names := map[string]int{}
	type cand struct {
		fp, name string
		nl       int
	}
	var cands []cand
	for fp, ss := range byFP {
		nl, err := g.n.table.LayerCount(fp)
		if err != nil || !covered(ss, nl) {
			continue
		}
		name := ss[0].ModelName
		cands = append(cands, cand{fp, name, nl})
		names[name]++
	}
	now := time.Now().Unix()
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]api.Model, 0, len(cands))
	for _, c := range cands {
		id := c.name
		if id == "" || names[c.name] > 1 {
			id = c.fp
		}
		if _, ok := g.created[c.fp]; !ok {
			g.created[c.fp] = now
		}
		out = append(out, api.Model{ID: id, Name: c.name, Fingerprint: c.fp, NLayer: c.nl, Created: g.created[c.fp]})
	}
	slices.SortFunc(out, func(a, b api.Model) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// contextLimit is the longest session (KV cells) any route over ss could
// hold: per layer the largest advertised n_ctx of a shard covering it, the
// least of those over the layers (0: unknown).
func contextLimit(ss []route.Shard, nl int) int {
	limit := 0
	for l := 0; l < nl; l++ {
		best := 0
		for _, s := range ss {
			if s.NLayer == nl && s.Start <= l && l < s.End {
				best = max(best, int(s.Capacity.GetNCtx()))
			}
		}
		if best == 0 {
			return 0
		}
		if limit == 0 || best < limit {
			limit = best
		}
	}
	return limit
}

// covered reports whether shards of one model chain from layer 0 to nl.
func covered(ss []route.Shard, nl int) bool {
	reach := map[int]bool{0: true}
	for changed := true; changed; {
		changed = false
		for _, s := range ss {
			if s.NLayer == nl && reach[s.Start] && !reach[s.End] {
				reach[s.End], changed = true, true
			}
		}
	}
	return nl > 0 && reach[nl]
}

// Generate runs one API request through the swarm.
func (g *Gateway) Generate(ctx context.Context, req *api.GenerateRequest, onText func(string) bool) (*api.GenerateResult, error) {
	fp, nl, err := g.resolve(ctx, req.Model)
	if err != nil {
		return nil, err
	}
	id := g.modelID(fp)
	// Layers nobody serves: say which before fetching anything. (Only
	// coverage: peers that are merely full now are the origin's to wait
	// for.)
	if !covered(g.n.table.Shards(fp), nl) {
		_, err := (&route.LocalPlanner{Table: g.n.table}).Plan(ctx, route.Request{Fingerprint: fp, NLayer: nl})
		if err == nil {
			err = fmt.Errorf("layers of %d not covered", nl)
		}
		return nil, api.Unavailable("model %s: %v", id, err)
	}
	vocab, err := g.vocab(ctx, fp)
	if err != nil {
		return nil, err
	}
	prompt, err := gatewayPrompt(vocab, req, id)
	if err != nil {
		return nil, err
	}
	maxTok := req.MaxTokens
	if maxTok <= 0 {
		maxTok = g.cfg.MaxTokens
	}
	if limit := contextLimit(g.n.table.Shards(fp), nl); limit > 0 && len(prompt)+maxTok+1 > limit {
		return nil, api.BadRequest("max_tokens", "prompt (%d tokens) + max_tokens (%d) exceed the %d-token context the peers serving model %s offer",
			len(prompt), maxTok, limit, id)
	}
	sp := &meshp2pb.SamplingParams{Temperature: req.Temperature, TopP: req.TopP, Seed: req.Seed,
		FrequencyPenalty: req.FrequencyPenalty, PresencePenalty: req.PresencePenalty}
	if sp.FrequencyPenalty != 0 || sp.PresencePenalty != 0 {
		sp.RepeatLastN = -1 // OpenAI's penalties count the whole completion
	}
	out := &api.GenerateResult{Model: id, Fingerprint: fp, PromptTokens: len(prompt)}
	sreq := session.GenerateRequest{Fingerprint: fp, NLayer: nl, Prompt: prompt, MaxTokens: maxTok,
		Sampling: sp, WireDType: g.cfg.WireDType,
		OnRoute: func(rt *route.Route, reroutes int) {
			if req.OnRoute != nil {
				req.OnRoute(api.RouteInfo{Model: id, Fingerprint: fp, Hops: apiHops(rt), Reroutes: reroutes})
			}
		},
		OnToken: func(tok int32) bool {
			if vocab.IsEOG(tok) {
				return false
			}
			piece, err := vocab.TokenPiece(tok, false)
			if err != nil {
				return false
			}
			return onText(piece)
		}}
	res, err := g.generateWhenRoom(ctx, sreq)
	if res != nil {
		out.CompletionTokens, out.Reroutes, out.Length = len(res.Tokens), res.Reroutes, res.Stop == "max_tokens"
		if res.Route != nil {
			out.Route = apiHops(res.Route)
		}
		if res.Reroutes > 0 {
			g.log.Warn("api generation re-routed", "model", id, "reroutes", res.Reroutes, "failures", res.Failures)
		}
	}
	switch {
	case err == nil:
		return out, nil
	case ctx.Err() != nil:
		return out, ctx.Err()
	case errors.Is(err, route.ErrNoRoute):
		return out, api.Unavailable("model %s: %v", id, err)
	case frame.Code(err) == meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST:
		// A hop refused the request itself (e.g. more KV cells than it
		// gives one session).
		return out, api.BadRequest("max_tokens", "model %s: %v", id, err)
	case errors.Is(err, session.ErrGeneration) && frame.Code(err) != meshp2pb.ErrorCode_ERROR_CODE_UNSPECIFIED:
		// The swarm refused or failed it (a hop's report, e.g. a missing
		// route ticket), not this gateway: 503 with the report, not 500.
		return out, api.SwarmFailed("model %s: %v", id, err)
	}
	return out, err
}

// generateWhenRoom runs req, waiting while every peer covering a layer is
// full: the planner skips peers whose advert shows no free slot, which a
// burst of requests makes true for a moment (adverts follow within
// AdvertCheckInterval). Only a generation that produced nothing yet is
// retried, for up to session.DefaultCapacityWait.
func (g *Gateway) generateWhenRoom(ctx context.Context, req session.GenerateRequest) (*session.Result, error) {
	start, backoff := time.Now(), session.CapacityRetryMin
	for {
		res, err := g.origin.Generate(ctx, req)
		if err == nil || !errors.Is(err, route.ErrNoRoute) || (res != nil && len(res.Tokens) > 0) ||
			!covered(g.n.table.Shards(req.Fingerprint), req.NLayer) || time.Since(start) > session.DefaultCapacityWait {
			return res, err
		}
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, session.CapacityRetryMax)
	}
}

func apiHops(rt *route.Route) []api.Hop {
	hops := make([]api.Hop, len(rt.Hops))
	for i, h := range rt.Hops {
		hops[i] = api.Hop{Peer: h.Peer.String(), Start: h.Start, End: h.End}
	}
	return hops
}

// gatewayPrompt tokenizes a request as `generate` does: chats through the
// model's chat template (special tokens parsed), completions as plain text.
func gatewayPrompt(vocab *engine.Model, req *api.GenerateRequest, id string) ([]int32, error) {
	if req.Messages == nil {
		return vocab.Tokenize(req.Prompt, true, false)
	}
	msgs := make([]engine.ChatMessage, len(req.Messages))
	for i, m := range req.Messages {
		msgs[i] = engine.ChatMessage{Role: m.Role, Content: m.Content}
	}
	p, err := vocab.ApplyChatTemplate(msgs, true)
	if errors.Is(err, engine.ErrNoChatTemplate) {
		return nil, api.BadRequest("messages", "model %s has no chat template in its GGUF file: use /v1/completions with a prompt", id)
	}
	if err != nil {
		return nil, api.BadRequest("messages", "model %s: %v", id, err)
	}
	return vocab.Tokenize(p, true, true)
}

// resolve finds the model a request names (name, fingerprint or a unique
// prefix), giving discovery a moment when the table does not know it yet.
func (g *Gateway) resolve(ctx context.Context, model string) (string, int, error) {
	fp, nl, err := g.n.table.Resolve(model)
	if err == nil {
		return fp, nl, nil
	}
	if strings.Contains(err.Error(), "matches") {
		return "", 0, api.BadRequest("model", "%v", err)
	}
	wctx, cancel := context.WithTimeout(ctx, GatewayResolveWait)
	defer cancel()
	if fp, nl, werr := g.n.WaitForModel(wctx, model, GatewayResolveWait); werr == nil {
		return fp, nl, nil
	}
	if ctx.Err() != nil {
		return "", 0, ctx.Err()
	}
	if fp, nl, err := g.n.table.Resolve(model); err == nil {
		return fp, nl, nil // known, but not routable: Generate says why
	}
	return "", 0, api.ModelNotFound(model)
}

// modelID is the id Models lists for fingerprint fp.
func (g *Gateway) modelID(fp string) string {
	ms, _ := g.Models(context.Background())
	for _, m := range ms {
		if m.Fingerprint == fp {
			return m.ID
		}
	}
	for _, s := range g.n.table.Shards(fp) {
		if s.ModelName != "" {
			return s.ModelName
		}
	}
	return fp
}

// vocab returns model fp's vocabulary, fetching it once from a peer that
// serves it (verified against the fingerprint).
func (g *Gateway) vocab(ctx context.Context, fp string) (*engine.Model, error) {
	g.mu.Lock()
	v, ok := g.vocabs[fp]
	if !ok {
		if len(g.vocabs) >= maxGatewayVocabs {
			g.mu.Unlock()
			return nil, api.Unavailable("the gateway holds the vocabularies of %d models, its limit", maxGatewayVocabs)
		}
		v = &gatewayVocab{ready: make(chan struct{})}
		g.vocabs[fp] = v
		g.wg.Add(1)
		go func() { defer g.wg.Done(); g.fetchVocab(fp, v) }()
	}
	g.mu.Unlock()
	select {
	case <-v.ready:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if v.err != nil {
		return nil, v.err
	}
	return v.m, nil
}

func (g *Gateway) fetchVocab(fp string, v *gatewayVocab) {
	defer close(v.ready)
	ctx, cancel := context.WithTimeout(g.ctx, 60*time.Second)
	defer cancel()
	var errs []error
	for _, s := range g.n.table.Shards(fp) {
		if !s.HasVocab {
			continue
		}
		fctx, c := context.WithTimeout(ctx, 30*time.Second)
		path, err := FetchVocab(fctx, g.n.ControlHost(), s.Peer, fp, filepath.Join(g.n.cfg.P2P.DataDir, "vocab"))
		c()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if v.m, err = engine.LoadModel(ctx, path, engine.LoadOptions{VocabOnly: true}); err != nil {
			errs = append(errs, err)
			continue
		}
		return
	}
	v.err = api.Unavailable("no peer serving model %.16s could give its vocabulary: %v", fp, errors.Join(errs...))
	if len(errs) == 0 {
		v.err = api.Unavailable("no peer serving model %.16s offers its vocabulary", fp)
	}
	// Forget the failure so a later request tries again.
	g.mu.Lock()
	if g.vocabs[fp] == v {
		delete(g.vocabs, fp)
	}
	g.mu.Unlock()
}
