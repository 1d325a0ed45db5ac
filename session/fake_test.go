package session

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/neuron-tai/meshp2p/p2p"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/route"
)

// The fake engine is a deterministic stand-in for a llama.cpp shard. A
// hidden row is [token, position, layers run so far, 0]; each hop checks
// that it receives exactly the layers before its range (so a wrong route
// or a lost frame shows), adds its own, and the tail samples
// nextToken(token, position). Positions must continue like a KV cache's.
// quiet keeps test output to failures.
var quiet = slog.New(slog.DiscardHandler)

const (
	fakeEmbd  = 4
	fakeVocab = 97
	fakeNLay  = 6
	fakeFP    = "fake-model-fingerprint"
)

// cyclicSeed marks a seed whose low byte L makes the fake's output a
// cycle of period L (1..L), broken at every 17th position: text a
// proposer can copy, with rejections.
const cyclicSeed = 1 << 62

func nextToken(tok int32, pos int, seed uint64) int32 {
	if seed&cyclicSeed != 0 {
		l := int32(seed & 0xff)
		if pos%17 == 0 {
			return (tok+3)%l + 1
		}
		return tok%l + 1
	}
	return int32((int(tok)*7+pos*3+int(seed%13))%(fakeVocab-1)) + 1 // never 0: 0 is the EOG token
}

// reference is what a whole model would generate: the tokens after prompt.
func reference(prompt []int32, n int, seed uint64) []int32 {
	var out []int32
	tok, pos := prompt[len(prompt)-1], len(prompt)-1
	for range n {
		tok = nextToken(tok, pos, seed)
		out = append(out, tok)
		pos++
	}
	return out
}

type fakeEngine struct {
	info        ShardInfo
	maxSessions int
	nCtx        int

	// grammarTime is what each session opened with a grammar reports as
	// its grammar time (GrammarTimer).
	grammarTime time.Duration

	mu sync.Mutex
	// onStep, if set, runs after every single-row (decode) step with the
	// number of such steps so far (tests kill a hop mid-generation).
	onStep func(steps int)
	// onForward, if set, runs after every Forward with the number of
	// Forwards so far (speculative windows are several rows).
	onForward func(n int)
	forwards  int
	// onClose, if set, runs when a session starts closing, before its
	// cells are freed (tests hold a dead epoch's cells).
	onClose func(Key)
	// broken, if set, is what every Forward fails with (a peer that
	// cannot compute the layers it claims).
	broken error
	// tamper, if set, may change every Forward's output (with the
	// number of Forwards so far): a hop that returns wrong activations.
	tamper func(forwards int, out *Output)
	// cache, if set, is the engine's prefix cache (prefix_test.go).
	cache *fakeCache
	// delay, if set, is each Forward's compute time per row and layer: a
	// slow machine (a prefill of n rows takes n × layers × delay).
	delay time.Duration
	// callDelay, if set, is each Forward's fixed cost whatever its rows
	// (a kernel's per-call overhead: rows batch almost free).
	callDelay   time.Duration
	refused     chan struct{} // closed at the first capacity refusal
	refusedOnce sync.Once
	sessions    map[Key]*fakeSession
	reserved    int
	steps       int
	// plain and verified count the tail's Forwards of one-row decode
	// steps it samples after, and of verification windows.
	plain, verified int
}

func newFakeEngine(start, end int) *fakeEngine {
	return &fakeEngine{info: ShardInfo{Start: start, End: end, ParentNLayer: fakeNLay, NEmbd: fakeEmbd, NCtx: 1024, MaxSessions: 4},
		maxSessions: 4, nCtx: 1024, sessions: map[Key]*fakeSession{}, refused: make(chan struct{})}
}

func (e *fakeEngine) Info() ShardInfo      { return e.info }
func (e *fakeEngine) IsEOG(tok int32) bool { return tok == 0 }

