package node

import (
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/multiformats/go-multiaddr"

	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/internal/testmodels"
	"github.com/neuron-tai/meshp2p/p2p"
	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/route"
	"github.com/neuron-tai/meshp2p/session"
	"github.com/neuron-tai/meshp2p/tracker"
)

// tracker starts a tracker on loopback; it becomes the bootstrap peer of
// every node started after it. dir holds its identity (tests read the key
// to forge tickets "signed by the tracker").
func (tn *testNet) tracker(dir string) *tracker.Tracker {
	tn.t.Helper()
	pc := Preset(PresetTest)
	pc.Network, pc.DataDir, pc.Bootstrap = tn.network, dir, tn.boot
	pc.RelayService, pc.ForceReachability = true, p2p.ReachabilityPublic
	tr, err := tracker.Start(context.Background(), tracker.Config{P2P: pc, PingInterval: time.Second})
	if err != nil {
		tn.t.Fatal(err)
	}
	tn.t.Cleanup(func() { tr.Close() })
	if tn.boot == nil {
		tn.boot = []peer.AddrInfo{tr.P2P().AddrInfo()}
	}
	return tr
}

func requireTicket(tn *testNet, trusted ...peer.ID) func(*Config) {
	return func(c *Config) {
		c.Hop.Admit = session.TicketAdmission(session.TicketPolicy{Network: tn.network, Trusted: trusted})
	}
}

