package node

import (
	"context"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/neuron-tai/meshp2p/p2p"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/route"
)

// trackerHost adapts the p2p node to route.TrackerHost.
type trackerHost struct{ n *p2p.Node }

func (h trackerHost) NewStream(ctx context.Context, p peer.ID, pids ...protocol.ID) (network.Stream, error) {
	return h.n.NewStream(ctx, p, pids...)
}

func (h trackerHost) AddAddrs(ai peer.AddrInfo) {
	h.n.Host().Peerstore().AddAddrs(ai.ID, ai.Addrs, peerstore.PermanentAddrTTL)
}

// TrackerPlanner returns a planner that asks trackers for signed routes,
// verified against this node's table, falling back to local planning
// unless require is set.
func (n *Node) TrackerPlanner(trackers []peer.AddrInfo, require bool) *route.TrackerPlanner {
	// The trackers' published convictions drop those peers from this
	// node's table too (local planning, model listings; docs/trust.md).
	for _, t := range trackers {
		n.table.TrustConvictions(t.ID)
	}
	return &route.TrackerPlanner{Host: trackerHost{n.p2p}, Trackers: trackers, Protocol: n.p2p.ProtocolID(route.ProtoRoute, route.ProtoRouteVersion),
		Network: n.cfg.P2P.Network, Self: n.p2p.ID(), Table: n.table, Fallback: &route.LocalPlanner{Table: n.table}, Require: require,
		Limits: n.cfg.Hop.Limits, Logger: n.log}
}

// SubmitProof sends a fraud proof to tracker t (docs/trust.md) and returns
// its verdict.
func (n *Node) SubmitProof(ctx context.Context, t peer.AddrInfo, p *meshp2pb.Proof) (*meshp2pb.ProofVerdict, error) {
	h := trackerHost{n.p2p}
	if len(t.Addrs) > 0 {
		h.AddAddrs(t)
	}
	return route.SubmitProof(ctx, h, n.p2p.ProtocolID(route.ProtoProof, route.ProtoProofVersion), t.ID, p, n.cfg.Hop.Limits)
}