func (e *fakeEngine) OpenSession(key Key, p EngineParams) (EngineSession, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.sessions[key]; ok {
		return nil, fmt.Errorf("%w: session %s already open", ErrBadInput, key)
	}
	if len(e.sessions) >= e.maxSessions || e.reserved+p.KVTokens > e.nCtx {
		e.refusedOnce.Do(func() { close(e.refused) })
		return nil, fmt.Errorf("%w: %d sessions, %d of %d cells reserved", ErrNoCapacity, len(e.sessions), e.reserved, e.nCtx)
	}
	s := &fakeSession{e: e, key: key, kv: p.KVTokens}
	if sp := p.Sampling; sp != nil {
		s.seed = sp.GetSeed()
		if sp.GetGrammar() != "" {
			s.grammarTime = e.grammarTime
		}
	}
	e.sessions[key] = s
	e.reserved += p.KVTokens
	if e.cache != nil {
		return &cachedSession{fakeSession: s, c: e.cache, keepRows: p.KeepInputs && !e.info.IsHead()}, nil
	}
	return s, nil
}

// open counts sessions holding a slot.
func (e *fakeEngine) open() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.sessions)
}

type fakeSession struct {
	e           *fakeEngine
	key         Key
	kv          int
	seed        uint64
	grammarTime time.Duration

	mu      sync.Mutex
	nextPos int
	closed  bool
}

func (s *fakeSession) Forward(ctx context.Context, in Input) (Output, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	info := s.e.info
	if s.closed {
		return Output{}, fmt.Errorf("session closed")
	}
	s.e.mu.Lock()
	broken := s.e.broken
	s.e.mu.Unlock()
	if broken != nil {
		return Output{}, broken
	}
	if in.Pos != s.nextPos {
		return Output{}, fmt.Errorf("%w: position %d, want %d", ErrBadInput, in.Pos, s.nextPos)
	}
	var rows [][fakeEmbd]float32
	if info.IsHead() {
		for i, t := range in.Tokens {
			rows = append(rows, [fakeEmbd]float32{float32(t), float32(in.Pos + i), 0, 0})
		}
	} else {
		if len(in.Hidden)%fakeEmbd != 0 || len(in.Hidden) == 0 {
			return Output{}, fmt.Errorf("%w: %d hidden values", ErrBadInput, len(in.Hidden))
		}
		for i := 0; i < len(in.Hidden); i += fakeEmbd {
			var r [fakeEmbd]float32
			copy(r[:], in.Hidden[i:])
			if int(r[2]) != info.Start || int(r[1]) != in.Pos+i/fakeEmbd {
				return Output{}, fmt.Errorf("%w: row %v reached layers %d-%d at position %d", ErrBadInput, r, info.Start, info.End, in.Pos+i/fakeEmbd)
			}
			rows = append(rows, r)
		}
	}
	if s.nextPos+len(rows) > s.kv && s.kv > 0 {
		return Output{}, fmt.Errorf("%w: KV reservation of %d cells exceeded", ErrNoCapacity, s.kv)
	}
	s.nextPos += len(rows)
	s.e.mu.Lock()
	delay := s.e.callDelay + s.e.delay*time.Duration(len(rows)*(info.End-info.Start))
	s.e.mu.Unlock()
	time.Sleep(delay)
	s.e.mu.Lock()
	steps, onStep := -1, s.e.onStep
	if len(rows) == 1 {
		s.e.steps++
		steps = s.e.steps
	}
	s.e.forwards++
	if info.IsTail() && in.Verify {
		s.e.verified++
	} else if info.IsTail() && in.Sample && len(rows) == 1 {
		s.e.plain++
	}
	forwards, onForward := s.e.forwards, s.e.onForward
	s.e.mu.Unlock()
	if steps > 0 && onStep != nil {
		onStep(steps)
	}
	if onForward != nil {
		onForward(forwards)
	}
	var out Output
	for i := range rows {
		rows[i][2] += float32(info.End - info.Start)
	}
	if info.IsTail() {
		if in.Sample {
			last := rows[len(rows)-1]
			out.Token = nextToken(int32(last[0]), int(last[1]), s.seed)
		}
		if in.Verify {
			if len(in.Draft) != len(rows)-1 && len(in.Draft) != len(rows) {
				return Output{}, fmt.Errorf("%w: %d proposals for %d rows", ErrBadInput, len(in.Draft), len(rows))
			}
			for i, r := range rows {
				out.Token = nextToken(int32(r[0]), int(r[1]), s.seed)
				out.Tokens = append(out.Tokens, out.Token)
				if i >= len(in.Draft) || out.Token != in.Draft[i] {
					break
				}
			}
		}
		s.e.mu.Lock()
		tamper := s.e.tamper
		s.e.mu.Unlock()
		if tamper != nil {
			tamper(forwards, &out)
		}
		return out, nil
	}
	for _, r := range rows {
		out.Hidden = append(out.Hidden, r[:]...)
	}
	s.e.mu.Lock()
	tamper := s.e.tamper
	s.e.mu.Unlock()
	if tamper != nil {
		tamper(forwards, &out)
	}
	return out, nil
}