// waitShards waits until tb lists n shards of fp.
func waitShards(t *testing.T, tb *route.Table, fp string, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for len(tb.Shards(fp)) < n {
		if time.Now().After(deadline) {
			t.Fatalf("table lists %d shards of %.12s, want %d", len(tb.Shards(fp)), fp, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func trackerAI(tr *tracker.Tracker) []peer.AddrInfo { return []peer.AddrInfo{tr.P2P().AddrInfo()} }

func loadKey(t *testing.T, dir string) crypto.PrivKey {
	t.Helper()
	k, _, err := p2p.LoadOrCreateIdentity(dir)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// forge signs a ticket for hops with key, valid from issued for ttl.
func forge(t *testing.T, key crypto.PrivKey, network, fp string, nl int, hops []route.Hop, issued time.Time, ttl time.Duration, client ...peer.ID) *meshp2pb.SignedRouteTicket {
	t.Helper()
	id, _ := peer.IDFromPrivateKey(key)
	rt := route.WireRoute(&route.Route{Fingerprint: fp, NLayer: nl, Epoch: 1, Hops: hops})
	nonce, _ := route.NewNonce()
	tk := &meshp2pb.RouteTicket{Network: network, Route: rt, Nonce: nonce, IssuedAtMs: issued.UnixMilli(),
		ExpiresAtMs: issued.Add(ttl).UnixMilli(), TrackerPeerId: []byte(id)}
	if len(client) > 0 {
		tk.ClientPeerId = []byte(client[0])
	}
	st, err := route.SignTicket(key, tk)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func randomPeer(t *testing.T) (crypto.PrivKey, peer.ID) {
	t.Helper()
	k, _, err := crypto.GenerateEd25519Key(crand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := peer.IDFromPrivateKey(k)
	return k, id
}

func hopOf(n *Node, s, e int) route.Hop {
	return route.Hop{Peer: n.P2P().ID(), Start: s, End: e, Addrs: n.P2P().Host().Addrs()}
}

// A generation through a tracker-issued route matches the local run; hops
// that demand tickets refuse missing, tampered, foreign, expired,
// other-model and not-listing-this-hop tickets with their own codes, and
// the origin refuses bad tickets from a tracker with its own errors.
func TestTrackerTickets(t *testing.T) {
	model := testmodels.Path(t, "stories260K.gguf")
	tn := newTestNet(t)
	trDir := t.TempDir()
	tr := tn.tracker(trDir)
	a := tn.shardWith(model, &gguf.Range{Start: 0, End: 3}, requireTicket(tn, tr.ID()))
	b := tn.shardWith(model, &gguf.Range{Start: 3, End: 5}, requireTicket(tn, tr.ID()))
	c := tn.client()
	fp, nl := waitModel(t, c, "stories260K")
	waitShards(t, tr.Table(), fp, 2)
	prompt := thinClientPrompt(t, c, fp, "Once upon a time")
	want := localTokens(t, model, prompt, 24)
	ctx := context.Background()

	tp := c.TrackerPlanner(trackerAI(tr), true)
	res, err := c.Origin(tp).Generate(ctx, session.GenerateRequest{Fingerprint: fp, NLayer: nl, Prompt: prompt, MaxTokens: 24})
	if err != nil {
		t.Fatal(err)
	}
	if res.Route.Ticket == nil || !equalTokens(res.Tokens, want) {
		t.Fatalf("ticket %v; swarm %v local %v", res.Route.Ticket != nil, res.Tokens, want)
	}
	t.Logf("tracker route: %d hops, tokens == local; tracker issued %d tickets", len(res.Route.Hops), tr.Issued())

	// At the hop.
	tkey := loadKey(t, trDir)
	okey, _ := randomPeer(t)
	_, stranger := randomPeer(t)
	now := time.Now()
	good := []route.Hop{hopOf(a, 0, 3), hopOf(b, 3, 5)}
	tampered := forge(t, tkey, tn.network, fp, nl, good, now, time.Minute)
	tampered.Ticket[len(tampered.Ticket)-1] ^= 1
	hopCases := []struct {
		name string
		st   *meshp2pb.SignedRouteTicket
		code meshp2pb.ErrorCode
	}{
		{"missing", nil, meshp2pb.ErrorCode_ERROR_CODE_TICKET_INVALID},
		{"tampered", tampered, meshp2pb.ErrorCode_ERROR_CODE_TICKET_INVALID},
		{"wrong signer", forge(t, okey, tn.network, fp, nl, good, now, time.Minute), meshp2pb.ErrorCode_ERROR_CODE_TICKET_UNTRUSTED},
		{"expired", forge(t, tkey, tn.network, fp, nl, good, now.Add(-time.Hour), time.Minute), meshp2pb.ErrorCode_ERROR_CODE_TICKET_EXPIRED},
		{"other model", forge(t, tkey, tn.network, "00"+fp[2:], nl, good, now, time.Minute), meshp2pb.ErrorCode_ERROR_CODE_MODEL_MISMATCH},
		{"hop not in ticket", forge(t, tkey, tn.network, fp, nl, []route.Hop{{Peer: stranger, Start: 0, End: 3}, hopOf(b, 3, 5)}, now, time.Minute), meshp2pb.ErrorCode_ERROR_CODE_NOT_IN_TICKET},
		{"issued to another client", forge(t, tkey, tn.network, fp, nl, good, now, time.Minute, stranger), meshp2pb.ErrorCode_ERROR_CODE_TICKET_INVALID},
	}
	for _, hc := range hopCases {
		rt := &route.Route{Fingerprint: fp, NLayer: nl, Hops: good, Ticket: hc.st}
		res, err := c.Origin(fixedPlanner{rt}).Generate(ctx, session.GenerateRequest{Fingerprint: fp, NLayer: nl, Prompt: prompt, MaxTokens: 4})
		got := frame.Code(err)
		if res != nil && len(res.Failures) > 0 { // retryable refusals (expired) re-plan first; the first refusal counts
			got = meshp2pb.ErrorCode_ERROR_CODE_UNSPECIFIED
			for code := range meshp2pb.ErrorCode_name {
				if c := meshp2pb.ErrorCode(code); strings.Contains(res.Failures[0], c.String()+":") {
					got = c
				}
			}
		}
		if err == nil || got != hc.code {
			t.Errorf("hop, %s: got %s (%v), want %s", hc.name, got, err, hc.code)
		} else {
			t.Logf("hop, %s: refused: %v", hc.name, err)
		}
	}

	// At the origin: a tracker (real host, its own key) handing out bad
	// tickets.
	fakeDir := t.TempDir()
	fkey := loadKey(t, fakeDir)
	fpc := Preset(PresetTest)
	fpc.Network, fpc.DataDir, fpc.Bootstrap = tn.network, fakeDir, tn.boot
	fake, err := p2p.New(ctx, fpc)
	if err != nil {
		t.Fatal(err)
	}
	defer fake.Close()
	var mu sync.Mutex
	var serve *meshp2pb.SignedRouteTicket
	fake.Host().SetStreamHandler(fake.ProtocolID(route.ProtoRoute, route.ProtoRouteVersion), func(s network.Stream) {
		defer s.Close()
		var req meshp2pb.RouteRequest
		if frame.ReadMessage(s, &req, frame.Limits{}) != nil {
			return
		}
		mu.Lock()
		st := serve
		mu.Unlock()
		_ = frame.WriteMessage(s, &meshp2pb.RouteResponse{Ticket: st})
	})
	ftamp := forge(t, fkey, tn.network, fp, nl, good, now, time.Minute)
	ftamp.Ticket[len(ftamp.Ticket)-1] ^= 1
	originCases := []struct {
		name    string
		st      *meshp2pb.SignedRouteTicket
		exclude peer.ID
		want    error
	}{
		{"valid", forge(t, fkey, tn.network, fp, nl, good, now, time.Minute), "", nil},
		{"tampered", ftamp, "", route.ErrTicketInvalid},
		{"wrong signer", forge(t, okey, tn.network, fp, nl, good, now, time.Minute), "", route.ErrTicketUntrusted},
		{"expired", forge(t, fkey, tn.network, fp, nl, good, now.Add(-time.Hour), time.Minute), "", route.ErrTicketExpired},
		{"other model", forge(t, fkey, tn.network, "00"+fp[2:], nl, good, now, time.Minute), "", route.ErrTicketModel},
		{"hop not advertised", forge(t, fkey, tn.network, fp, nl, []route.Hop{hopOf(a, 0, 2), {Peer: b.P2P().ID(), Start: 2, End: 5}}, now, time.Minute), "", route.ErrTicketAdvert},
		{"excluded hop in ticket", forge(t, fkey, tn.network, fp, nl, good, now, time.Minute), a.P2P().ID(), route.ErrNotInTicket},
	}
	fp2 := c.TrackerPlanner([]peer.AddrInfo{fake.AddrInfo()}, true)
	for _, oc := range originCases {
		mu.Lock()
		serve = oc.st
		mu.Unlock()
		req := route.Request{Fingerprint: fp, NLayer: nl, Epoch: 1}
		if oc.exclude != "" {
			req.Exclude = map[peer.ID]bool{oc.exclude: true}
		}
		rt, err := fp2.Plan(ctx, req)
		switch {
		case oc.want == nil && (err != nil || rt.Ticket == nil):
			t.Errorf("origin, %s: %v", oc.name, err)
		case oc.want != nil && (!errors.Is(err, oc.want) || !errors.Is(err, route.ErrNoTicket)):
			t.Errorf("origin, %s: got %v, want %v", oc.name, err, oc.want)
		case oc.want != nil:
			t.Logf("origin, %s: refused (%s): %v", oc.name, route.TicketCode(err), err)
		}
	}
}

// The tracker goes away mid-generation: the session in flight finishes
// unaffected; afterwards an origin falls back to local planning, or, with
// require-tracker, fails at once.
func TestTrackerDown(t *testing.T) {
	model := testmodels.Path(t, "stories260K.gguf")
	tn := newTestNet(t)
	tr := tn.tracker(t.TempDir())
	tn.shard(model, gguf.Range{Start: 0, End: 2})
	tn.shard(model, gguf.Range{Start: 2, End: 5})
	c := tn.client()
	fp, nl := waitModel(t, c, "stories260K")
	waitShards(t, tr.Table(), fp, 2)
	prompt := thinClientPrompt(t, c, fp, "Once upon a time")
	const maxTok = 64
	want := localTokens(t, model, prompt, maxTok)
	ctx := context.Background()
	n := 0
	res, err := c.Origin(c.TrackerPlanner(trackerAI(tr), true)).Generate(ctx, session.GenerateRequest{Fingerprint: fp, NLayer: nl, Prompt: prompt, MaxTokens: maxTok,
		OnToken: func(int32) bool {
			if n++; n == 4 {
				_ = tr.Close()
			}
			return false
		}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Route.Ticket == nil || res.Reroutes != 0 || !equalTokens(res.Tokens, want) {
		t.Fatalf("in-flight session: ticket %v reroutes %d\nswarm %v\nlocal %v", res.Route.Ticket != nil, res.Reroutes, res.Tokens, want)
	}

	strict := c.TrackerPlanner(trackerAI(tr), true)
	start := time.Now()
	_, err = strict.Plan(ctx, route.Request{Fingerprint: fp, NLayer: nl, Epoch: 1})
	if !errors.Is(err, route.ErrNoTicket) {
		t.Fatalf("require-tracker with the tracker down: %v", err)
	}
	t.Logf("require-tracker failed after %s: %v", time.Since(start).Round(time.Millisecond), err)

	res, err = c.Origin(c.TrackerPlanner(trackerAI(tr), false)).Generate(ctx, session.GenerateRequest{Fingerprint: fp, NLayer: nl, Prompt: prompt, MaxTokens: maxTok})
	if err != nil {
		t.Fatal(err)
	}
	if res.Route.Ticket != nil || !equalTokens(res.Tokens, want) {
		t.Fatalf("fallback: ticket %v, tokens %v", res.Route.Ticket != nil, res.Tokens)
	}
}

// Two replicas of each range, one of them reachable only through the
// tracker's relay: tracker routes use the direct ones, and 8 concurrent
// sessions spread over both direct replicas of each range.
func TestTrackerPlannerDirectAndSpread(t *testing.T) {
	model := testmodels.Path(t, "stories260K.gguf")
	tn := newTestNet(t)
	tr := tn.tracker(t.TempDir())
	var circuit string
	for _, a := range tr.P2P().Addrs() {
		if _, err := a.ValueForProtocol(multiaddr.P_TCP); err == nil {
			circuit = a.String() + "/p2p-circuit"
			break
		}
	}
	wide := func(c *Config) { c.Engine.MaxSessions = 8 }
	relayOnly := func(c *Config) {
		wide(c)
		c.P2P.AnnounceAddrs = []string{circuit}
		c.P2P.ForceReachability = p2p.ReachabilityPrivate
		c.P2P.StaticRelays = trackerAI(tr)
	}
	var direct, relayed []*Node
	for _, r := range []gguf.Range{{Start: 0, End: 3}, {Start: 3, End: 5}} {
		direct = append(direct, tn.shardWith(model, &r, wide), tn.shardWith(model, &r, wide))
		relayed = append(relayed, tn.shardWith(model, &r, relayOnly))
	}
	c := tn.client()
	fp, nl := waitModel(t, c, "stories260K")
	waitShards(t, tr.Table(), fp, 6)
	waitShards(t, c.Table(), fp, 6)
	ctx := context.Background()
	for range 3 { // RTT is the minimum over recent pings
		tr.MeasureNow(ctx)
	}
	for _, r := range relayed {
		if st := tr.PeerStats(r.P2P().ID()); !st.Relayed {
			t.Fatalf("tracker does not see %s as relay-only: %+v", r.P2P().ID(), st)
		}
	}
	prompt := thinClientPrompt(t, c, fp, "Once upon a time")
	want := localTokens(t, model, prompt, 16)

	const sessions = 8
	var wg sync.WaitGroup
	results := make([]*session.Result, sessions)
	errs := make([]error, sessions)
	for i := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := c.Origin(c.TrackerPlanner(trackerAI(tr), true))
			results[i], errs[i] = o.Generate(ctx, session.GenerateRequest{Fingerprint: fp, NLayer: nl, Prompt: prompt, MaxTokens: 16})
		}()
	}
	wg.Wait()
	perPeer := map[peer.ID]int{}
	perRoute := map[string]int{}
	for i := range sessions {
		if errs[i] != nil {
			t.Fatalf("session %d: %v", i, errs[i])
		}
		if !equalTokens(results[i].Tokens, want) {
			t.Fatalf("session %d tokens %v, local %v", i, results[i].Tokens, want)
		}
		key := ""
		for _, h := range results[i].Route.Hops {
			perPeer[h.Peer]++
			key += fmt.Sprintf("%s[%d-%d] ", h.Peer.String()[len(h.Peer.String())-6:], h.Start, h.End)
		}
		perRoute[key]++
	}
	t.Logf("per-route session counts: %v", perRoute)
	for _, r := range relayed {
		if perPeer[r.P2P().ID()] > 0 {
			t.Errorf("relay-only replica %s carried %d sessions", r.P2P().ID(), perPeer[r.P2P().ID()])
		}
	}
	for i := 0; i < len(direct); i += 2 {
		x, y := perPeer[direct[i].P2P().ID()], perPeer[direct[i+1].P2P().ID()]
		t.Logf("range %d: replicas got %d and %d sessions", i/2, x, y)
		if x+y != sessions || x < 3 || y < 3 {
			t.Errorf("range %d: split %d/%d, want both replicas used (at least 3 of %d each)", i/2, x, y, sessions)
		}
	}
}
