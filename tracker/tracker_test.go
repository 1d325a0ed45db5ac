package tracker

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"log/slog"
	"math"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"google.golang.org/protobuf/proto"

	"github.com/neuron-tai/meshp2p/p2p"
	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/route"
)

// These tests run a real tracker and real p2p nodes on loopback. Shard
// nodes are plain p2p nodes that publish a capability advert (no model,
// no engine): the tracker plans over adverts only.

var quiet = slog.New(slog.DiscardHandler)

const testNLayer = 6

// swarm is one test network: a tracker and the nodes bootstrapped from it.
type swarm struct {
	t       *testing.T
	network string
	tr      *Tracker
}

func testP2P(t *testing.T, network string, boot []peer.AddrInfo) p2p.Config {
	return p2p.Config{Network: network, Role: "test", DataDir: t.TempDir(), ListenAddrs: []string{"/ip4/127.0.0.1/tcp/0"},
		Bootstrap: boot, TestMode: p2p.TestOptions{RelaxedCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}, Logger: quiet}
}

func newSwarm(t *testing.T, tweak func(*Config)) *swarm {
	t.Helper()
	b := make([]byte, 4)
	_, _ = crand.Read(b)
	sw := &swarm{t: t, network: "trtest-" + hex.EncodeToString(b)}
	pc := testP2P(t, sw.network, nil)
	pc.RelayService, pc.ForceReachability = true, p2p.ReachabilityPublic
	// The shards here are adverts without a model: the layer count the
	// fingerprint binds is testNLayer (real vocabularies: testswarm).
	cfg := Config{P2P: pc, PingInterval: time.Hour, Logger: quiet,
		VerifyLayers: func(context.Context, string) (int, error) { return testNLayer, nil }}
	if tweak != nil {
		tweak(&cfg)
	}
	tr, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.Close() })
	sw.tr = tr
	return sw
}

// node starts a p2p node bootstrapped from the tracker.
func (sw *swarm) node() *p2p.Node {
	sw.t.Helper()
	n, err := p2p.New(context.Background(), testP2P(sw.t, sw.network, []peer.AddrInfo{sw.tr.P2P().AddrInfo()}))
	if err != nil {
		sw.t.Fatal(err)
	}
	sw.t.Cleanup(func() { _ = n.Close() })
	if err := n.Connect(context.Background(), sw.tr.P2P().AddrInfo()); err != nil {
		sw.t.Fatal(err)
	}
	return n
}

func testFP(c byte) string { return strings.Repeat(string([]byte{c}), 64) }

func shardAdvert(id peer.ID, network, fp string, nl, start, end, maxSessions int) *meshp2pb.CapabilityAdvert {
	return &meshp2pb.CapabilityAdvert{PeerId: []byte(id), Network: network, Roles: []meshp2pb.Role{meshp2pb.Role_ROLE_SHARD},
		Shards: []*meshp2pb.ShardAdvert{{ModelFingerprint: fp, ModelName: "test", NLayer: uint32(nl), Start: uint32(start), End: uint32(end), NEmbd: 64,
			Capacity: &meshp2pb.ShardCapacity{FreeSessions: uint32(maxSessions), MaxSessions: uint32(maxSessions), FreeKvTokens: 4096, NCtx: 4096}}}}
}

// shard starts a node advertising layers [start, end) of fp with
// maxSessions free sessions.
func (sw *swarm) shard(fp string, start, end, maxSessions int) *p2p.Node {
	sw.t.Helper()
	n := sw.node()
	body, err := proto.Marshal(shardAdvert(n.ID(), sw.network, fp, testNLayer, start, end, maxSessions))
	if err != nil {
		sw.t.Fatal(err)
	}
	if err := n.Discovery().SetLocalAdvert([]string{fp}, body); err != nil {
		sw.t.Fatal(err)
	}
	return n
}

