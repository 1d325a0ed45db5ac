package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"google.golang.org/protobuf/proto"

	"github.com/neuron-tai/meshp2p/engine"
	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/internal/testmodels"
	"github.com/neuron-tai/meshp2p/internal/testmodels/local"
	"github.com/neuron-tai/meshp2p/p2p"
	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/route"
	"github.com/neuron-tai/meshp2p/session"
	"github.com/neuron-tai/meshp2p/vocab"
)

// testNet is a swarm of in-process nodes on loopback.
type testNet struct {
	t       testing.TB
	network string
	boot    []peer.AddrInfo
}

var netSeq atomic.Int64

func newTestNet(t testing.TB) *testNet {
	return &testNet{t: t, network: fmt.Sprintf("t%d-%d", os.Getpid(), netSeq.Add(1))}
}

func (tn *testNet) config(dir string) Config {
	pc := Preset(PresetTest)
	pc.Network = tn.network
	pc.DataDir = dir
	pc.Bootstrap = tn.boot
	ec := engine.Config{NCtx: 512, NBatch: 64, MaxSessions: 4, Threads: 1}
	// One test client stands in for many (concurrent sessions), and the
	// 512-cell shards run 400-token generations: no per-session cap or
	// per-origin quota but the engine's (session tests cover those).
	return Config{P2P: pc, Engine: ec, Hop: session.HopConfig{Idle: 20 * time.Second, OpenTimeout: 10 * time.Second,
		MaxSessionKV: -1, MaxSessionsPerPeer: -1, MaxKVPerPeer: -1}}
}

// clientPreset turns a test node's p2p config into the client preset's
// (DHT client), keeping the test's network, directory, listen addresses and
// bootstrap peers.
func clientPreset(c p2p.Config) p2p.Config {
	pc := TestRelax(Preset(PresetClient))
	pc.Network, pc.DataDir, pc.Bootstrap, pc.ListenAddrs = c.Network, c.DataDir, c.Bootstrap, c.ListenAddrs
	return pc
}

// shard starts a node serving layers r of model; the first node becomes
// everyone's bootstrap peer.
func (tn *testNet) shard(model string, r gguf.Range) *Node {
	return tn.shardWith(model, &r, nil)
}

// shardWith is shard with a configuration tweak; a nil range serves all
// layers.
func (tn *testNet) shardWith(model string, r *gguf.Range, tweak func(*Config)) *Node {
	tn.t.Helper()
	cfg := tn.config(tn.t.TempDir())
	cfg.ModelPath, cfg.Layers = model, r
	if tweak != nil {
		tweak(&cfg)
	}
	n, err := Start(context.Background(), cfg)
	if err != nil {
		tn.t.Fatalf("start node %v: %v", r, err)
	}
	tn.t.Cleanup(func() { n.Close() })
	if tn.boot == nil {
		tn.boot = []peer.AddrInfo{n.P2P().AddrInfo()}
	}
	return n
}

// client starts a node without weights on the client preset, as
// `meshp2p generate` does.
func (tn *testNet) client() *Node {
	tn.t.Helper()
	cfg := tn.config(tn.t.TempDir())
	cfg.P2P = clientPreset(cfg.P2P)
	n, err := Start(context.Background(), cfg)
	if err != nil {
		tn.t.Fatal(err)
	}
	tn.t.Cleanup(func() { n.Close() })
	return n
}

// localTokens runs the whole model in-process, greedy: the reference.
func localTokens(t *testing.T, model string, prompt []int32, n int) []int32 {
	t.Helper()
	return localSampled(t, model, prompt, n, nil)
}

