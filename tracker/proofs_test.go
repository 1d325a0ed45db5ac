package tracker

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"google.golang.org/protobuf/proto"

	"github.com/neuron-tai/meshp2p/p2p"
	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/route"
)

// With --audit-rate every ticket commits to an audit assignment; the
// opening goes only to the client in the response, and it opens the
// commitment; the assigned share follows the rate.
func TestTrackerAssignsHiddenAudits(t *testing.T) {
	sw := newSwarm(t, func(c *Config) { c.AuditRate, c.RequestBurst = 0.5, 64 })
	fp := testFP('a')
	sw.shard(fp, 0, 2, 64)
	sw.shard(fp, 2, testNLayer, 64)
	sw.waitShards(fp, 2)
	c := sw.node()
	audited, hops := 0, map[uint32]int{}
	const n = 40
	for range n {
		resp := sw.ask(c, &meshp2pb.RouteRequest{ModelFingerprint: fp, NLayer: testNLayer, Epoch: 1})
		if resp.GetError() != nil {
			t.Fatal(resp.GetError())
		}
		tk := &meshp2pb.RouteTicket{}
		if err := proto.Unmarshal(resp.GetTicket().GetTicket(), tk); err != nil {
			t.Fatal(err)
		}
		a := resp.GetAudit()
		if len(tk.GetAuditCommitment()) != 32 || a == nil {
			t.Fatalf("ticket commitment %x, assignment %v", tk.GetAuditCommitment(), a)
		}
		if err := route.CheckAuditAssignment(tk, a); err != nil {
			t.Fatal(err)
		}
		// Another opening (the other answer) does not open it.
		flipped := proto.Clone(a).(*meshp2pb.AuditAssignment)
		flipped.Audit = !flipped.Audit
		if err := route.CheckAuditAssignment(tk, flipped); !errors.Is(err, route.ErrTicketInvalid) {
			t.Fatalf("a flipped assignment opened the commitment: %v", err)
		}
		if a.GetAudit() {
			audited++
			hops[a.GetHop()]++
		}
	}
	if audited == 0 || audited == n || len(hops) != 2 {
		t.Fatalf("%d of %d tickets assigned an audit, hops %v: not a draw at rate 0.5 over 2 hops", audited, n, hops)
	}
	t.Logf("%d of %d tickets assigned an audit; hops %v", audited, n, hops)
}

// trustingTable is the table of node c, which trusts the tracker's
// convictions and follows discovery until the test ends.
func (sw *swarm) trustingTable(t *testing.T, c *p2p.Node) *route.Table {
	table := route.NewTable()
	table.TrustConvictions(sw.tr.ID())
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go route.Follow(ctx, c.Discovery(), table)
	return table
}

// A proof the tracker's judge verifies makes it refuse tickets through the
// convicted peer; one it does not verify changes nothing.
func TestTrackerRefusesConvictedPeers(t *testing.T) {
	var bad peer.ID
	sw := newSwarm(t, func(c *Config) {
		c.RequestBurst = 64
		c.Judge = func(_ context.Context, p *meshp2pb.Proof) (bool, peer.ID, string, error) {
			switch p.GetReason() { // the fake judge reads the verdict the test wrote
			case "convicts":
				return true, bad, "window 0 differs", nil
			case "agrees":
				return false, "", "", nil
			}
			return false, "", "", errors.New("cannot check")
		}
	})
	fp := testFP('a')
	head := sw.shard(fp, 0, 2, 64)
	tail := sw.shard(fp, 2, testNLayer, 64)
	spare := sw.shard(fp, 2, testNLayer, 64)
	sw.waitShards(fp, 3)
	bad = tail.ID()
	c := sw.node()
	// A node that trusts the tracker follows its published convictions.
	table := sw.trustingTable(t, c)
	listed := func() bool {
		for _, s := range table.Shards(fp) {
			if s.Peer == bad {
				return true
			}
		}
		return false
	}
	for deadline := time.Now().Add(20 * time.Second); !listed(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the node never listed the tail")
		}
	}
	submit := func(reason string) *meshp2pb.ProofVerdict {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		v, err := route.SubmitProof(ctx, c.Host(), c.ProtocolID(route.ProtoProof, route.ProtoProofVersion), sw.tr.ID(), &meshp2pb.Proof{Version: 1, Reason: reason}, frame.Limits{})
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if v := submit("garbage"); v.GetError() == nil || v.GetConvicted() {
		t.Fatalf("an unverifiable proof: %v", v)
	}
	if v := submit("agrees"); v.GetConvicted() || len(sw.tr.Convicted()) != 0 {
		t.Fatalf("a proof whose replay agrees convicted: %v", v)
	}
	if v := submit("convicts"); !v.GetConvicted() || peer.ID(v.GetPeerId()) != bad {
		t.Fatalf("verdict %v", v)
	}
	for deadline := time.Now().Add(20 * time.Second); listed(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the node still lists the convicted peer the tracker published")
		}
	}
	if !table.Convicted(bad) || table.Convicted(spare.ID()) {
		t.Fatal("convictions in the table")
	}
	for range 20 {
		resp := sw.ask(c, &meshp2pb.RouteRequest{ModelFingerprint: fp, NLayer: testNLayer, Epoch: 1})
		if resp.GetError() != nil {
			t.Fatal(resp.GetError())
		}
		tk := &meshp2pb.RouteTicket{}
		if err := proto.Unmarshal(resp.GetTicket().GetTicket(), tk); err != nil {
			t.Fatal(err)
		}
		hops := tk.GetRoute().GetHops()
		if peer.ID(hops[len(hops)-1].GetPeerId()) != spare.ID() || peer.ID(hops[0].GetPeerId()) != head.ID() {
			t.Fatalf("a ticket after the conviction routes through %v", hops)
		}
	}
}

