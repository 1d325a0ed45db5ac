package proofgossip_test

import (
	"context"
	"crypto/rand"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/p2p"
	"github.com/neuron-tai/meshp2p/proofgossip"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/session"
)

// member is one real libp2p host on loopback with the proofs topic.
type member struct {
	n      *p2p.Node
	g      *proofgossip.Gossip
	judged atomic.Int64
	mu     sync.Mutex
	conv   map[peer.ID]bool
	susp   map[peer.ID]bool
}

func key(t *testing.T) crypto.PrivKey {
	k, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func id(t *testing.T, k crypto.PrivKey) peer.ID {
	p, err := peer.IDFromPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// start starts a member; judge false: it replays nothing (Judge nil).
// guilty are the peers its replays find lying; serving the peers that
// advertise layers.
func start(t *testing.T, network string, boot []peer.AddrInfo, judge bool, guilty, serving map[peer.ID]bool, tweak ...func(*proofgossip.Config)) *member {
	t.Helper()
	ctx := context.Background()
	n, err := p2p.New(ctx, p2p.Config{Network: network, Role: "test", Version: "0", DataDir: t.TempDir(),
		ListenAddrs: []string{"/ip4/127.0.0.1/tcp/0"}, Bootstrap: boot, Logger: slog.New(slog.DiscardHandler),
		Discovery: p2p.DiscoveryConfig{RepublishInterval: 300 * time.Millisecond, AdvertTTL: 3 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	m := &member{n: n, conv: map[peer.ID]bool{}, susp: map[peer.ID]bool{}}
	cfg := proofgossip.Config{
		Convict:   func(p peer.ID, _ string) { m.mu.Lock(); m.conv[p] = true; m.mu.Unlock() },
		Suspect:   func(p peer.ID) { m.mu.Lock(); m.susp[p] = true; m.mu.Unlock() },
		Serving:   func(p peer.ID) bool { return serving[p] },
		Logger:    slog.New(slog.DiscardHandler),
		Convicted: func(p peer.ID) bool { m.mu.Lock(); defer m.mu.Unlock(); return m.conv[p] },
	}
	if judge {
		cfg.Judge = func(_ context.Context, p *meshp2pb.Proof) (session.Verdict, error) {
			m.judged.Add(1)
			accused := peer.ID(p.GetOpen().GetRoute().GetHops()[p.GetHopIndex()].GetPeerId())
			return session.Verdict{Convicted: guilty[accused], Reason: "replayed"}, nil
		}
	}
	for _, f := range tweak {
		f(&cfg)
	}
	if m.g, err = proofgossip.Start(ctx, n.Discovery(), n.ID(), cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.g.Close)
	return m
}

// formed waits until every member knows a peer on the proofs topic, and
// a gossipsub heartbeat or two more (the mesh grafts).
func formed(t *testing.T, all ...*member) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		ready := true
		for _, m := range all {
			ready = ready && m.g.Peers() > 0
		}
		if ready {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the proofs topic never formed")
		}
	}
	time.Sleep(2 * time.Second)
}

// eventually waits up to 15 s for cond.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("after 15 s: %s", what)
		}
	}
}

// fast sends repeats every 300 ms and takes a proof heard before, or a new
// one from the same sender, again after 100 ms.
func fast(c *proofgossip.Config) {
	c.Republish = []time.Duration{300 * time.Millisecond}
	c.RepeatInterval, c.PublisherInterval = 100*time.Millisecond, 100*time.Millisecond
}

