package p2p

import (
	"context"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	"github.com/libp2p/go-libp2p/core/protocol"
)

// StreamHost is the few host calls the route-session protocol and the
// control protocols (vocabulary) need of a Node (it satisfies
// session.Host). Wait is how long a new stream waits for a hole punch to
// give a direct connection before it opens on a relayed one
// (NewStreamPreferDirect): long-lived activation seams wait, small
// latency-bound exchanges (0) do not.
type StreamHost struct {
	N    *Node
	Wait time.Duration
}

// ID is the node's peer id.
func (h *StreamHost) ID() peer.ID { return h.N.ID() }

// ProtocolID is the node's network-scoped protocol id.
func (h *StreamHost) ProtocolID(name, v string) protocol.ID { return h.N.ProtocolID(name, v) }

// Peerstore is the libp2p host's peerstore.
func (h *StreamHost) Peerstore() peerstore.Peerstore { return h.N.Host().Peerstore() }

// Protect keeps the connection manager from trimming p's connections.
func (h *StreamHost) Protect(p peer.ID, tag string) { h.N.Protect(p, tag) }

// Unprotect undoes Protect.
func (h *StreamHost) Unprotect(p peer.ID, tag string) bool { return h.N.Unprotect(p, tag) }

// RemoveStreamHandler removes the handler of pid.
func (h *StreamHost) RemoveStreamHandler(pid protocol.ID) { h.N.Host().RemoveStreamHandler(pid) }

// SetStreamHandler handles pid's streams with f.
func (h *StreamHost) SetStreamHandler(pid protocol.ID, f network.StreamHandler) {
	h.N.Host().SetStreamHandler(pid, f)
}

// SubscribeConn reports connection events until ctx ends.
func (h *StreamHost) SubscribeConn(ctx context.Context) <-chan ConnEvent {
	return h.N.SubscribeConn(ctx)
}

// PathTo is the best path to p now.
func (h *StreamHost) PathTo(p peer.ID) Path { return h.N.ConnStatus(p).Path }

// NewStream opens a stream to p, waiting up to Wait for a direct
// connection when only a relayed one exists.
func (h *StreamHost) NewStream(ctx context.Context, p peer.ID, pids ...protocol.ID) (network.Stream, error) {
	return h.N.NewStreamPreferDirect(ctx, p, max(h.Wait, 0), pids...)
}
