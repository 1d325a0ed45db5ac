package session

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/route"
)

// Dialer opens streams; the p2p node implements it.
type Dialer interface {
	NewStream(ctx context.Context, p peer.ID, pids ...protocol.ID) (network.Stream, error)
}

// Origin is the client side of the route-session protocol: it runs
// generations along routes and re-routes around failed hops.
type Origin struct {
	Dialer Dialer
	// Key is the origin's libp2p key, the key of the peer Dialer dials
	// from: it signs every epoch's SessionOpen (SignOpen), and hops admit
	// no unsigned open. Required.
	Key      crypto.PrivKey
	Planner  route.Planner
	Protocol protocol.ID // the session protocol ID of this swarm
	Limits   frame.Limits
	Logger   *slog.Logger
	// TokenTimeout bounds the wait for each token (DefaultTokenTimeout,
	// longer than a hop's idle timeout; each epoch's first token gets
	// more per PrefillRowsPerTokenTimeout prompt rows and for the route's
	// estimated prefill work, for the prefill: waits.go).
	TokenTimeout time.Duration
	// MaxReroutes bounds recovery attempts per generation
	// (DefaultMaxReroutes; negative: never re-route).
	MaxReroutes int
	// Chunk is the prefill chunk size in rows (DefaultChunk).
	Chunk int
	// RouteWait bounds how long a re-route waits for a replacement peer to
	// appear when none is known yet (DefaultRouteWait; the error then names
	// the missing layers). Rediscover, if set, is called while waiting
	// (e.g. DHT lookups) and Changed signals table changes.
	RouteWait  time.Duration
	Rediscover func(ctx context.Context, fingerprint string)
	Changed    <-chan struct{}
	// CapacityWait bounds how long a route refused with NO_CAPACITY, or
	// planned with no route because every peer serving some layers is
	// full (route.ErrRouteFull), is retried (DefaultCapacityWait;
	// negative: not retried). A full hop is never excluded: the next plan
	// avoids it when a replica exists, else the same route is tried again
	// after a backoff.
	CapacityWait time.Duration
	// Covered, if set, reports whether the known peers cover every layer
	// of a model, load aside (route.Table.Covers). A plan that finds no
	// route while they do, before any failure, is waited out like a full
	// route: a planner that cannot say "full" (a tracker's refusal) gets
	// the same wait as the local planner's route.ErrRouteFull.
	Covered func(fingerprint string, nLayer int) bool
	// Failures, if set, is shared by the origins of a node or gateway:
	// peers blamed for a failed generation are avoided by later plans
	// (soft: still planned when no other route exists).
	Failures *FailureMemory
	// Observer sees route planning, first tokens, re-routes and recovery
	// (metrics); nil: none.
	Observer OriginObserver
	// Audit, if set with a rate above 0, makes sessions keep signed
	// transcripts and audits that share of generations (audit.go); a hop
	// an audit convicts is avoided through Failures.
	Audit *Auditor
	// NoPrefixCache: sessions neither reuse nor leave cached prefixes at
	// the hops (prefix.go; on by default).
	NoPrefixCache bool
	// Shards, if set, lists who serves a model (route.Table.Shards): the
	// origin picks hot standbys from it (standby.go; nil: none).
	Shards func(fp string) []route.Shard
	// StandbyAbove is the prompt length from which a session gets a hot
	// standby without asking (GenerateRequest.Standby; 0:
	// DefaultStandbyAbove; negative: only when asked).
	StandbyAbove int

	warm warmRoutes // recent sessions' routes, for cache affinity (warm.go)
}