func (s *fakeSession) Truncate(_ context.Context, pos int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if pos < 0 || pos > s.nextPos {
		return fmt.Errorf("%w: truncate to %d, session at %d", ErrBadInput, pos, s.nextPos)
	}
	s.nextPos = pos
	return nil
}

func (s *fakeSession) GrammarTime() time.Duration { return s.grammarTime }

func (s *fakeSession) Close() {
	s.e.mu.Lock()
	onClose := s.e.onClose
	s.e.mu.Unlock()
	if onClose != nil {
		onClose(s.key)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.closed = true
	s.e.mu.Lock()
	delete(s.e.sessions, s.key)
	s.e.reserved -= s.kv
	s.e.mu.Unlock()
}

// testHost is a real libp2p host on loopback. It can pretend that streams
// to a peer run over a relay until punch(peer) "hole-punches" it: then it
// reports PathChanged like p2p.Node does, and new streams are direct.
type testHost struct {
	host.Host

	mu       sync.Mutex
	accepted map[protocol.ID][]*trackedStream
	relayed  map[peer.ID]bool
	// punchOnOpen: the path to a relayed peer turns direct right after a
	// stream to it opened on the relay, before anyone could subscribe.
	punchOnOpen bool
	onRelay     map[network.Stream]bool
	opened      map[protocol.ID]int
	subs        map[chan p2p.ConnEvent]bool
	// wrapOut, if set, wraps each stream this host opens (a test that
	// stalls writes: stallStream).
	wrapOut func(network.Stream) network.Stream
}

func newTestHost(t testing.TB) *testHost {
	t.Helper()
	return newTestHostRM(t, &network.NullResourceManager{})
}

// newTestHostRM is newTestHost with the resource manager rm.
func newTestHostRM(t testing.TB, rm network.ResourceManager) *testHost {
	t.Helper()
	h, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"), libp2p.DisableRelay(),
		libp2p.ResourceManager(rm))
	if err != nil {
		t.Fatal(err)
	}
	th := &testHost{Host: h, accepted: map[protocol.ID][]*trackedStream{}, relayed: map[peer.ID]bool{}, onRelay: map[network.Stream]bool{}, opened: map[protocol.ID]int{}, subs: map[chan p2p.ConnEvent]bool{}}
	t.Cleanup(func() { _ = h.Close() })
	return th
}

// trackedStream is an incoming stream that remembers its read deadline.
type trackedStream struct {
	network.Stream
	mu     sync.Mutex
	readDL time.Time
}

func (s *trackedStream) SetReadDeadline(t time.Time) error {
	s.mu.Lock()
	s.readDL = t
	s.mu.Unlock()
	return s.Stream.SetReadDeadline(t)
}

func (s *trackedStream) SetDeadline(t time.Time) error {
	s.mu.Lock()
	s.readDL = t
	s.mu.Unlock()
	return s.Stream.SetDeadline(t)
}

func (s *trackedStream) readDeadline() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.readDL
}

// SetStreamHandler hands the handler tracked streams.
func (h *testHost) SetStreamHandler(pid protocol.ID, handler network.StreamHandler) {
	h.Host.SetStreamHandler(pid, func(s network.Stream) {
		ts := &trackedStream{Stream: s}
		h.mu.Lock()
		h.accepted[pid] = append(h.accepted[pid], ts)
		h.mu.Unlock()
		handler(ts)
	})
}

