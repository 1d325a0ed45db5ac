// Package proofgossip spreads fraud proofs through a swarm without a
// tracker (docs/trust.md, "what the swarm learns from one proof").
//
// An origin whose audit convicts a hop publishes the proof on the swarm's
// proofs topic. Every node checks what costs no replay before it forwards
// one (size, the signatures of the origin and of the accused hop, that the
// accused serves layers now, a digest seen before, its author's rate);
// nodes that can replay the accused layers (an auditor with the model) then
// replay it in the background, one at a time, and convict the hop only if
// their own replay differs from what it signed. A node that cannot replay
// convicts nobody: a proof never convicts on the word of its publisher. It
// only suspects the hop (Config.Suspect: the soft avoidance a failed
// generation earns, routes elsewhere while others exist, for a while),
// since a proof holds the accused's own signed statements of a session its
// publisher really ran through it. A publisher whose proof a replay finds
// honest is not heard again for PenaltyTime.
//
// Gossip keeps no history: a node that joined the topic's mesh just after
// a proof went round (or was down then) would never hear it. So the author
// sends each of its proofs again (Config.Republish), and a node forwards
// such a repeat of a proof it already judged (at most once per
// Config.RepeatInterval) without replaying it again: the repeat reaches the nodes
// that missed the first copy, and costs the others a digest. An author may
// be gone a minute later (a `generate` run that exited), so a node whose
// own replay convicted carries the proof on: it sends it again on the same
// schedule, each time later by up to half the gap at random, and skips a
// turn when a copy from anyone else arrived since it last sent one (or,
// before its first turn, since the proof first came). So the nodes that
// carry a proof send about one copy per turn between them, and mostly
// none while its author still sends its own.
package proofgossip

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"google.golang.org/protobuf/proto"

	"github.com/neuron-tai/meshp2p/p2p"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/session"
)

// TopicName is the proofs topic's name under the swarm's namespace.
const TopicName = "proofs/1"

// Defaults (Config's zero values).
const (
	// DefaultPublisherInterval is the least time between two proofs heard
	// from one author: more are dropped unforwarded.
	DefaultPublisherInterval = time.Minute
	// DefaultQueue bounds the proofs waiting for a replay here; more are
	// dropped (and not forwarded by this node).
	DefaultQueue = 4
	// DefaultJudgeTimeout bounds one replay.
	DefaultJudgeTimeout = 2 * time.Minute
	// PenaltyTime is how long an author whose proof a replay found honest
	// is not heard.
	PenaltyTime = time.Hour
	// DefaultRepeatInterval is the least time between two forwards of one
	// proof by a node (its author's repeats, or another author's copy).
	DefaultRepeatInterval = time.Minute
	// MaxOwn bounds the proofs a node sends again (the newest are kept),
	// its own and, as many again, those its replays convicted on.
	MaxOwn = 8
	// maxRemembered bounds the digests and authors remembered.
	maxRemembered = 4096
)

// DefaultRepublish is when an author sends its proof again: each gap after
// the last send, the last gap repeating while the node runs. The first
// catches the nodes that were joining the mesh as the proof went round
// (a gossipsub heartbeat or two); the later ones, nodes that joined since.
func DefaultRepublish() []time.Duration {
	return []time.Duration{5 * time.Second, time.Minute, 10 * time.Minute, time.Hour, 6 * time.Hour}
}

// Judge replays a proof (session.Judge over this node's audit engines).
type Judge func(ctx context.Context, p *meshp2pb.Proof) (session.Verdict, error)