// GenerateRequest is one generation.
type GenerateRequest struct {
	Fingerprint string
	NLayer      int
	Prompt      []int32
	MaxTokens   int
	Sampling    *meshp2pb.SamplingParams
	WireDType   meshp2pb.DType
	// Speculation asks the head to propose tokens and verify them in
	// windows (nil: off). The output is the same either way.
	Speculation *meshp2pb.Speculation
	// OnToken sees each token as it arrives; returning true stops the
	// generation (stop string found).
	OnToken func(tok int32) bool
	// OnLogprobs, if set, sees each token's log-probabilities (nil when
	// the tail sent none) just before OnToken (Sampling.logprobs asks the
	// tail for them; speculative windows carry none).
	OnLogprobs func(tok int32, lp *meshp2pb.TokenLogprobs)
	// OnRoute, if set, sees each epoch's route before it is opened (the
	// first, then one per re-route or capacity retry) and the re-routes so
	// far.
	OnRoute func(rt *route.Route, reroutes int)
	// CacheNamespace separates the hops' cached prefixes of this origin's
	// users (e.g. a gateway's API keys): sessions reuse only prefixes
	// left by sessions of the same namespace (prefix.go).
	CacheNamespace string
	// Standby asks for a hot standby of one hop (standby.go): a replica
	// that keeps the session's KV in step, so a failure of that hop costs
	// no prefill. Long prompts get one anyway (Origin.StandbyAbove)
	// unless NoStandby refuses it (its compute and bytes).
	Standby, NoStandby bool
}

// HopStat is the mean compute time one hop spent per generated token.
type HopStat struct {
	Peer       peer.ID `json:"peer"`
	Start      int     `json:"start"`
	End        int     `json:"end"`
	MeanUs     float64 `json:"mean_compute_us"`
	PrefillUs  uint32  `json:"prefill_compute_us"`
	Reach      string  `json:"reach"`
	StepsTimed int     `json:"steps"`
	// Mean per decode step of the rest of the hop's time (HopTiming):
	// waiting for input, reading, wire-to-f32, f32-to-wire, writing on,
	// and (head) writing the token up to the origin.
	WaitUs   float64 `json:"wait_us"`
	ReadUs   float64 `json:"read_us"`
	DecodeUs float64 `json:"decode_us"`
	EncodeUs float64 `json:"encode_us"`
	WriteUs  float64 `json:"write_us"`
	UpUs     float64 `json:"up_us"`
}

// Result is what a generation produced.
type Result struct {
	Tokens   []int32
	Route    *route.Route
	Reroutes int
	Stop     string // "eos", "max_tokens", "stop"
	TTFT     time.Duration
	Total    time.Duration
	HopStats []HopStat
	// Failures lists the errors that caused reroutes.
	Failures []string
	// CapacityRetries counts opens refused with NO_CAPACITY and retried
	// (not failures, not reroutes).
	CapacityRetries int
	// Spec counts speculation over all epochs (zero when off).
	Spec SpecStats
	// CachedTokens are the prompt tokens the final epoch's hops did not
	// compute: every hop reused them from its prefix cache. HopCached is
	// what each hop of the final route held (the route reuses the least).
	CachedTokens int
	HopCached    []int
	// Standbys counts the epochs that named a hot standby, Takeovers the
	// re-routes that put a standby in the place of the hop it covered.
	Standbys, Takeovers int
	// Recoveries are the re-routes' stalls: from each failure to the
	// next token.
	Recoveries []time.Duration

	failedAt time.Time // the last re-route's failure, until tokens flow again
	// owns are the own counts of the epochs opened so far with one
	// (PrefixChain.earlier of the next).
	owns []*meshp2pb.EpochOwn
	// lastOpen is the final epoch's open and prompt the request's prompt:
	// what an audit needs; cachedFrom is where its prefill started.
	lastOpen   *meshp2pb.SessionOpen
	prompt     []int32
	cachedFrom int
	follows    []byte // the earlier session the opens follow (warmHops)
	// warmStandby is that session's standby (warmHops): preferred as this
	// session's standby.
	warmStandby []route.Hop
	// standbyLost: the last epoch's head standby was dropped by the
	// origin's feed (it must not take over; headstandby.go).
	standbyLost bool
}