// Hardening III, row 7: convictions past what the tracker's advert body
// holds (about 190 by default) froze publishing, so no later conviction
// reached the nodes that trust the tracker. Hundreds of throwaway
// convictions (peers that serve nothing) come before a real one: the real
// one, of a peer that advertises a shard, is still published and honoured.
func TestTrackerPublishesConvictionAfterFlood(t *testing.T) {
	var bad peer.ID
	sw := newSwarm(t, func(c *Config) {
		c.Judge = func(context.Context, *meshp2pb.Proof) (bool, peer.ID, string, error) {
			return true, bad, "window 0 differs", nil
		}
	})
	fp := testFP('a')
	sw.shard(fp, 0, 2, 64)
	tail := sw.shard(fp, 2, testNLayer, 64)
	sw.waitShards(fp, 2)
	bad = tail.ID()
	// The flood, older than the real conviction: more throwaway keys than
	// the advert and route.MaxPublishedConvictions hold.
	const flood = route.MaxPublishedConvictions + 64
	sw.tr.mu.Lock()
	for i := range flood {
		k, _, err := crypto.GenerateEd25519Key(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		p, _ := peer.IDFromPrivateKey(k)
		sw.tr.convicted[p] = Conviction{Peer: p, Reason: "throwaway", At: time.Now().Add(-time.Duration(flood-i) * time.Second), Proof: make([]byte, 32)}
	}
	sw.tr.mu.Unlock()
	c := sw.node()
	table := sw.trustingTable(t, c)
	sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer scancel()
	v, err := route.SubmitProof(sctx, c.Host(), c.ProtocolID(route.ProtoProof, route.ProtoProofVersion), sw.tr.ID(), &meshp2pb.Proof{Version: 1}, frame.Limits{})
	if err != nil || !v.GetConvicted() {
		t.Fatalf("verdict %v, %v", v, err)
	}
	for deadline := time.Now().Add(20 * time.Second); !table.Convicted(bad); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the conviction of a serving peer after %d throwaway ones never reached a node that trusts the tracker", flood)
		}
	}
	n := 0
	for _, c := range sw.tr.Convicted() {
		if table.Convicted(c.Peer) {
			n++
		}
	}
	if n < 100 || n > route.MaxPublishedConvictions {
		t.Fatalf("%d convictions published: want as many as fit (over 100), at most %d", n, route.MaxPublishedConvictions)
	}
	t.Logf("published %d of %d convictions, the serving peer's among them", n, flood+1)
}

// stalledProof opens a proof stream from c that declares a payload of
// declared bytes, sends send of them, and stops: the proof-flood attack.
func stalledProof(t *testing.T, c *p2p.Node, tr peer.ID, declared, send int) network.Stream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := c.Host().NewStream(ctx, tr, c.ProtocolID(route.ProtoProof, route.ProtoProofVersion))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Reset() })
	hdr, _ := proto.Marshal(&meshp2pb.ProofSubmission{Size: uint64(declared)})
	pre := make([]byte, frame.PrefixSize)
	binary.BigEndian.PutUint32(pre[0:4], uint32(len(hdr)))
	binary.BigEndian.PutUint32(pre[4:8], uint32(declared))
	_ = s.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if _, err := s.Write(append(pre, hdr...)); err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 64<<10)
	for sent := 0; sent < send; sent += len(chunk) {
		if _, err := s.Write(chunk[:min(len(chunk), send-sent)]); err != nil {
			break // refused: the tracker stopped reading
		}
	}
	return s
}

// verdictWithin reads the tracker's answer on s, waiting at most d.
func verdictWithin(s network.Stream, d time.Duration) (*meshp2pb.ProofVerdict, error) {
	_ = s.SetReadDeadline(time.Now().Add(d))
	var v meshp2pb.ProofVerdict
	err := frame.ReadMessage(s, &v, frame.Limits{})
	return &v, err
}