// Config is what the gossip acts on.
type Config struct {
	// Judge replays proofs (nil: this node checks signatures and forwards
	// but convicts nobody).
	Judge Judge
	// Convict records a conviction this node's replay confirmed.
	Convict func(p peer.ID, reason string)
	// Suspect, if set, records a proof this node cannot replay (no
	// Judge, or not these layers): soft avoidance, never a conviction.
	Suspect func(p peer.ID)
	// Convicted reports a peer already convicted here (its proofs are
	// forwarded without a replay).
	Convicted func(peer.ID) bool
	// Serving reports whether p advertises layers now: proofs against
	// anyone else (throwaway keys) are dropped before any work.
	Serving func(peer.ID) bool
	// Republish is when this node sends its own proofs again (gaps after
	// the previous send; the last repeats). Nil: DefaultRepublish(); empty
	// (not nil): never.
	Republish []time.Duration
	// RepeatInterval: the least time between two forwards of one proof
	// heard before (DefaultRepeatInterval when 0).
	RepeatInterval time.Duration
	// PublisherInterval, Queue, JudgeTimeout: see the defaults.
	PublisherInterval time.Duration
	Queue             int
	JudgeTimeout      time.Duration
	Logger            *slog.Logger
	Now               func() time.Time
}

// Stats counts what the gossip did (tests, status).
type Stats struct {
	// Heard: accepted and forwarded; Refused: malformed or forged
	// (the forwarder's score pays); Dropped: over a rate, a penalised
	// author, a throwaway accused or a full replay queue; Repeated: a
	// proof heard before, forwarded again without a replay; Republished:
	// this node's own proofs sent again, and those it carries; Carried:
	// proofs this node's replay convicted on, taken on to send again;
	// Skipped: a carried proof's turns not sent, a copy having come since.
	Heard, Refused, Dropped, Judged, Convicted, Refuted, Suspected, Repeated, Republished, Carried, Skipped int
}

// fate is what a node made of a proof (by digest).
type fate uint8

const (
	unknown fate = iota // never heard, or dropped (a repeat is checked afresh)
	heard               // accepted: queued for a replay, or suspected
	refused             // malformed or forged
)

// own is a proof this node sends again on the Republish schedule: one of
// its own, or one its replay convicted on (carried).
type own struct {
	data []byte
	due  time.Time
	step int
	// carried: jittered turns, skipped when a copy came since last.
	carried bool
	sum     [32]byte
	last    time.Time
}

// job is a proof heard, waiting for a replay: its bytes as they came, and
// when.
type job struct {
	p    *meshp2pb.Proof
	data []byte
	came time.Time
}

