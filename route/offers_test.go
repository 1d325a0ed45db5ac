package route

import (
	"crypto/rand"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"google.golang.org/protobuf/proto"

	"github.com/neuron-tai/meshp2p/demand"
	"github.com/neuron-tai/meshp2p/p2p"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

func newPeerID(t *testing.T) peer.ID {
	t.Helper()
	k, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := peer.IDFromPrivateKey(k)
	return p
}

// Offers and demand reports come from adverts: offers are checked and
// bounded per advert (MaxOffers), forgotten with the advert, and name
// models (a warmable model resolves by name); demand reports go through
// package demand's per-author bounds, so one author's report adds at most
// the cap and a report naming too many models is dropped whole.
func TestTableOffersAndDemand(t *testing.T) {
	fpA, fpB := strings.Repeat("aa", 32), strings.Repeat("bb", 32)
	now := time.Now()
	body := func(offers []*meshp2pb.ModelOffer, dem []*meshp2pb.ModelDemand) []byte {
		ca := &meshp2pb.CapabilityAdvert{Offers: offers}
		if dem != nil {
			ca.Demand = &meshp2pb.DemandReport{MeasuredAtMs: now.UnixMilli(), Models: dem}
		}
		b, _ := proto.Marshal(ca)
		return b
	}
	many := make([]*meshp2pb.ModelOffer, 3*MaxOffers)
	for i := range many {
		many[i] = &meshp2pb.ModelOffer{ModelFingerprint: strings.Repeat("c", 62) + string("0123456789abcdef"[i%16]) + string("0123456789abcdef"[i/16]), ModelName: "m", NLayer: 4}
	}
	tooMany := make([]*meshp2pb.ModelDemand, demand.DefaultMaxModels+1)
	for i := range tooMany {
		tooMany[i] = &meshp2pb.ModelDemand{ModelFingerprint: fpA, Requests: 1}
	}
	standby, liar, flooder, bad := newPeerID(t), newPeerID(t), newPeerID(t), newPeerID(t)
	exp := now.Add(time.Minute)
	tb := NewTable()
	tb.resync([]p2p.Advert{
		{Peer: standby, ExpiresAt: exp, Body: body([]*meshp2pb.ModelOffer{{ModelFingerprint: fpB, ModelName: "bee", NLayer: 4, Bytes: 1 << 20}},
			[]*meshp2pb.ModelDemand{{ModelFingerprint: fpA, Requests: 2, Refused: 1}})},
		{Peer: liar, ExpiresAt: exp, Body: body(many, []*meshp2pb.ModelDemand{{ModelFingerprint: fpB, Requests: 1e12, Queued: 1e12}})},
		{Peer: flooder, ExpiresAt: exp, Body: body(nil, tooMany)},
		{Peer: bad, ExpiresAt: exp, Body: body([]*meshp2pb.ModelOffer{{ModelFingerprint: "not hex", NLayer: 4}, {ModelFingerprint: fpA, NLayer: 0}},
			[]*meshp2pb.ModelDemand{{ModelFingerprint: fpA, Requests: -1}})},
	})
	if os := tb.Offers(fpB); len(os) != 1 || os[0].Peer != standby || os[0].ModelName != "bee" || os[0].NLayer != 4 {
		t.Fatalf("offers of B: %+v", os)
	}
	perPeer := map[peer.ID]int{}
	for _, o := range tb.Offers("") {
		perPeer[o.Peer]++
	}
	if perPeer[liar] != MaxOffers || perPeer[bad] != 0 {
		t.Fatalf("offers per peer %v: the liar's want %d, the malformed peer's 0", perPeer, MaxOffers)
	}
	if fp, err := tb.Fingerprint("bee"); err != nil || fp != fpB {
		t.Fatalf("a warmable model by name: %q %v", fp, err)
	}
	if _, err := tb.Fingerprint("nobody"); !errors.Is(err, ErrUnknownModel) {
		t.Fatalf("unknown name: %v", err)
	}
	d := tb.Demand(now)
	if a := d[fpA]; a.Requests < 1.9 || a.Requests > 2 || a.Refused < 0.9 {
		t.Fatalf("demand for A %+v: the standby's report only (the flood of %d models and the negative rate dropped)", a, len(tooMany))
	}
	if b := d[fpB]; b.Requests > demand.DefaultMaxRate || b.Queued > demand.DefaultMaxRate {
		t.Fatalf("demand for B %+v: one liar's report must be capped at %v/s", b, float64(demand.DefaultMaxRate))
	}
	if n := tb.DemandAuthors(); n != 2 {
		t.Fatalf("%d demand authors, want 2 (standby, liar)", n)
	}
	// The standby's advert goes: its offers go with it.
	tb.resync([]p2p.Advert{{Peer: liar, ExpiresAt: exp, Body: body(many, nil)}})
	if os := tb.Offers(fpB); len(os) != 0 {
		t.Fatalf("offers of a peer whose advert is gone: %+v", os)
	}
}
