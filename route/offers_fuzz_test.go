package route

import (
	"math"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"google.golang.org/protobuf/proto"

	"github.com/neuron-tai/meshp2p/demand"
	"github.com/neuron-tai/meshp2p/p2p"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// FuzzAdvertExtras: whatever bytes an advert carries, reading its offers
// and demand never panics and keeps the bounds: at most MaxOffers valid
// offers, a report of at most demand.DefaultMaxModels valid fingerprints
// (or none), and the merged demand finite and capped per author.
func FuzzAdvertExtras(f *testing.F) {
	fp := "abababababababababababababababababababababababababababababababab"
	seed, _ := proto.Marshal(&meshp2pb.CapabilityAdvert{
		Offers: []*meshp2pb.ModelOffer{{ModelFingerprint: fp, ModelName: "m", NLayer: 4, Bytes: 1 << 30}},
		Demand: &meshp2pb.DemandReport{MeasuredAtMs: time.Now().UnixMilli(), Models: []*meshp2pb.ModelDemand{{ModelFingerprint: fp, Requests: 3, Refused: math.Inf(1)}}}})
	f.Add(seed)
	f.Add([]byte{0x62, 0x00})
	f.Fuzz(func(t *testing.T, body []byte) {
		p := peer.ID("fuzz-peer")
		offers, rep := decodeExtras(p2p.Advert{Peer: p, Body: body})
		if len(offers) > MaxOffers {
			t.Fatalf("%d offers", len(offers))
		}
		for _, o := range offers {
			if !ValidFingerprint(o.Fingerprint) || o.NLayer <= 0 || len(o.ModelName) > MaxModelName {
				t.Fatalf("offer %+v passed the checks", o)
			}
		}
		if rep != nil {
			if len(rep.Models) > demand.DefaultMaxModels {
				t.Fatalf("report of %d models", len(rep.Models))
			}
			tb := NewTable()
			tb.Apply(p2p.Advert{Peer: p, Body: body})
			for fp, s := range tb.Demand(rep.At) {
				for _, v := range []float64{s.Requests, s.Queued, s.Refused} {
					if math.IsNaN(v) || math.IsInf(v, 0) || v > demand.DefaultMaxRate {
						t.Fatalf("demand of %.16s: %+v", fp, s)
					}
				}
			}
		}
	})
}