// ErrGeneration wraps failures that ended a generation.
var ErrGeneration = errors.New("session: generation failed")

// Generate runs req, re-routing (epoch+1, failed peer excluded, prompt and
// tokens so far re-prefilled) when a hop fails.
func (o *Origin) Generate(ctx context.Context, req GenerateRequest) (*Result, error) {
	obs := o.observer()
	res, err := o.generate(ctx, req, obs)
	n := 0
	if res != nil {
		n = len(res.Tokens)
	}
	obs.GenerationDone(n, err)
	if err == nil {
		obs.PromptCached(len(req.Prompt), res.CachedTokens)
	}
	return res, err
}

func (o *Origin) observer() OriginObserver {
	if o.Observer == nil {
		return nopOrigin{}
	}
	return o.Observer
}

// begin checks req (filling in its defaults) and draws the session id.
func (o *Origin) begin(req *GenerateRequest) ([16]byte, error) {
	var sid [16]byte
	if len(req.Prompt) == 0 {
		return sid, fmt.Errorf("%w: empty prompt", ErrGeneration)
	}
	if o.Key == nil {
		return sid, fmt.Errorf("%w: the origin has no key to sign its session opens with", ErrGeneration)
	}
	if req.MaxTokens <= 0 {
		req.MaxTokens = DefaultMaxTokens
	}
	_, err := rand.Read(sid[:])
	return sid, err
}

func (o *Origin) generate(ctx context.Context, req GenerateRequest, obs OriginObserver) (*Result, error) {
	sid, err := o.begin(&req)
	if err != nil {
		return nil, err
	}
	maxRe, log := o.maxReroutes(), o.logger()
	res := &Result{prompt: req.Prompt}
	exclude := o.Failures.convicted() // never routed through again
	var full capacityRetry
	var sb standbys
	start := time.Now()
	for epoch := uint64(1); ; epoch++ {
		preq := route.Request{Fingerprint: req.Fingerprint, NLayer: req.NLayer, Exclude: exclude, NeedKV: len(req.Prompt) + req.MaxTokens + 1, Epoch: epoch, SessionID: sid[:],
			Warm: o.warmHops(req, res), WarmStandby: res.warmStandby, Standby: o.wantsStandby(req), Takeover: sb.takeover()}
		rt, err := o.planEpoch(ctx, &full, preq, res, obs)
		if o.routeFull(err, req, len(res.Failures)) {
			// Every peer serving some layer is full now: the planner skips
			// peers whose advert shows no free slot or KV room, which a
			// burst of sessions makes true for a moment (adverts follow
			// within a few seconds). Wait as for a NO_CAPACITY refusal.
			if err = full.wait(ctx, o.CapacityWait, "", err); err == nil {
				res.CapacityRetries++
				log.Info("every peer serving some layers is full, waiting", "epoch", epoch+1)
				continue
			}
		}
		if err != nil {
			if len(res.Failures) > 0 {
				return res, fmt.Errorf("%w after %d reroutes (last failure: %s): %w", ErrGeneration, res.Reroutes, res.Failures[len(res.Failures)-1], err)
			}
			return res, err
		}
		if rt.Epoch != epoch {
			return res, fmt.Errorf("%w: planner returned a route for epoch %d, want %d", ErrGeneration, rt.Epoch, epoch)
		}
		sb.next(o, rt, req, preq, res)
		res.Route = rt
		if req.OnRoute != nil {
			req.OnRoute(rt, res.Reroutes)
		}
		failed, err := o.run(ctx, sid, rt, sb.cur.wire(), req, res, start)
		failed = blameOnRoute(rt, failed)
		if err == nil {
			res.Total = time.Since(start)
			o.maybeAudit(res)
			return res, nil
		}
		if ctx.Err() != nil {
			return res, ctx.Err()
		}
		if frame.Code(err) == meshp2pb.ErrorCode_ERROR_CODE_NO_CAPACITY {
			// A full hop has not failed: never exclude it. Avoid it for
			// the next plan if a replica exists, else wait and retry.
			if werr := full.wait(ctx, o.CapacityWait, failed, err); werr != nil {
				return res, fmt.Errorf("%w: %w", ErrGeneration, werr)
			}
			res.CapacityRetries++
			log.Info("route refused for capacity, retrying", "full_peer", failed, "epoch", epoch+1, "err", err)
			continue
		}
		full, sb.prev = capacityRetry{}, nil
		res.Failures = append(res.Failures, err.Error())
		o.Failures.Blame(failed)
		if failed == "" || res.Reroutes >= maxRe {
			return res, fmt.Errorf("%w: %w", ErrGeneration, err)
		}
		log.Warn("hop failed, re-routing", "failed_peer", failed, "epoch", epoch+1, "tokens_so_far", len(res.Tokens), "err", err)
		exclude[failed] = true
		sb.prev, sb.failed = sb.cur, failed
		if sb.prev != nil && (standbyLost(err) || res.standbyLost) {
			log.Info("the standby was dropped before the failure: not putting it in the failed hop's place", "standby", sb.prev.hop.Peer)
			sb.dropped()
		}
		res.Reroutes++
		res.failedAt = time.Now()
		obs.Rerouted()
	}
}