// Gossip is one node's end of the proofs topic.
type Gossip struct {
	cfg   Config
	topic *p2p.Topic
	self  peer.ID
	work  chan job

	mu      sync.Mutex
	seen    map[[32]byte]fate
	read    map[[32]byte]bool      // delivered to readLoop (a repeat is not queued again)
	fwd     map[[32]byte]time.Time // when a repeat was last forwarded
	lastBy  map[peer.ID]time.Time
	penalty map[peer.ID]time.Time
	mine    []*own
	carried []*own
	sent    time.Time              // when this node last published a proof
	came    map[[32]byte]time.Time // when a copy last came from another node
	wake    chan struct{}
	stats   Stats

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// ErrTooLarge is a proof over what one gossip message carries.
var ErrTooLarge = errors.New("proofgossip: proof too large to gossip")

// Start joins the proofs topic of d and starts judging what it hears.
func Start(ctx context.Context, d *p2p.Discovery, self peer.ID, cfg Config) (*Gossip, error) {
	if cfg.PublisherInterval <= 0 {
		cfg.PublisherInterval = DefaultPublisherInterval
	}
	if cfg.Queue <= 0 {
		cfg.Queue = DefaultQueue
	}
	if cfg.JudgeTimeout <= 0 {
		cfg.JudgeTimeout = DefaultJudgeTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.RepeatInterval <= 0 {
		cfg.RepeatInterval = DefaultRepeatInterval
	}
	if cfg.Republish == nil {
		cfg.Republish = DefaultRepublish()
	}
	g := &Gossip{cfg: cfg, self: self, work: make(chan job, cfg.Queue), wake: make(chan struct{}, 1),
		seen: map[[32]byte]fate{}, read: map[[32]byte]bool{}, fwd: map[[32]byte]time.Time{}, came: map[[32]byte]time.Time{},
		lastBy: map[peer.ID]time.Time{}, penalty: map[peer.ID]time.Time{}}
	t, err := d.Join(TopicName, g.validate)
	if err != nil {
		return nil, err
	}
	g.topic = t
	ctx, g.cancel = context.WithCancel(ctx)
	g.wg.Add(3)
	go g.readLoop(ctx)
	go g.judgeLoop(ctx)
	go g.republishLoop(ctx)
	return g, nil
}

// Close leaves the topic and stops judging.
func (g *Gossip) Close() {
	if g == nil {
		return
	}
	g.cancel()
	g.topic.Close()
	g.wg.Wait()
}

// Publish sends a proof this node's own audit made (and judged).
func (g *Gossip) Publish(ctx context.Context, p *meshp2pb.Proof) error {
	b, err := proto.Marshal(p)
	if err != nil {
		return err
	}
	if len(b) > p2p.MaxTopicMessage {
		return fmt.Errorf("%w: %d bytes, more than %d (submit it to a tracker, or check it with `meshp2p proof verify`)", ErrTooLarge, len(b), p2p.MaxTopicMessage)
	}
	sum := sha256.Sum256(b)
	g.mu.Lock()
	g.remember(sum, heard)
	g.keep(b)
	g.sent = g.cfg.Now()
	g.mu.Unlock()
	g.poke()
	return g.topic.Publish(ctx, b)
}

// keep schedules proof b to be sent again (mu held; the newest MaxOwn).
func (g *Gossip) keep(b []byte) {
	if len(g.cfg.Republish) == 0 {
		return
	}
	if len(g.mine) >= MaxOwn {
		g.mine = g.mine[1:]
	}
	g.mine = append(g.mine, &own{data: b, due: g.cfg.Now().Add(g.cfg.Republish[0])})
}

// carry takes on proof b, which this node's replay convicted on, to send
// again (the newest MaxOwn); it first came at came (its first turn is
// skipped if a copy came since, e.g. the author's 5 s repeat during the
// replay).
func (g *Gossip) carry(b []byte, came time.Time) {
	if len(g.cfg.Republish) == 0 {
		return
	}
	now := g.cfg.Now()
	g.mu.Lock()
	if len(g.carried) >= MaxOwn {
		g.carried = g.carried[1:]
	}
	g.carried = append(g.carried, &own{data: b, carried: true, sum: sha256.Sum256(b), last: came, due: now.Add(jittered(g.cfg.Republish[0]))})
	g.stats.Carried++
	g.mu.Unlock()
	g.poke()
}

// poke has republishLoop recompute its next wake (a proof was added).
func (g *Gossip) poke() {
	select {
	case g.wake <- struct{}{}:
	default:
	}
}

// jittered is gap plus up to half of it at random, so that the nodes that
// carry one proof do not send it in the same instant.
func jittered(gap time.Duration) time.Duration {
	return gap + rand.N(gap/2+1)
}

// republishLoop sends this node's proofs again when due.
func (g *Gossip) republishLoop(ctx context.Context) {
	defer g.wg.Done()
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		t.Reset(g.republish(ctx))
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-g.wake:
		}
	}
}

// republish sends a proof due and returns the wait until the next one.
// It sends at most one per PublisherInterval (counting Publish), the one
// due longest first: a node that never heard the proofs takes no more
// than that from one sender, so the others wait their turn instead of
// being dropped.
func (g *Gossip) republish(ctx context.Context) time.Duration {
	now := g.cfg.Now()
	next := time.Hour
	var pick *own
	waiting := 0
	g.mu.Lock()
	for _, o := range append(g.mine[:len(g.mine):len(g.mine)], g.carried...) {
		switch {
		case now.Before(o.due):
			next = min(next, o.due.Sub(now))
		case o.carried && g.came[o.sum].After(o.last): // someone sent it since
			g.stats.Skipped++
			next = min(next, g.advance(o, now))
		default:
			waiting++
			if pick == nil || o.due.Before(pick.due) {
				pick = o
			}
		}
	}
	free := g.sent.Add(g.cfg.PublisherInterval)
	var send []byte
	if pick != nil && !now.Before(free) {
		send, g.sent, free = pick.data, now, now.Add(g.cfg.PublisherInterval)
		g.stats.Republished++
		next = min(next, g.advance(pick, now))
		waiting--
	}
	if waiting > 0 { // the rest, overdue, at this sender's next slot
		next = min(next, free.Sub(now))
	}
	g.mu.Unlock()
	if send != nil {
		if err := g.topic.Publish(ctx, send); err != nil && ctx.Err() == nil {
			g.log().Info("could not send a fraud proof again", "err", err)
		}
	}
	return max(next, 10*time.Millisecond)
}