func (h *testHost) acceptedStreams(pid protocol.ID) []*trackedStream {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]*trackedStream(nil), h.accepted[pid]...)
}

func (h *testHost) ProtocolID(name, version string) protocol.ID {
	return protocol.ID("/meshp2p/test/" + name + "/" + version)
}
func (h *testHost) Protect(p peer.ID, tag string)        { h.ConnManager().Protect(p, tag) }
func (h *testHost) Unprotect(p peer.ID, tag string) bool { return h.ConnManager().Unprotect(p, tag) }

func (h *testHost) NewStream(ctx context.Context, p peer.ID, pids ...protocol.ID) (network.Stream, error) {
	s, err := h.Host.NewStream(ctx, p, pids...)
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	h.opened[s.Protocol()]++
	if h.relayed[p] {
		h.onRelay[s] = true
	}
	punch, wrap := h.punchOnOpen && h.relayed[p], h.wrapOut
	h.mu.Unlock()
	if punch {
		h.punch(p)
	}
	if wrap != nil {
		return wrap(s), nil
	}
	return s, nil
}

func (h *testHost) PathTo(p peer.ID) p2p.Path {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.relayed[p] {
		return p2p.PathRelayed
	}
	return p2p.PathDirect
}

func (h *testHost) streamsOpened(pid protocol.ID) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.opened[pid]
}

func (h *testHost) StreamPath(s network.Stream) p2p.Path {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.onRelay[s] {
		return p2p.PathRelayed
	}
	return p2p.PathDirect
}

func (h *testHost) SubscribeConn(ctx context.Context) <-chan p2p.ConnEvent {
	ch := make(chan p2p.ConnEvent, 8)
	h.mu.Lock()
	h.subs[ch] = true
	h.mu.Unlock()
	go func() {
		<-ctx.Done()
		h.mu.Lock()
		delete(h.subs, ch)
		close(ch)
		h.mu.Unlock()
	}()
	return ch
}

// relay makes streams to p opened from now on count as relayed.
func (h *testHost) relay(p peer.ID) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.relayed[p] = true
}

// punch turns the path to p direct and tells the subscribers.
func (h *testHost) punch(p peer.ID) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.relayed[p] = false
	for ch := range h.subs {
		select {
		case ch <- p2p.ConnEvent{Kind: p2p.PathChanged, Peer: p, Status: p2p.ConnStatus{Path: p2p.PathDirect}, At: time.Now()}:
		default:
		}
	}
}

// connect makes every host know every other host's addresses.
func connectAll(hosts ...*testHost) {
	for _, a := range hosts {
		for _, b := range hosts {
			if a != b {
				a.Peerstore().AddAddrs(b.ID(), b.Addrs(), time.Hour)
			}
		}
	}
}

// fakeHop is one hop of a test swarm.
type fakeHop struct {
	host *testHost
	eng  *fakeEngine
	svc  *HopService
	// advertised is the kernel class its route hops carry (its advert's;
	// "": unknown).
	advertised string
	// msPerLayer is the decode time per layer its route hops carry (its
	// advert's; 0: unknown).
	msPerLayer float64
}

func startHop(t testing.TB, start, end int, tweak func(*HopConfig)) *fakeHop {
	t.Helper()
	return startHopOn(t, newTestHost(t), start, end, tweak)
}

// startHopOn is startHop on the host h.
func startHopOn(t testing.TB, h *testHost, start, end int, tweak func(*HopConfig)) *fakeHop {
	t.Helper()
	e := newFakeEngine(start, end)
	cfg := HopConfig{Fingerprint: fakeFP, Idle: 20 * time.Second, OpenTimeout: 10 * time.Second, Logger: quiet}
	if tweak != nil {
		tweak(&cfg)
	}
	svc := NewHopService(h, e, cfg)
	t.Cleanup(svc.Close)
	return &fakeHop{host: h, eng: e, svc: svc}
}

// kill ends the hop like a crashed process: every connection to it drops
// and it sends nothing more. It drops its connections to the others first
// (the origin first, as given), so that to them the close is the remote's,
// as a crash looks; then its host closes. (The others closing their ends
// would look to them like their own doing: a hop that closes its own link
// blames itself, see TestHopClosingItsOwnLinkBlamesItself.)
func (f *fakeHop) kill(others ...*testHost) {
	for _, h := range others {
		if h != f.host {
			_ = f.host.Network().ClosePeer(h.ID())
			h.Peerstore().ClearAddrs(f.host.ID())
		}
	}
	_ = f.host.Close()
}