func (o *Origin) maxReroutes() int {
	if o.MaxReroutes == 0 {
		return DefaultMaxReroutes
	}
	return o.MaxReroutes
}

func (o *Origin) logger() *slog.Logger {
	if o.Logger == nil {
		return slog.Default()
	}
	return o.Logger
}

// planEpoch plans one epoch's route; after a failure, when no route is
// known, it waits for a replacement peer (awaitRoute).
func (o *Origin) planEpoch(ctx context.Context, full *capacityRetry, preq route.Request, res *Result, obs OriginObserver) (*route.Route, error) {
	t0 := time.Now()
	rt, err := o.plan(ctx, full, preq)
	if errors.Is(err, route.ErrNoRoute) && !errors.Is(err, route.ErrRouteFull) && len(res.Failures) > 0 {
		rt, err = o.awaitRoute(ctx, preq, err)
	}
	obs.RoutePlanned(time.Since(t0), err)
	return rt, err
}

// routeFull reports a plan error that waiting for room may fix: every
// peer serving some layers is full now (route.ErrRouteFull), or, for a
// planner that cannot tell, no route while Covered says the known peers
// serve every layer and nothing has failed yet.
func (o *Origin) routeFull(err error, req GenerateRequest, failures int) bool {
	if errors.Is(err, route.ErrRouteFull) {
		return true
	}
	return failures == 0 && errors.Is(err, route.ErrNoRoute) && o.Covered != nil && o.Covered(req.Fingerprint, req.NLayer)
}

// plan plans req, avoiding the peers the failure memory holds when a route
// without them exists.
func (o *Origin) plan(ctx context.Context, full *capacityRetry, req route.Request) (*route.Route, error) {
	if avoid := o.Failures.avoiding(req.Exclude); avoid != nil {
		alt := req
		alt.Exclude = avoid
		if rt, err := full.plan(ctx, o.Planner, alt); err == nil {
			return rt, nil
		}
	}
	return full.plan(ctx, o.Planner, req)
}

// blameOnRoute keeps a blamed peer only if it is on the route: a report
// naming anyone else reached us through the head, which relayed it, so the
// head is the one to avoid (a hostile hop must not get an arbitrary peer of
// the swarm excluded).
func blameOnRoute(rt *route.Route, failed peer.ID) peer.ID {
	if failed == "" || len(rt.Hops) == 0 {
		return failed
	}
	for _, h := range rt.Hops {
		if h.Peer == failed {
			return failed
		}
	}
	return rt.Hops[0].Peer
}

