package session

import (
	"context"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/multiformats/go-multiaddr"

	"github.com/neuron-tai/meshp2p/p2p"
)

// Protocol names (scoped by the swarm: /meshp2p/<network>/<name>/<version>).
// A seam move re-opens a session or ring stream with SessionOpen.resume set;
// it has no protocol of its own.
const (
	ProtoSession = "session" // upstream → downstream seam of one route session
	ProtoRing    = "ring"    // tail → head: sampled tokens close the ring
	ProtoAudit   = "audit"   // origin → hop: what a hop kept of a session (auditstore.go)
	// ProtoVersion 1.2.0: SamplingParams carries a grammar and asks for
	// log-probabilities (TokenFrame.logprobs); a 1.1.0 tail would ignore
	// both and write unconstrained text, so they do not share protocols.
	// 1.1.0: the origin's signature covers sampling, generated,
	// speculation, wire dtype and transcripts (originauth.go).
	ProtoVersion = "1.2.0"
)

// Host is what the route-session protocol needs from the p2p layer.
type Host interface {
	ID() peer.ID
	ProtocolID(name, version string) protocol.ID
	NewStream(ctx context.Context, p peer.ID, pids ...protocol.ID) (network.Stream, error)
	Peerstore() peerstore.Peerstore
	SetStreamHandler(pid protocol.ID, h network.StreamHandler)
	RemoveStreamHandler(pid protocol.ID)
	Protect(p peer.ID, tag string)
	Unprotect(p peer.ID, tag string) bool
	// SubscribeConn reports connectivity changes (a hole punch turning a
	// relayed path direct) until ctx ends.
	SubscribeConn(ctx context.Context) <-chan p2p.ConnEvent
	// PathTo is the current best path to p (a new stream takes it).
	PathTo(p peer.ID) p2p.Path
}

// StreamPather is optionally implemented by a Host that knows better than
// the stream's remote address whether a stream is relayed (tests).
type StreamPather interface {
	StreamPath(s network.Stream) p2p.Path
}

// pathOf says whether a stream runs over a relay (by default: its
// connection's remote address has /p2p-circuit) or directly.
func pathOf(h Host, s network.Stream) p2p.Path {
	if sp, ok := h.(StreamPather); ok {
		return sp.StreamPath(s)
	}
	if _, err := s.Conn().RemoteMultiaddr().ValueForProtocol(multiaddr.P_CIRCUIT); err == nil {
		return p2p.PathRelayed
	}
	return p2p.PathDirect
}

func addAddrs(h Host, p peer.ID, addrs []string) {
	added := 0
	for _, a := range addrs {
		if added >= MaxRouteAddrs || len(a) > MaxRouteAddrLen {
			break
		}
		if m, err := multiaddr.NewMultiaddr(a); err == nil {
			h.Peerstore().AddAddr(p, m, PeerAddrTTL)
			added++
		}
	}
}