// killAtStep kills f during its n-th decode step: judged on the hop, since
// the ring does not wait for the origin, which may see token n only after
// the ring has finished.
func (f *fakeHop) killAtStep(n int, others ...*testHost) {
	var once sync.Once
	f.eng.mu.Lock()
	defer f.eng.mu.Unlock()
	f.eng.onStep = func(steps int) {
		if steps >= n {
			once.Do(func() { f.kill(others...) })
		}
	}
}

// killAtForward kills f during its n-th Forward (a speculative window is
// one Forward of several rows), before that Forward's output leaves the
// hop. The kill must finish inside the Forward: a kill left to another
// goroutine races the generation, which on copyable text is a few dozen
// windows and can end before the kill lands, so no hop ever fails.
func (f *fakeHop) killAtForward(n int, others ...*testHost) {
	var once sync.Once
	f.eng.mu.Lock()
	defer f.eng.mu.Unlock()
	f.eng.onForward = func(forwards int) {
		if forwards >= n {
			once.Do(func() { f.kill(others...) })
		}
	}
}

func hostsOf(hops ...*fakeHop) []*testHost {
	var out []*testHost
	for _, h := range hops {
		out = append(out, h.host)
	}
	return out
}

func (f *fakeHop) hop() route.Hop {
	return route.Hop{Peer: f.host.ID(), Start: f.eng.info.Start, End: f.eng.info.End, Addrs: f.host.Addrs(), KernelClass: f.advertised, MsPerLayer: f.msPerLayer}
}

// stagePlanner plans the first usable candidate of every stage (a stage is
// a list of hops serving the same range), skipping excluded peers.
type stagePlanner struct{ stages [][]*fakeHop }

func (p stagePlanner) Plan(_ context.Context, req route.Request) (*route.Route, error) {
	rt := &route.Route{Fingerprint: req.Fingerprint, NLayer: req.NLayer, Epoch: req.Epoch}
	for _, st := range p.stages {
		found := false
		for _, f := range st {
			if !req.Exclude[f.host.ID()] {
				rt.Hops = append(rt.Hops, f.hop())
				found = true
				break
			}
		}
		if !found {
			return nil, &route.NoRouteError{Fingerprint: req.Fingerprint, NLayer: req.NLayer, MissingStart: st[0].eng.info.Start, MissingEnd: st[0].eng.info.End}
		}
	}
	return rt, nil
}

func newOrigin(t testing.TB, pl route.Planner, hops ...*fakeHop) (*Origin, *testHost) {
	t.Helper()
	c := newTestHost(t)
	hosts := []*testHost{c}
	for _, h := range hops {
		hosts = append(hosts, h.host)
	}
	connectAll(hosts...)
	return &Origin{Dialer: c, Key: c.key(), Planner: pl, Protocol: c.ProtocolID(ProtoSession, ProtoVersion), RouteWait: -1, Logger: quiet}, c
}

// waitReleased waits until no hop holds a session or an engine slot.
func waitReleased(t testing.TB, hops ...*fakeHop) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for _, h := range hops {
		for h.svc.Sessions() > 0 || h.eng.open() > 0 {
			if time.Now().After(deadline) {
				t.Fatalf("hop %d-%d still holds %d sessions, %d engine sessions", h.eng.info.Start, h.eng.info.End, h.svc.Sessions(), h.eng.open())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// key is the host's libp2p key (an origin signs its opens with it).
func (h *testHost) key() crypto.PrivKey { return h.Peerstore().PrivKey(h.ID()) }

// signedBy signs open as origin c (SignOpen) and returns it.
func signedBy(t testing.TB, c *testHost, open *meshp2pb.SessionOpen) *meshp2pb.SessionOpen {
	t.Helper()
	if err := SignOpen(open, c.key(), time.Now()); err != nil {
		t.Fatal(err)
	}
	return open
}