// run drives one epoch. On failure it returns the peer to exclude ("" when
// nobody is to blame and re-routing would not help).
func (o *Origin) run(ctx context.Context, sid [16]byte, rt *route.Route, sb *meshp2pb.Standby, req GenerateRequest, res *Result, start time.Time) (peer.ID, error) {
	o.observer().Routed(routeInfo(rt))
	res.standbyLost = false // this epoch's (headstandby.go)
	head := rt.Hops[0].Peer
	dctx, cancel := context.WithTimeout(ctx, DialTimeout)
	s, err := o.Dialer.NewStream(dctx, head, o.Protocol)
	cancel()
	if err != nil {
		return head, fmt.Errorf("open session stream to head %s: %w", head, err)
	}
	defer s.Close()
	stop := context.AfterFunc(ctx, func() { _ = s.Reset() })
	defer stop()
	e := &epochRun{s: s, w: frame.NewWriter(s, o.Limits), r: streamReader(s, o.Limits), sid: sid, rt: rt, head: head}
	open, input := o.sessionOpen(sid, rt, req, res.Tokens)
	open.Transcripts = o.Audit.on()
	open.Standby = sb
	e.withPrefix(o, open, input, req.CacheNamespace, res)
	if open.Prefix != nil {
		open.Follows = res.follows
	}
	if err := SignOpen(open, o.Key, time.Now()); err != nil {
		return "", fmt.Errorf("%w: %w", ErrGeneration, err)
	}
	res.lastOpen = open
	chunk := o.Chunk
	if chunk <= 0 {
		chunk = DefaultChunk
	}
	// Longer than a hop's idle timeout (the ladder in defaults.go), so a
	// stalled hop is reported by its neighbour, which can name it, before
	// we give up and can only blame the head. The first token also waits
	// for the prefill, which grows with the prompt and the hops' speed
	// (waits.go).
	e.tokenTimeout = o.TokenTimeout
	if e.tokenTimeout == 0 {
		e.tokenTimeout = DefaultTokenTimeout
	}
	e.firstTimeout = originFirstWait(open, len(input), e.tokenTimeout)
	if failed, err := e.admit(open); err != nil {
		return failed, err
	}
	// The head's standby opens once the route admitted the session, its
	// frames never waited for (headstandby.go).
	e.feed = o.startHeadFeed(sb, open, input, chunk)
	defer func() { res.standbyLost = e.feed.lost(); e.feed.finish() }()
	from, starts, err := e.cachedFrom(res, len(req.Prompt))
	if err != nil {
		return head, err
	}
	if err := e.prefill(input, from, chunk, starts); err != nil {
		return head, err
	}
	failed, err := e.collect(req, res, len(open.GetGenerated()), start, o.observer())
	if err == nil && e.chain != nil {
		// The standby kept the covered hop's blocks too: the next turn
		// prefers it as its standby (it can only follow from what it holds).
		o.warm.remember(append(slices.Clone(e.chain.GetHashes()), e.kept...), rt.Hops, standbyHops(sb, e.feed.lost()), sid)
	}
	return failed, err
}

// sessionOpen is the SessionOpen of one epoch and the rows to prefill: the
// prompt and, after a re-route, the tokens generated so far.
func (o *Origin) sessionOpen(sid [16]byte, rt *route.Route, req GenerateRequest, soFar []int32) (*meshp2pb.SessionOpen, []int32) {
	generated := append([]int32(nil), soFar...)
	remaining := req.MaxTokens - len(generated)
	input := append(append([]int32(nil), req.Prompt...), generated...)
	spec := req.Speculation
	if !rt.BatchInvariant() {
		// A GPU hop computes a window of K+1 rows differently from one
		// row: speculation would no longer give plain decoding's tokens.
		spec = nil
	}
	return &meshp2pb.SessionOpen{SessionId: sid[:], Epoch: rt.Epoch, ModelFingerprint: rt.Fingerprint, Route: route.WireRoute(rt),
		Sampling: req.Sampling, MaxTokens: uint32(remaining), WireDtype: req.WireDType, Speculation: spec,
		NCtxNeeded: uint32(len(input) + remaining + 1), Generated: generated, Ticket: rt.Ticket, HopMsPerLayer: hopMsPerLayer(rt)}, input
}