// Gossip keeps no history, so a node that was not in the mesh when a proof
// went round (it joined later) hears it only from its author's repeats
// (Config.Republish), forwarded by nodes that judged it already and do not
// judge it again. A node that dropped the proof because its table did not
// list the accused yet checks a repeat afresh.
func TestRepeatsReachNodesThatMissedTheProof(t *testing.T) {
	liar, origin := key(t), key(t)
	network := "proofgossip-repeat"
	serving := map[peer.ID]bool{id(t, liar): true}
	// The judge carries nothing on (no schedule): the late node can only
	// hear the author's repeats.
	judge := start(t, network, nil, true, map[peer.ID]bool{id(t, liar): true}, serving, fast, func(c *proofgossip.Config) { c.Republish = []time.Duration{} })
	bi := []peer.AddrInfo{judge.n.AddrInfo()}
	author := start(t, network, bi, false, nil, serving, fast)
	formed(t, judge, author)
	if err := author.g.Publish(context.Background(), proof(t, origin, liar, 1)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the judge never replayed the proof", func() bool { return judge.judged.Load() == 1 })

	// Joins now, and does not list the liar among the serving peers yet.
	var lists atomic.Bool
	late := start(t, network, bi, false, nil, nil, fast, func(c *proofgossip.Config) {
		c.Serving = func(p peer.ID) bool { return lists.Load() && p == id(t, liar) }
	})
	eventually(t, "the late node never heard a repeat", func() bool { return late.g.Stats().Dropped > 0 })
	late.mu.Lock()
	if late.susp[id(t, liar)] {
		t.Error("the late node suspects a hop its table does not list")
	}
	late.mu.Unlock()
	lists.Store(true)
	eventually(t, "the late node never suspected the liar", func() bool {
		late.mu.Lock()
		defer late.mu.Unlock()
		return late.susp[id(t, liar)]
	})
	st := judge.g.Stats()
	t.Logf("author %+v; judge %+v; late %+v", author.g.Stats(), st, late.g.Stats())
	if judge.judged.Load() != 1 || st.Judged != 1 || st.Repeated == 0 {
		t.Errorf("the judge replayed %d times (%+v); want the proof replayed once and its repeats forwarded", judge.judged.Load(), st)
	}
	if author.g.Stats().Republished == 0 {
		t.Error("the author never sent its proof again")
	}
}

// An author may be gone before a node joins (a generate run that exited):
// the nodes whose replay convicted carry its proof on. While the author
// still sends its own repeats they skip their turns; once it is gone, a
// node that joins later hears the proof from them.
func TestJudgesCarryTheProofOfAGoneAuthor(t *testing.T) {
	liar, origin := key(t), key(t)
	network := "proofgossip-carry"
	serving := map[peer.ID]bool{id(t, liar): true}
	guilty := map[peer.ID]bool{id(t, liar): true}
	judge := start(t, network, nil, true, guilty, serving, fast)
	bi := []peer.AddrInfo{judge.n.AddrInfo()}
	author := start(t, network, bi, false, nil, serving, fast)
	formed(t, judge, author)
	if err := author.g.Publish(context.Background(), proof(t, origin, liar, 1)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the judge never carried the proof it convicted on", func() bool { return judge.g.Stats().Carried == 1 })
	eventually(t, "the judge never skipped a turn while the author sent its own", func() bool { return judge.g.Stats().Skipped > 0 })
	author.g.Close()
	author.n.Close()
	sent := judge.g.Stats().Republished
	late := start(t, network, bi, false, nil, serving, fast)
	eventually(t, "the node that joined after the author left never heard the proof", func() bool {
		late.mu.Lock()
		defer late.mu.Unlock()
		return late.susp[id(t, liar)]
	})
	st := judge.g.Stats()
	t.Logf("judge %+v; late %+v", st, late.g.Stats())
	if judge.judged.Load() != 1 || st.Republished <= sent {
		t.Errorf("the judge replayed %d times and sent %d copies after the author left (%+v); want one replay, copies sent", judge.judged.Load(), st.Republished-sent, st)
	}
}

// A node that never heard an author's proofs takes one a minute from it
// (PublisherInterval), so an author's repeats of several proofs go one
// per interval: a late node hears them all and drops none for the rate.
// (The author spaces them by 300 ms, the late node's limit is 100 ms: the
// margin is for the transit's jitter, which in a swarm is far below the
// default minute.)
func TestRepeatsOfSeveralProofsAreSpaced(t *testing.T) {
	liars := []crypto.PrivKey{key(t), key(t)}
	origin := key(t)
	network := "proofgossip-spaced"
	serving := map[peer.ID]bool{id(t, liars[0]): true, id(t, liars[1]): true}
	quiet := func(c *proofgossip.Config) {
		c.Republish, c.PublisherInterval, c.RepeatInterval = []time.Duration{}, 100*time.Millisecond, 100*time.Millisecond
	}
	judge := start(t, network, nil, false, nil, serving, quiet)
	bi := []peer.AddrInfo{judge.n.AddrInfo()}
	author := start(t, network, bi, false, nil, serving, func(c *proofgossip.Config) {
		c.Republish, c.PublisherInterval, c.RepeatInterval = []time.Duration{300 * time.Millisecond}, 300*time.Millisecond, 100*time.Millisecond
	})
	formed(t, judge, author)
	for i, l := range liars {
		if err := author.g.Publish(context.Background(), proof(t, origin, l, byte(i+1))); err != nil {
			t.Fatal(err)
		}
	}
	late := start(t, network, bi, false, nil, serving, quiet)
	eventually(t, "the late node never suspected both liars", func() bool {
		late.mu.Lock()
		defer late.mu.Unlock()
		return late.susp[id(t, liars[0])] && late.susp[id(t, liars[1])]
	})
	if st := late.g.Stats(); st.Dropped != 0 {
		t.Errorf("the late node dropped %d proofs (%+v): the author's repeats came closer than its rate", st.Dropped, st)
	}
	t.Logf("author %+v; late %+v", author.g.Stats(), late.g.Stats())
}

// proof is a well-signed proof of one window against the hop of hopKey,
// in a session origin ran (payload makes proofs differ).
func proof(t *testing.T, origin, hopKey crypto.PrivKey, payload byte) *meshp2pb.Proof {
	t.Helper()
	hop := id(t, hopKey)
	sid := make([]byte, 16)
	_, _ = rand.Read(sid)
	open := &meshp2pb.SessionOpen{SessionId: sid, Epoch: 1, ModelFingerprint: "fp",
		Route: &meshp2pb.Route{ModelFingerprint: "fp", NLayer: 2, Hops: []*meshp2pb.RouteHop{{PeerId: []byte(hop), Start: 0, End: 2}}}}
	if err := session.SignOpen(open, origin, time.Now()); err != nil {
		t.Fatal(err)
	}
	frames := []*meshp2pb.RecordedFrame{{Payload: []byte{payload, 1, 2, 3}}}
	st, err := session.SignTranscript(&meshp2pb.Transcript{SessionId: sid, OriginPeerId: open.GetOriginPeerId(), Epoch: 1, PeerId: []byte(hop),
		ModelFingerprint: "fp", Start: 0, End: 2, Frames: 1, Final: true, InDigest: session.InputDigest(frames), OutDigest: make([]byte, 32), OpenDigest: session.OpenDigest(open)}, hopKey)
	if err != nil {
		t.Fatal(err)
	}
	return &meshp2pb.Proof{Version: 1, Open: open, Statements: []*meshp2pb.SignedTranscript{st}, Inputs: frames}
}

// Real hosts on loopback: what a gossiped proof costs the nodes that hear
// it, and who it convicts. Replays (Judge) are counted: a forged proof
// costs none, a replayed one none, a throwaway key's none, and a proof
// refuted by a replay silences its author; a proof a replay confirms
// convicts on every node that replays it and only makes the others
// suspect the hop.
func TestGossipedProofsConvictAndCostBoundedWork(t *testing.T) {
	liar, honest, throwaway, origin := key(t), key(t), key(t), key(t)
	guilty := map[peer.ID]bool{id(t, liar): true}
	serving := map[peer.ID]bool{id(t, liar): true, id(t, honest): true}
	network := "proofgossip-test"
	boot := start(t, network, nil, true, guilty, serving)
	bi := []peer.AddrInfo{boot.n.AddrInfo()}
	judges := []*member{boot, start(t, network, bi, true, guilty, serving)}
	blind := start(t, network, bi, false, guilty, serving)
	// The authors send each proof once: the counts below are of one copy.
	once := func(c *proofgossip.Config) { c.Republish = []time.Duration{} }
	authors := []*member{start(t, network, bi, false, nil, serving, once), start(t, network, bi, false, nil, serving, once), start(t, network, bi, false, nil, serving, once)}
	formed(t, append(append([]*member{blind}, judges...), authors...)...)
	ctx := context.Background()
	judged := func() (n int64) {
		for _, j := range judges {
			n += j.judged.Load()
		}
		return n
	}
	settle := func(want int64) {
		t.Helper()
		for deadline := time.Now().Add(15 * time.Second); judged() < want && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		}
		time.Sleep(500 * time.Millisecond) // anything more would arrive now
		if got := judged(); got != want {
			t.Fatalf("%d replays, want %d", got, want)
		}
	}

	// Forged: the recorded input is not what the hop signed it received.
	forged := proof(t, origin, honest, 1)
	forged.Inputs[0].Payload[0] ^= 0xff
	if err := authors[0].g.Publish(ctx, forged); err != nil {
		t.Fatal(err)
	}
	// Throwaway: a well-signed proof against a peer that serves nothing
	// (its author is then rate-limited, as after any proof it had heard).
	if err := authors[1].g.Publish(ctx, proof(t, origin, throwaway, 2)); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		heard := true
		for _, j := range judges {
			st := j.g.Stats()
			heard = heard && st.Refused == 1 && st.Dropped == 1
		}
		if heard {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the forged and the throwaway proofs never reached every judge: %+v, %+v", judges[0].g.Stats(), judges[1].g.Stats())
		}
	}
	settle(0)

	// A real one: every node that replays convicts; the blind one suspects.
	real := proof(t, origin, liar, 3)
	if err := authors[2].g.Publish(ctx, real); err != nil {
		t.Fatal(err)
	}
	settle(int64(len(judges)))
	for i, j := range judges {
		j.mu.Lock()
		if !j.conv[id(t, liar)] || j.conv[id(t, honest)] {
			t.Errorf("judge %d convicted %v", i, j.conv)
		}
		j.mu.Unlock()
	}
	blind.mu.Lock()
	if len(blind.conv) != 0 || !blind.susp[id(t, liar)] || blind.susp[id(t, honest)] {
		t.Errorf("a node that cannot replay convicted %v and suspects %v; want no conviction and the liar suspected", blind.conv, blind.susp)
	}
	blind.mu.Unlock()

	// The same proof again from another author: known, no replay.
	if err := authors[0].g.Publish(ctx, real); err != nil {
		t.Fatal(err)
	}
	// A well-signed proof against an honest hop: each judge replays it
	// once, finds the hop honest, and stops hearing its author.
	if err := authors[0].g.Publish(ctx, proof(t, origin, honest, 4)); err != nil {
		t.Fatal(err)
	}
	settle(int64(2 * len(judges)))
	for i, j := range judges {
		j.mu.Lock()
		if j.conv[id(t, honest)] {
			t.Errorf("judge %d convicted the honest hop", i)
		}
		j.mu.Unlock()
	}
	// Its author's next proof, and a second one within a minute from
	// another author, are dropped unreplayed.
	if err := authors[0].g.Publish(ctx, proof(t, origin, honest, 5)); err != nil {
		t.Fatal(err)
	}
	if err := authors[2].g.Publish(ctx, proof(t, origin, honest, 6)); err != nil {
		t.Fatal(err)
	}
	settle(int64(2 * len(judges)))
	for i, j := range judges {
		st := j.g.Stats()
		t.Logf("judge %d: %+v", i, st)
		if st.Convicted != 1 || st.Refuted != 1 || st.Dropped != 3 {
			t.Errorf("judge %d: %+v, want 1 convicted, 1 refuted, 3 dropped", i, st)
		}
	}
}
