package tracker

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"google.golang.org/protobuf/proto"

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
	table := route.NewTable()
	table.TrustConvictions(sw.tr.ID())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go route.Follow(ctx, c.Discovery(), table)
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