// advance moves o to its next turn (mu held) and returns the gap.
func (g *Gossip) advance(o *own, now time.Time) time.Duration {
	o.step = min(o.step+1, len(g.cfg.Republish)-1)
	gap := g.cfg.Republish[o.step]
	if o.carried {
		gap = jittered(gap)
	}
	o.last, o.due = now, now.Add(gap)
	return gap
}

// remember records what this node made of a digest (mu held; bounded).
func (g *Gossip) remember(sum [32]byte, f fate) {
	if len(g.seen) >= maxRemembered {
		clear(g.seen) // a memory bound: a replay after it costs one more check
	}
	g.seen[sum] = f
}

// repeat decides on a proof heard before (mu held): forwarded again at
// most once per RepeatInterval, never replayed again.
func (g *Gossip) repeat(sum [32]byte, now time.Time) p2p.TopicVerdict {
	if now.Sub(g.fwd[sum]) < g.cfg.RepeatInterval {
		return p2p.TopicIgnore
	}
	if len(g.fwd) >= maxRemembered {
		clear(g.fwd)
	}
	g.fwd[sum] = now
	g.stats.Repeated++
	return p2p.TopicAccept
}

// validate is the topic's validator: the checks that need no replay, in
// order of cost. Accepted proofs are forwarded (and queued here).
func (g *Gossip) validate(_ context.Context, from peer.ID, data []byte) p2p.TopicVerdict {
	if from == g.self {
		return p2p.TopicAccept
	}
	now := g.cfg.Now()
	sum := sha256.Sum256(data)
	g.mu.Lock()
	switch g.seen[sum] {
	case refused:
		g.mu.Unlock()
		return p2p.TopicIgnore
	case heard:
		if len(g.came) >= maxRemembered {
			clear(g.came)
		}
		g.came[sum] = now
		v := g.repeat(sum, now)
		g.mu.Unlock()
		return v
	}
	switch {
	case now.Before(g.penalty[from]):
		g.stats.Dropped++
		g.mu.Unlock()
		return p2p.TopicIgnore
	case now.Sub(g.lastBy[from]) < g.cfg.PublisherInterval:
		g.stats.Dropped++
		g.mu.Unlock()
		return p2p.TopicIgnore
	}
	g.mu.Unlock()
	accused, err := check(data)
	if err != nil {
		g.mu.Lock()
		g.remember(sum, refused)
		g.stats.Refused++
		g.mu.Unlock()
		g.log().Info("gossiped proof refused", "from", from, "err", err)
		return p2p.TopicReject
	}
	if g.cfg.Serving != nil && !g.cfg.Serving(accused) {
		g.drop(from, now)
		return p2p.TopicIgnore // a throwaway key's conviction is worth no work
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.lastBy) >= maxRemembered {
		clear(g.lastBy)
	}
	g.lastBy[from] = now
	g.remember(sum, heard)
	g.stats.Heard++
	return p2p.TopicAccept
}

// check decodes a proof and checks what needs no replay.
func check(data []byte) (peer.ID, error) {
	p := &meshp2pb.Proof{}
	if err := proto.Unmarshal(data, p); err != nil {
		return "", fmt.Errorf("%w: %w", session.ErrProof, err)
	}
	return session.CheckProof(p)
}

// drop counts a proof dropped after its checks: its author's rate is
// spent, and a repeat of it is checked afresh (the accused may have
// joined this node's table since).
func (g *Gossip) drop(from peer.ID, now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.lastBy[from] = now
	g.stats.Dropped++
}