func thinClientPrompt(t *testing.T, c *Node, fp, text string) []int32 {
	t.Helper()
	var holder peer.ID
	for _, s := range c.Table().Shards(fp) {
		if s.HasVocab {
			holder = s.Peer
		}
	}
	if holder == "" {
		t.Fatal("no peer advertises the vocabulary")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	path, err := vocab.Fetch(ctx, c.host, holder, fp, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	v, err := engine.LoadModel(ctx, path, engine.LoadOptions{VocabOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	toks, err := v.Tokenize(text, true, false)
	if err != nil {
		t.Fatal(err)
	}
	return toks
}

func equalTokens(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func waitModel(t *testing.T, c *Node, name string) (string, int) {
	t.Helper()
	fp, n, err := waitForModel(context.Background(), c, name, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return fp, n
}

// A model split over 3 nodes answers a thin client (no weights, vocabulary
// fetched from a peer) exactly like the whole model in-process.
func TestSwarmMatchesLocal(t *testing.T) {
	model := testmodels.Path(t, "stories260K.gguf")
	tn := newTestNet(t)
	for _, r := range gguf.EvenSplit(5, 3) {
		tn.shard(model, r)
	}
	c := tn.client()
	fp, nl := waitModel(t, c, "stories260K")
	for _, s := range c.Table().Shards(fp) {
		// Measured at start; the tracker's cost model reads it.
		if s.DecodeMsPerLayer <= 0 || s.Capacity.GetFreeSessions() == 0 {
			t.Fatalf("advert of %s lacks measured speed or capacity: %+v", s.Peer, s)
		}
	}
	prompt := thinClientPrompt(t, c, fp, "Once upon a time")
	want := localTokens(t, model, prompt, 24)
	for _, wire := range []meshp2pb.DType{meshp2pb.DType_DTYPE_F32, meshp2pb.DType_DTYPE_F16} {
		res, err := c.Origin(nil).Generate(context.Background(), session.GenerateRequest{Fingerprint: fp, NLayer: nl, Prompt: prompt, MaxTokens: 24, WireDType: wire})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Route.Hops) != 3 || res.Reroutes != 0 {
			t.Fatalf("route %+v reroutes %d", res.Route.Hops, res.Reroutes)
		}
		same := 0
		for same < len(want) && same < len(res.Tokens) && want[same] == res.Tokens[same] {
			same++
		}
		t.Logf("wire %s: %d/%d tokens equal to local; TTFT %s, hops %+v", wire, same, len(want), res.TTFT, res.HopStats)
		switch wire {
		case meshp2pb.DType_DTYPE_F32:
			if !equalTokens(res.Tokens, want) {
				t.Fatalf("f32 wire: swarm %v\nlocal %v", res.Tokens, want)
			}
		default:
			// f16 is "close, not identical" (docs/architecture.md): on F32
			// weights the measured greedy output stayed identical; demand
			// at least the first 8 tokens.
			if same < 8 {
				t.Fatalf("f16 wire diverged after %d tokens: %v vs %v", same, res.Tokens, want)
			}
		}
	}
	assertReleased(t, tn, c)
}

// assertReleased waits until no hop holds a session any more.
func assertReleased(t *testing.T, tn *testNet, nodes ...*Node) {
	t.Helper()
	_ = tn
	deadline := time.Now().Add(10 * time.Second)
	for _, n := range nodes {
		for n.Hop() != nil && n.Hop().Sessions() > 0 {
			if time.Now().After(deadline) {
				t.Fatalf("node %s still holds %d sessions", n.P2P().ID(), n.Hop().Sessions())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// Killing the middle node mid-generation re-routes through a spare and
// the answer is identical; with no spare the error names the gap.
func TestKillMiddleNode(t *testing.T) {
	model := testmodels.Path(t, "stories260K.gguf")
	for _, spare := range []bool{true, false} {
		t.Run(fmt.Sprintf("spare=%v", spare), func(t *testing.T) {
			tn := newTestNet(t)
			head := tn.shard(model, gguf.Range{Start: 0, End: 2})
			mids := []*Node{tn.shard(model, gguf.Range{Start: 2, End: 4})}
			if spare {
				mids = append(mids, tn.shard(model, gguf.Range{Start: 2, End: 4}))
			}
			tail := tn.shard(model, gguf.Range{Start: 4, End: 5})
			c := tn.client()
			fp, nl := waitModel(t, c, "stories260K")
			if spare { // both middles must be known before we start
				deadline := time.Now().Add(30 * time.Second)
				for len(c.Table().Shards(fp)) < 4 && time.Now().Before(deadline) {
					// A late joiner asks the DHT instead of waiting for
					// the next gossip round.
					lctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
					_, _ = c.P2P().Discovery().Lookup(lctx, fp)
					cancel()
					time.Sleep(50 * time.Millisecond)
				}
			}
			prompt := thinClientPrompt(t, c, fp, "Once upon a time")
			const maxTok = 400
			want := localTokens(t, model, prompt, maxTok)
			// Kill the middle node once 3 decode steps have passed through
			// it: judged on the hop, not by the origin, because the ring
			// does not wait for the origin and a starved origin could see
			// token 3 only after the ring has finished.
			killed := killMiddleAfter(mids, 3, head, tail)
			o := c.Origin(nil)
			o.RouteWait = time.Second // no replacement is coming in the no-spare case
			res, err := o.Generate(context.Background(), session.GenerateRequest{Fingerprint: fp, NLayer: nl, Prompt: prompt, MaxTokens: maxTok})
			if killed() == nil {
				t.Fatal("no middle node was serving the session")
			}
			if !spare {
				var nr *route.NoRouteError
				if !errors.As(err, &nr) || nr.MissingStart != 2 || nr.MissingEnd != 4 {
					t.Fatalf("want a no-route error naming layers 2-4, got %v", err)
				}
				t.Logf("error as the user sees it: %v", err)
				assertReleased(t, tn, head, tail)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if res.Reroutes != 1 || !equalTokens(res.Tokens, want) {
				t.Fatalf("reroutes %d\nswarm %v\nlocal %v", res.Reroutes, res.Tokens, want)
			}
			if res.Route.Hops[1].Peer == killed().P2P().ID() {
				t.Fatal("final route still uses the killed node")
			}
			t.Logf("recovered after %v", res.Failures)
			assertReleased(t, tn, head, tail, mids[0], mids[1])
		})
	}
}

// A hop refuses a session for another model or another range with the
// matching error code, and keeps serving.
func TestHopRefusesMismatch(t *testing.T) {
	model := testmodels.Path(t, "stories260K.gguf")
	tn := newTestNet(t)
	a := tn.shard(model, gguf.Range{Start: 0, End: 3})
	b := tn.shard(model, gguf.Range{Start: 3, End: 5})
	c := tn.client()
	fp, nl := waitModel(t, c, "stories260K")
	hop := func(n *Node, s, e int) route.Hop {
		return route.Hop{Peer: n.P2P().ID(), Start: s, End: e, Addrs: n.P2P().Addrs()}
	}
	cases := []struct {
		name string
		rt   route.Route
		code meshp2pb.ErrorCode
	}{
		{"wrong model", route.Route{Fingerprint: "00" + fp[2:], NLayer: nl, Hops: []route.Hop{hop(a, 0, 3), hop(b, 3, 5)}}, meshp2pb.ErrorCode_ERROR_CODE_MODEL_MISMATCH},
		{"wrong range", route.Route{Fingerprint: fp, NLayer: nl, Hops: []route.Hop{hop(a, 0, 2), hop(b, 2, 5)}}, meshp2pb.ErrorCode_ERROR_CODE_RANGE_MISMATCH},
	}
	for _, tc := range cases {
		o := c.Origin(fixedPlanner{&tc.rt})
		_, err := o.Generate(context.Background(), session.GenerateRequest{Fingerprint: tc.rt.Fingerprint, NLayer: nl, Prompt: []int32{1, 2, 3}, MaxTokens: 4})
		if err == nil || !containsCode(err, tc.code) {
			t.Errorf("%s: got %v, want %s", tc.name, err, tc.code)
		}
	}
	// A stranger (the client) cannot open a session at the second hop
	// pretending to be the first.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := c.host.NewStream(ctx, b.P2P().ID(), c.host.ProtocolID(session.ProtoSession, session.ProtoVersion))
	if err != nil {
		t.Fatal(err)
	}
	pr := &meshp2pb.Route{ModelFingerprint: fp, NLayer: uint32(nl), Epoch: 1, Hops: []*meshp2pb.RouteHop{
		{PeerId: []byte(a.P2P().ID()), Start: 0, End: 3}, {PeerId: []byte(b.P2P().ID()), Start: 3, End: 5}}}
	open := &meshp2pb.SessionOpen{SessionId: make([]byte, 16), Epoch: 1, ModelFingerprint: fp, Route: pr, HopIndex: 1, NCtxNeeded: 16}
	signOpen(t, c, open)
	if err := frame.NewWriter(s, frame.Limits{}).WriteStream(&meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Open{Open: open}}); err != nil {
		t.Fatal(err)
	}
	msg, _, err := frame.NewReader(s, frame.Limits{}).ReadStream()
	_ = s.Close()
	if err != nil || msg.GetAccept().GetOk() || msg.GetAccept().GetError().GetCode() != meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST {
		t.Fatalf("spliced session open: %v %v", msg, err)
	}
	// Still serving.
	res, err := c.Origin(nil).Generate(context.Background(), session.GenerateRequest{Fingerprint: fp, NLayer: nl, Prompt: []int32{1, 2, 3}, MaxTokens: 4})
	if err != nil || len(res.Tokens) != 4 {
		t.Fatalf("after refusals: %v %v", res, err)
	}
	_ = p2p.PathDirect
}

type fixedPlanner struct{ rt *route.Route }

func (f fixedPlanner) Plan(_ context.Context, req route.Request) (*route.Route, error) {
	cp := *f.rt
	cp.Epoch = req.Epoch
	return &cp, nil
}

func containsCode(err error, code meshp2pb.ErrorCode) bool {
	return err != nil && (errors.Is(err, errCode(code)) || contains(err.Error(), code.String()))
}

type errCode meshp2pb.ErrorCode

func (e errCode) Error() string { return meshp2pb.ErrorCode(e).String() }

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

// Nodes can serve shard files cut beforehand (meshp2p shard split), so a
// machine needs only its own layers; a shard started with other --layers
// is refused.
func TestPreCutShards(t *testing.T) {
	model := testmodels.Path(t, "stories260K.gguf")
	res, err := gguf.Split(context.Background(), model, gguf.EvenSplit(5, 3), t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	tn := newTestNet(t)
	for _, r := range res {
		tn.shardWith(r.Path, nil, nil)
	}
	cfg := tn.config(t.TempDir())
	cfg.ModelPath, cfg.Layers = res[0].Path, &gguf.Range{Start: 0, End: 3}
	if _, err := Start(context.Background(), cfg); err == nil || !contains(err.Error(), "not --layers 0-3") {
		t.Fatalf("shard with other --layers: %v", err)
	}
	c := tn.client()
	fp, nl := waitModel(t, c, "stories260K")
	prompt := thinClientPrompt(t, c, fp, "Once upon a time")
	got, err := c.Origin(nil).Generate(context.Background(), session.GenerateRequest{Fingerprint: fp, NLayer: nl, Prompt: prompt, MaxTokens: 16})
	if err != nil {
		t.Fatal(err)
	}
	if want := localTokens(t, model, prompt, 16); !equalTokens(got.Tokens, want) {
		t.Fatalf("swarm %v local %v", got.Tokens, want)
	}
}

// localSampled runs the whole model in-process with sampling sp (nil:
// greedy), through the same conversion the tail uses
// (engine.SamplingFromProto), as `generate --local` does.
func localSampled(t *testing.T, model string, prompt []int32, n int, sp *meshp2pb.SamplingParams) []int32 {
	t.Helper()
	return local.Tokens(t, model, prompt, n, sp)
}

// Sampling at temperature 0.8 with a seed above 2^32 and repeat_last_n -1
// gives the same tokens through a 3-hop swarm as in-process (`--local`):
// the seed keeps all 64 bits on the wire and -1 means the whole context on
// both paths.
func TestSampledSwarmMatchesLocal(t *testing.T) {
	model := testmodels.Path(t, "stories260K.gguf")
	tn := newTestNet(t)
	for _, r := range gguf.EvenSplit(5, 3) {
		tn.shard(model, r)
	}
	c := tn.client()
	fp, nl := waitModel(t, c, "stories260K")
	prompt := []int32{1, 403, 407, 261}
	const maxTok = 32
	sp := &meshp2pb.SamplingParams{Temperature: 0.8, TopK: 40, TopP: 0.95, MinP: 0.05, RepeatPenalty: 1.1, RepeatLastN: -1, Seed: 1<<40 + 12345}
	res, err := c.Origin(nil).Generate(context.Background(), session.GenerateRequest{Fingerprint: fp, NLayer: nl, Prompt: prompt, MaxTokens: maxTok, Sampling: sp})
	if err != nil {
		t.Fatal(err)
	}
	want := localSampled(t, model, prompt, maxTok, sp)
	if !equalTokens(res.Tokens, want) {
		t.Fatalf("swarm %v\nlocal %v", res.Tokens, want)
	}
	// The high bits of the seed matter: the seed cut to 32 bits (what the
	// wire used to carry) samples something else.
	cut := proto.Clone(sp).(*meshp2pb.SamplingParams)
	cut.Seed = uint64(uint32(sp.Seed))
	if equalTokens(localSampled(t, model, prompt, maxTok, cut), want) {
		t.Fatal("a 32-bit seed gives the same tokens: this test does not exercise the seed width")
	}
}

// killMiddleAfter kills the first of mids that has served steps decode
// steps of a session (judged on the hop, not by the origin: the ring does
// not wait for the origin, and a starved origin could see the token only
// after the ring finished). Abrupt: the host goes away (no advert
// withdrawal, no goodbye), streams reset. It drops its connections to
// neighbours first, in order, so that to them the close is the remote's,
// as a crash looks. (Closing the host alone closes its connections one by
// one; the dying hop may then report its own close, blaming itself:
// TestOriginMetricsFollowAReroute runs that.) The returned func stops the
// watch and returns the node it killed (nil: none).
func killMiddleAfter(mids []*Node, steps int, neighbours ...*Node) func() *Node {
	var killed atomic.Pointer[Node]
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			for _, m := range mids {
				if m.Hop().Sessions() > 0 && m.Hop().DecodeSteps() >= steps {
					killed.Store(m)
					for _, n := range neighbours {
						_ = m.P2P().Host().Network().ClosePeer(n.P2P().ID())
					}
					_ = m.P2P().Host().Close()
					return
				}
			}
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	var once sync.Once
	return func() *Node {
		once.Do(func() { close(stop); <-done })
		return killed.Load()
	}
}