// epochRun is the origin's end of one epoch: the stream to the head.
type epochRun struct {
	s                          network.Stream
	w                          *frame.Writer
	r                          *frame.Reader
	sid                        [16]byte
	rt                         *route.Route
	head                       peer.ID
	tokenTimeout, firstTimeout time.Duration
	// The prefix cache (prefix.go): the open's chain, its seed and the
	// prefill input it covers (nil chain: off), and the head's accept.
	chain  *meshp2pb.PrefixChain
	seed   [16]byte
	input  []int32
	accept *meshp2pb.SessionAccept
	kept   []byte // the close's continuation of chain (what the hops keep)
	// sentBlocks is the chain's length the last SessionProgress gave.
	sentBlocks int
	// feed sends the head's standby what the head gets (nil: none;
	// headstandby.go).
	feed *headFeed
}

// admit sends the open and waits until the whole route admitted it.
func (e *epochRun) admit(open *meshp2pb.SessionOpen) (peer.ID, error) {
	if err := e.w.WriteStream(&meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Open{Open: open}}); err != nil {
		return e.head, fmt.Errorf("send open: %w", err)
	}
	_ = e.s.SetReadDeadline(time.Now().Add(e.firstTimeout))
	msg, _, err := e.r.ReadStream()
	if err != nil {
		return e.head, fmt.Errorf("admission: %w", err)
	}
	acc := msg.GetAccept()
	if acc == nil {
		return e.head, fmt.Errorf("admission: unexpected reply")
	}
	if !acc.GetOk() {
		return blame(acc.GetError()), fmt.Errorf("route refused: %w", frame.FromProto(acc.GetError()))
	}
	e.accept = acc
	return "", nil
}

// prefill sends the input from position from (what the hops hold before
// it) as token-id frames: FirstChunkRows first, then chunks of at most
// chunk rows; starts (nil: none) are the hops' starts (hopStarts).
func (e *epochRun) prefill(input []int32, from, chunk int, starts []uint32) error {
	for off, n := from, FirstChunkRows; off < len(input); off, n = off+n, chunk {
		end := min(off+n, len(input))
		a := &meshp2pb.ActivationHeader{SessionId: e.sid[:], Epoch: e.rt.Epoch, PosStart: uint32(off), NRows: uint32(end - off),
			IsPrefill: true, LastChunk: end == len(input), Tokens: input[off:end], HopStarts: starts}
		if err := e.w.WriteActivation(a); err != nil {
			return fmt.Errorf("send prefill: %w", err)
		}
	}
	return nil
}