// waitShards waits until the tracker's table lists n shards of fp.
func (sw *swarm) waitShards(fp string, n int) {
	sw.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for len(sw.tr.Table().Shards(fp)) < n {
		if time.Now().After(deadline) {
			sw.t.Fatalf("tracker lists %d shards of %.12s, want %d", len(sw.tr.Table().Shards(fp)), fp, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ask sends one RouteRequest from c to the tracker over the route protocol.
func (sw *swarm) ask(c *p2p.Node, req *meshp2pb.RouteRequest) *meshp2pb.RouteResponse {
	sw.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := c.Host().NewStream(ctx, sw.tr.ID(), c.ProtocolID(route.ProtoRoute, route.ProtoRouteVersion))
	if err != nil {
		sw.t.Fatal(err)
	}
	defer s.Close()
	if err := frame.WriteMessage(s, req); err != nil {
		sw.t.Fatal(err)
	}
	_ = s.CloseWrite()
	var resp meshp2pb.RouteResponse
	if err := frame.ReadMessage(s, &resp, frame.Limits{}); err != nil {
		sw.t.Fatal(err)
	}
	return &resp
}

// A RouteRequest's n_layer is a peer's number: the tracker refuses 0,
// counts above what any model can have, and counts that differ from the
// advertised one, with a clear code and before planning sizes anything by
// it (it used to allocate per requested layer: 2^22 took ~260 MiB, 2^32-1
// asked for ~260 GiB).
func TestTrackerRouteRequestLayerCount(t *testing.T) {
	sw := newSwarm(t, nil)
	fp := testFP('a')
	sw.shard(fp, 0, testNLayer, 4)
	sw.waitShards(fp, 1)
	c := sw.node()
	bad, mismatch := meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, meshp2pb.ErrorCode_ERROR_CODE_MODEL_MISMATCH
	for _, tc := range []struct {
		name   string
		fp     string
		nLayer uint32
		want   meshp2pb.ErrorCode // UNSPECIFIED: a ticket
	}{
		{"advertised", fp, testNLayer, meshp2pb.ErrorCode_ERROR_CODE_UNSPECIFIED},
		{"zero", fp, 0, bad},
		{"above llama.cpp's limit", fp, 513, bad},
		{"2^22, unknown model", testFP('b'), 1 << 22, bad},
		{"2^32-1, unknown model", testFP('b'), math.MaxUint32, bad},
		{"2^32-1, known model", fp, math.MaxUint32, bad},
		{"differs from advertised", fp, testNLayer + 1, mismatch},
		{"unknown model", testFP('b'), testNLayer, mismatch},
	} {
		resp := sw.ask(c, &meshp2pb.RouteRequest{ModelFingerprint: tc.fp, NLayer: tc.nLayer, Epoch: 1})
		got := resp.GetError().GetCode()
		if got != tc.want || (tc.want == meshp2pb.ErrorCode_ERROR_CODE_UNSPECIFIED) != (resp.GetTicket() != nil) {
			t.Errorf("%s: got %s (%q), ticket %v; want %s", tc.name, got, resp.GetError().GetMessage(), resp.GetTicket() != nil, tc.want)
		}
	}

	// And in memory: refusing 2^22 layers allocates next to nothing.
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	resp := sw.tr.answer(context.Background(), c.ID(), &meshp2pb.RouteRequest{ModelFingerprint: testFP('b'), NLayer: 1 << 22, Epoch: 1})
	runtime.ReadMemStats(&after)
	if n := after.TotalAlloc - before.TotalAlloc; n > 16<<20 {
		t.Errorf("refusing n_layer 2^22 allocated %d MiB (%s)", n>>20, resp.GetError().GetCode())
	}
}

// Without a vocabulary to prove a model's layer count the tracker refuses
// with MODEL_MISMATCH saying so; it never falls back to a vote over
// adverts (here: no peer advertises a vocabulary).
func TestTrackerRefusesUnverifiedLayerCount(t *testing.T) {
	sw := newSwarm(t, func(c *Config) { c.VerifyLayers = nil })
	fp := testFP('a')
	sw.shard(fp, 0, testNLayer, 4)
	sw.waitShards(fp, 1)
	resp := sw.ask(sw.node(), &meshp2pb.RouteRequest{ModelFingerprint: fp, NLayer: testNLayer, Epoch: 1})
	if e := resp.GetError(); e.GetCode() != meshp2pb.ErrorCode_ERROR_CODE_MODEL_MISMATCH || !strings.Contains(e.GetMessage(), "vocabulary") {
		t.Fatalf("got %s (%q), ticket %v; want MODEL_MISMATCH naming the missing vocabulary", e.GetCode(), e.GetMessage(), resp.GetTicket() != nil)
	}
}

// One client flooding route requests cannot starve a ticket swarm: its
// requests are rate limited and the load its unused tickets add is
// capped, so an honest second client still gets a route. (Every ticket
// used to count as a session for PendingWindow with no per-client quota:
// 16 requests refused every route of a two-replica swarm.)
func TestTrackerTicketFloodQuota(t *testing.T) {
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	sw := newSwarm(t, func(c *Config) { c.Now = clock })
	fp := testFP('c')
	const maxSessions = 4
	sw.shard(fp, 0, testNLayer, maxSessions)
	sw.shard(fp, 0, testNLayer, maxSessions)
	sw.waitShards(fp, 2)
	flooder, honest := sw.node(), sw.node()
	req := &meshp2pb.RouteRequest{ModelFingerprint: fp, NLayer: testNLayer, Epoch: 1}
	issued, limited, noRoute := 0, 0, 0
	for range 4 * 2 * maxSessions {
		resp := sw.ask(flooder, req)
		switch {
		case resp.GetTicket() != nil:
			issued++
		case resp.GetError().GetCode() == meshp2pb.ErrorCode_ERROR_CODE_NO_CAPACITY && resp.GetError().GetRetryAfterMs() > 0:
			limited++
		default:
			noRoute++
		}
	}
	t.Logf("flooding client: %d tickets, %d rate limited, %d other refusals", issued, limited, noRoute)
	if limited == 0 || issued > RouteRequestBurst {
		t.Errorf("flooding client got %d tickets and %d rate-limit refusals; want at most %d tickets", issued, limited, RouteRequestBurst)
	}
	resp := sw.ask(honest, req)
	if resp.GetTicket() == nil {
		t.Fatalf("honest client refused while another floods: %v", resp.GetError())
	}
	if _, err := route.VerifyTicket(resp.GetTicket(), route.VerifyOptions{Trusted: []peer.ID{sw.tr.ID()}, Network: sw.network, Fingerprint: fp, NLayer: testNLayer}); err != nil {
		t.Fatal(err)
	}
	// Time refills the flooder's bucket.
	mu.Lock()
	now = now.Add(time.Minute)
	mu.Unlock()
	if resp := sw.ask(flooder, req); resp.GetTicket() == nil {
		t.Fatalf("flooding client after a minute: %v", resp.GetError())
	}
}

// The relay serves only peers connected to the tracker directly: what the
// peerstore still remembers of a peer that is gone (its protocols, from
// identify) is not enough.
func TestTrackerRelayMembership(t *testing.T) {
	sw := newSwarm(t, nil)
	fp := testFP('d')
	n := sw.shard(fp, 0, testNLayer, 4)
	sw.waitShards(fp, 1)
	if !sw.tr.P2P().RelayMember(n.ID()) {
		t.Fatal("a connected shard node is not a relay member")
	}
	_ = n.Close()
	deadline := time.Now().Add(30 * time.Second)
	for len(sw.tr.P2P().Host().Network().ConnsToPeer(n.ID())) > 0 {
		if time.Now().After(deadline) {
			t.Fatal("tracker still connected to a closed node")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if sw.tr.P2P().RelayMember(n.ID()) {
		t.Error("a peer with no connection to the tracker is a relay member (on its advert alone)")
	}
}

// Only an advert with a shard inside route.DecodeAdvert's bounds makes a
// peer a relay member on its advert.
func TestTrackerAdvertMember(t *testing.T) {
	id, err := peer.Decode("12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA")
	if err != nil {
		t.Fatal(err)
	}
	body := func(edit func(*meshp2pb.CapabilityAdvert)) []byte {
		ca := shardAdvert(id, "n", testFP('e'), testNLayer, 0, testNLayer, 4)
		if edit != nil {
			edit(ca)
		}
		b, err := proto.Marshal(ca)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, tc := range []struct {
		name string
		body []byte
		want bool
	}{
		{"valid shard", body(nil), true},
		{"no shards", body(func(ca *meshp2pb.CapabilityAdvert) { ca.Shards = nil }), false},
		{"n_layer above the limit", body(func(ca *meshp2pb.CapabilityAdvert) { ca.Shards[0].NLayer = 1 << 22; ca.Shards[0].End = 1 << 22 }), false},
		{"bad fingerprint", body(func(ca *meshp2pb.CapabilityAdvert) { ca.Shards[0].ModelFingerprint = "x" }), false},
		{"not a protobuf", []byte{0xff, 0xff, 0xff}, false},
	} {
		if got := route.MemberAdvert(p2p.Advert{Peer: id, Body: tc.body}); got != tc.want {
			t.Errorf("%s: member %v, want %v", tc.name, got, tc.want)
		}
	}
}