// Hardening III, row 5: proof streams that declare 160 MiB, send part of
// it and stall held the tracker's memory (2.3 GB from 8 streams) for the
// whole 5-minute deadline, even on a tracker that judges no proofs. Now a
// tracker without a judge refuses before reading; one with a judge reads
// one proof per peer and at most MaxProofMemory declared bytes in all,
// refuses the rest at once, and drops a stalled stream after its idle
// timeout; an honest proof is then judged.
func TestTrackerProofFlood(t *testing.T) {
	const declared, sent = 160 << 20, 128 << 10 // sent: within yamux's first window, so writes never block
	t.Run("no judge: refused before reading", func(t *testing.T) {
		sw := newSwarm(t, nil)
		c := sw.node()
		s := stalledProof(t, c, sw.tr.ID(), declared, 0)
		v, err := verdictWithin(s, 5*time.Second)
		if err != nil || v.GetError() == nil || !strings.Contains(v.GetError().GetMessage(), "checks no proofs") {
			t.Fatalf("verdict %v, %v: want a refusal before the payload", v, err)
		}
		if r := sw.tr.proofs.Reserved(); r != 0 {
			t.Fatalf("%d bytes reserved by a tracker that judges no proofs", r)
		}
	})
	t.Run("judge: bounded, refused, stalls dropped", func(t *testing.T) {
		const idle = 5 * time.Second // the flood below opens its 8 streams well within it
		var bad peer.ID
		sw := newSwarm(t, func(c *Config) {
			c.ProofIdleTimeout = idle
			c.Judge = func(context.Context, *meshp2pb.Proof) (bool, peer.ID, string, error) {
				return true, bad, "differs", nil
			}
		})
		attacker := sw.node()
		bad = attacker.ID()
		var keys []*p2p.Node // free keys, started before the flood (starting a node is the slow part)
		for range 7 {
			keys = append(keys, sw.node())
		}
		// classify waits until the tracker either reads s (its declared
		// size reserved) or refuses it (a verdict): no timing guess.
		classify := func(s network.Stream, before int64) (read bool) {
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
				if sw.tr.proofs.Reserved() > before {
					return true
				}
				if v, err := verdictWithin(s, 20*time.Millisecond); err == nil {
					if v.GetError() == nil {
						t.Fatalf("a flood proof got verdict %v", v)
					}
					return false
				}
			}
			t.Fatal("the tracker neither read nor refused a proof within 10 s")
			return false
		}
		var stalled []network.Stream
		refused := 0
		if first := stalledProof(t, attacker, sw.tr.ID(), declared, sent); classify(first, 0) {
			stalled = append(stalled, first)
		}
		// The same peer again: refused at once, whatever it declares.
		if v, err := verdictWithin(stalledProof(t, attacker, sw.tr.ID(), declared, 0), 5*time.Second); err != nil || v.GetError() == nil {
			t.Fatalf("a second proof of one peer: %v, %v: want refused at once", v, err)
		}
		for _, k := range keys {
			before := sw.tr.proofs.Reserved()
			s := stalledProof(t, k, sw.tr.ID(), declared, sent)
			if classify(s, before) {
				stalled = append(stalled, s)
			} else {
				refused++
			}
			if r := sw.tr.proofs.Reserved(); r > MaxProofMemory {
				t.Fatalf("%d declared bytes reserved, over the %d budget", r, MaxProofMemory)
			}
		}
		if want := int(MaxProofMemory / declared); len(stalled) > want || refused < 8-want {
			t.Fatalf("%d stalled proofs read, %d refused: want at most %d read (the memory budget)", len(stalled), refused, want)
		}
		// Stalled streams are dropped after the idle timeout, and their
		// memory given back.
		for _, s := range stalled {
			if v, err := verdictWithin(s, idle+5*time.Second); err == nil && v.GetError() == nil {
				t.Fatalf("a stalled proof got verdict %v", v)
			}
		}
		for deadline := time.Now().Add(5 * time.Second); sw.tr.proofs.Reserved() != 0; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d bytes still reserved after every stalled proof timed out", sw.tr.proofs.Reserved())
			}
		}
		// An honest proof is judged now.
		honest := sw.node()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		v, err := route.SubmitProof(ctx, honest.Host(), honest.ProtocolID(route.ProtoProof, route.ProtoProofVersion), sw.tr.ID(), &meshp2pb.Proof{Version: 1}, frame.Limits{})
		if err != nil || !v.GetConvicted() || peer.ID(v.GetPeerId()) != bad {
			t.Fatalf("an honest proof after the flood: %v, %v", v, err)
		}
		t.Logf("%d proofs read then dropped after %s idle, %d refused at once", len(stalled), idle, refused)
	})
}