// collect reads tokens from the head until the generation stops, then
// closes the session. nGenerated tokens of res came from earlier epochs.
func (e *epochRun) collect(req GenerateRequest, res *Result, nGenerated int, start time.Time, obs OriginObserver) (peer.ID, error) {
	sums := make([]uint64, len(e.rt.Hops))
	counts := 0
	timings := timingSums{hops: make([][7]uint64, len(e.rt.Hops))}
	var prefillUs []uint32
	specBase := res.Spec // the earlier epochs' counts
	for len(res.Tokens) < req.MaxTokens {
		// This epoch's first token waits for its prefill, after a
		// re-route too (it re-prefills the tokens so far).
		if len(res.Tokens) > nGenerated {
			_ = e.s.SetReadDeadline(time.Now().Add(e.tokenTimeout))
		} else {
			_ = e.s.SetReadDeadline(time.Now().Add(e.firstTimeout))
		}
		msg, _, err := e.r.ReadStream()
		if err != nil {
			return e.head, fmt.Errorf("waiting for token %d: %w", len(res.Tokens)+1, err)
		}
		switch k := msg.GetKind().(type) {
		case *meshp2pb.StreamMessage_Error:
			return blame(k.Error), frame.FromProto(k.Error)
		case *meshp2pb.StreamMessage_Token:
			tf := k.Token
			if res.TTFT == 0 {
				res.TTFT = time.Since(start)
				obs.FirstToken(res.TTFT)
			}
			if !res.failedAt.IsZero() {
				d := time.Since(res.failedAt)
				obs.Recovered(d)
				res.Recoveries = append(res.Recoveries, d)
				res.failedAt = time.Time{}
			}
			if prefillUs == nil {
				prefillUs = tf.GetHopUs()
			} else if len(tf.GetHopUs()) == len(sums) {
				for i, us := range tf.GetHopUs() {
					sums[i] += uint64(us)
				}
				counts++
				timings.add(tf.GetHopTiming())
			}
			res.Tokens = append(res.Tokens, tf.GetToken())
			res.Spec.add(specBase, tf.GetSpec())
			obs.TokenReceived()
			if req.OnLogprobs != nil {
				req.OnLogprobs(tf.GetToken(), tf.GetLogprobs())
			}
			stopNow := req.OnToken != nil && req.OnToken(tf.GetToken())
			switch {
			case tf.GetEos():
				res.Stop = "eos"
			case stopNow:
				res.Stop = "stop"
			case len(res.Tokens) >= req.MaxTokens:
				res.Stop = "max_tokens"
			}
			if res.Stop != "" {
				e.kept = e.prefixMore(res.Tokens[nGenerated:])
				msg := &meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Close{Close: &meshp2pb.SessionClose{SessionId: e.sid[:], Epoch: e.rt.Epoch, Reason: res.Stop,
					PrefixMore: e.kept}}}
				_ = e.w.WriteStream(msg)
				e.feed.message(msg)
				res.HopStats = hopStats(e.rt, sums, counts, prefillUs)
				timings.fill(res.HopStats)
				return "", nil
			}
			e.feed.token(tf.GetToken(), tf.GetPosition()) // the head feeds it back in: so does its standby
			e.progress(res.Tokens[nGenerated:])
		default:
			return e.head, fmt.Errorf("unexpected message from head")
		}
	}
	res.Stop = "max_tokens"
	return "", nil
}

func hopStats(rt *route.Route, sums []uint64, n int, prefill []uint32) []HopStat {
	out := make([]HopStat, len(rt.Hops))
	for i, h := range rt.Hops {
		out[i] = HopStat{Peer: h.Peer, Start: h.Start, End: h.End, Reach: h.Reach.String(), StepsTimed: n}
		if n > 0 {
			out[i].MeanUs = float64(sums[i]) / float64(n)
		}
		if i < len(prefill) {
			out[i].PrefillUs = prefill[i]
		}
	}
	return out
}

// blame picks the peer to exclude from an error report.
func blame(e *meshp2pb.Error) peer.ID {
	if e == nil {
		return ""
	}
	if len(e.GetFailedPeerId()) > 0 {
		if p, err := peer.IDFromBytes(e.GetFailedPeerId()); err == nil {
			return p
		}
	}
	return ""
}