func (g *Gossip) log() *slog.Logger { return g.cfg.Logger.With("logger", "proofgossip") }

// readLoop queues every accepted proof of others for a replay.
func (g *Gossip) readLoop(ctx context.Context) {
	defer g.wg.Done()
	for {
		from, data, err := g.topic.Next(ctx)
		if err != nil {
			return
		}
		if from == g.self || !g.first(sha256.Sum256(data)) {
			continue // a repeat: forwarded, not judged again
		}
		p := &meshp2pb.Proof{}
		if proto.Unmarshal(data, p) != nil {
			continue
		}
		if g.cfg.Judge == nil {
			g.suspect(p)
			continue
		}
		p.AuditorPeerId = []byte(from) // who to penalise if it is refuted
		select {
		case g.work <- job{p: p, data: data, came: g.cfg.Now()}:
		default:
			g.mu.Lock()
			g.stats.Dropped++
			g.mu.Unlock()
			g.log().Info("gossiped proof not replayed: the replay queue is full", "from", from)
		}
	}
}

// first reports whether a delivered proof is new to readLoop (bounded).
func (g *Gossip) first(sum [32]byte) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.read[sum] {
		return false
	}
	if len(g.read) >= maxRemembered {
		clear(g.read)
	}
	g.read[sum] = true
	return true
}

// judgeLoop replays queued proofs one at a time.
func (g *Gossip) judgeLoop(ctx context.Context) {
	defer g.wg.Done()
	for {
		select {
		case <-ctx.Done():
			return
		case j := <-g.work:
			if g.judge(ctx, j.p) {
				g.carry(j.data, j.came)
			}
		}
	}
}

// judge replays p; it reports whether the replay convicted.
func (g *Gossip) judge(ctx context.Context, p *meshp2pb.Proof) (convicted bool) {
	from := peer.ID(p.GetAuditorPeerId())
	accused := peer.ID(p.GetOpen().GetRoute().GetHops()[p.GetHopIndex()].GetPeerId())
	if g.cfg.Convicted != nil && g.cfg.Convicted(accused) {
		return false
	}
	jctx, cancel := context.WithTimeout(ctx, g.cfg.JudgeTimeout)
	v, err := g.cfg.Judge(jctx, p)
	cancel()
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case errors.Is(err, session.ErrNoAuditor):
		g.mu.Unlock()
		g.suspect(p)
		g.mu.Lock()
	case err != nil:
		g.log().Info("gossiped proof not replayed", "accused", accused, "from", from, "err", err)
	case v.Convicted:
		g.stats.Judged++
		g.stats.Convicted++
		g.mu.Unlock()
		g.cfg.Convict(accused, v.Reason)
		g.mu.Lock()
		g.log().Warn("gossiped fraud proof replayed here: hop convicted, avoided from now on", "peer", accused, "from", from, "reason", v.Reason)
		convicted = true
	case v.Inconclusive != "":
		g.stats.Judged++
		g.log().Info("gossiped proof inconclusive here", "accused", accused, "from", from, "reason", v.Inconclusive)
	default:
		g.stats.Judged++
		g.stats.Refuted++
		if len(g.penalty) >= maxRemembered {
			clear(g.penalty)
		}
		g.penalty[from] = g.cfg.Now().Add(PenaltyTime)
		g.log().Warn("gossiped proof refuted by the replay here: its author is not heard for a while", "accused", accused, "from", from, "for", PenaltyTime)
	}
	return convicted
}

// suspect softly avoids the hop a proof accuses that this node cannot
// replay.
func (g *Gossip) suspect(p *meshp2pb.Proof) {
	accused := peer.ID(p.GetOpen().GetRoute().GetHops()[p.GetHopIndex()].GetPeerId())
	g.mu.Lock()
	g.stats.Suspected++
	g.mu.Unlock()
	if g.cfg.Suspect != nil {
		g.cfg.Suspect(accused)
	}
	g.log().Info("gossiped fraud proof this node cannot replay (it holds no whole model of those layers): the hop is avoided while others serve them", "peer", accused)
}
