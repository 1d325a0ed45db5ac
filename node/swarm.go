package node

import (
	"context"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/p2p"
)

// swarm is what placement and fetch orchestration need of the network:
// who we are, who we hold connections to, the adverts discovery holds, and
// pulls and lookups of more. p2pSwarm implements it over a *p2p.Node.
type swarm interface {
	ID() peer.ID
	// PeerCount is the number of peers with a live connection.
	PeerCount() int
	// Connected reports whether we hold a connection to p.
	Connected(p peer.ID) bool
	// Dial connects to p (by the addresses the peerstore holds).
	Dial(ctx context.Context, p peer.ID) error
	// Adverts are the fresh adverts of other peers discovery holds.
	Adverts() []p2p.Advert
	// Sync pulls adverts from the connected peers.
	Sync(ctx context.Context)
	// Lookup asks the DHT for the providers of key.
	Lookup(ctx context.Context, key string)
	// NoPeersError is nil while connected to any peer, else why not
	// (wrapping p2p.ErrNoPeers).
	NoPeersError() error
	// SubscribeConn reports connectivity changes until ctx ends.
	SubscribeConn(ctx context.Context) <-chan p2p.ConnEvent
}

// p2pSwarm is swarm over the node's p2p host.
type p2pSwarm struct{ n *p2p.Node }

func (s p2pSwarm) ID() peer.ID              { return s.n.ID() }
func (s p2pSwarm) PeerCount() int           { return s.n.PeerCount() }
func (s p2pSwarm) Connected(p peer.ID) bool { return s.n.ConnStatus(p).Path != p2p.PathNone }
func (s p2pSwarm) Adverts() []p2p.Advert    { return s.n.Discovery().Adverts() }
func (s p2pSwarm) Sync(ctx context.Context) { s.n.Discovery().Sync(ctx) }
func (s p2pSwarm) NoPeersError() error      { return s.n.NoPeersError() }
func (s p2pSwarm) SubscribeConn(ctx context.Context) <-chan p2p.ConnEvent {
	return s.n.SubscribeConn(ctx)
}
func (s p2pSwarm) Lookup(ctx context.Context, key string) {
	_, _ = s.n.Discovery().Lookup(ctx, key)
}
func (s p2pSwarm) Dial(ctx context.Context, p peer.ID) error {
	return s.n.Host().Connect(ctx, peer.AddrInfo{ID: p})
}