// awaitRoute retries planning after a failure left no route, until a
// replacement appears or RouteWait passes.
func (o *Origin) awaitRoute(ctx context.Context, req route.Request, err error) (*route.Route, error) {
	wait := o.RouteWait
	if wait == 0 {
		wait = DefaultRouteWait
	}
	if wait < 0 {
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	tick := time.NewTicker(RoutePollInterval)
	defer tick.Stop()
	if o.Rediscover != nil {
		go o.Rediscover(wctx, req.Fingerprint)
	}
	for {
		select {
		case <-wctx.Done():
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, err
		case <-o.Changed:
		case <-tick.C:
		}
		rt, perr := o.Planner.Plan(ctx, req)
		if perr == nil {
			return rt, nil
		}
		if errors.Is(perr, route.ErrRouteFull) {
			return nil, perr // a replacement exists, but is full: the capacity wait's
		}
		err = perr
	}
}

// capacityRetry is the origin's state across opens refused with
// NO_CAPACITY: since when, the backoff, and the peer to avoid next.
type capacityRetry struct {
	since   time.Time
	backoff time.Duration
	avoid   peer.ID
}

// plan plans req avoiding the last full peer when a route without it
// exists (a replica), else with it.
func (c *capacityRetry) plan(ctx context.Context, pl route.Planner, req route.Request) (*route.Route, error) {
	if c.avoid != "" && !req.Exclude[c.avoid] {
		ex := maps.Clone(req.Exclude)
		ex[c.avoid] = true
		alt := req
		alt.Exclude = ex
		if rt, err := pl.Plan(ctx, alt); err == nil {
			return rt, nil
		}
	}
	return pl.Plan(ctx, req)
}

// wait records a capacity refusal by full (err) and waits the backoff
// (the refusal's retry_after_ms within [CapacityRetryMin,
// CapacityRetryMax]); it returns err once CapacityWait has passed.
func (c *capacityRetry) wait(ctx context.Context, limit time.Duration, full peer.ID, err error) error {
	if limit == 0 {
		limit = DefaultCapacityWait
	}
	now := time.Now()
	if c.since.IsZero() {
		c.since, c.backoff = now, CapacityRetryMin
	}
	if limit < 0 || now.Sub(c.since) >= limit {
		return fmt.Errorf("no capacity after retrying for %s: %w", now.Sub(c.since).Round(time.Millisecond), err)
	}
	c.avoid = full
	d := c.backoff
	var re *frame.RemoteError
	if errors.As(err, &re) && re.E.GetRetryAfterMs() > 0 {
		d = time.Duration(re.E.GetRetryAfterMs()) * time.Millisecond
	}
	d = min(max(d, CapacityRetryMin), CapacityRetryMax)
	c.backoff = min(2*c.backoff, CapacityRetryMax)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// SpecStats count a generation's speculation: verification windows,
// proposed tokens verified and of them accepted, and the most proposals
// one window carried (K) and windows in flight at once (W) on the last
// epoch's head.
type SpecStats struct {
	Windows  int `json:"windows"`
	Proposed int `json:"proposed"`
	Accepted int `json:"accepted"`
	K        int `json:"k"`
	W        int `json:"w"`
	// Proposer is what proposed on the last epoch's head: "ngram" or
	// "draft".
	Proposer string `json:"proposer"`
}

// AcceptedPerWindow is the mean number of proposals a window had
// accepted (0 without windows).
func (s SpecStats) AcceptedPerWindow() float64 {
	if s.Windows == 0 {
		return 0
	}
	return float64(s.Accepted) / float64(s.Windows)
}

// AcceptanceRate is accepted over proposed (0 when nothing was proposed).
func (s SpecStats) AcceptanceRate() float64 {
	if s.Proposed == 0 {
		return 0
	}
	return float64(s.Accepted) / float64(s.Proposed)
}

// add sets s to base plus the head's counts for this epoch (ps: nil
// leaves s as it is).
func (s *SpecStats) add(base SpecStats, ps *meshp2pb.SpecStats) {
	if ps == nil {
		return
	}
	*s = SpecStats{Windows: base.Windows + int(ps.GetWindows()), Proposed: base.Proposed + int(ps.GetProposed()),
		Accepted: base.Accepted + int(ps.GetAccepted()), K: int(ps.GetK()), W: int(ps.GetW()), Proposer: ps.GetProposer()}
}
