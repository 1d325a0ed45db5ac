package p2p

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/pnet"
	ipnet "github.com/libp2p/go-libp2p/p2p/net/pnet"
	"github.com/libp2p/go-libp2p/p2p/security/noise"
	"github.com/multiformats/go-multistream"
)

// ErrProbeNeedsKey: a peer id cannot be learnt safely from a bare
// host:port without a swarm key.
var ErrProbeNeedsKey = errors.New("learning a peer id from host:port needs a swarm key")

// ProbePeerID learns the peer id of the swarm member listening on TCP at
// hostport, so a bootstrap peer can be given as host:port instead of a
// multiaddr ending in /p2p/<id>. go-libp2p dials only known peer ids
// (its upgrader refuses an outbound connection without one), so this
// runs the first steps of the handshake itself: TCP, the private
// network's PSK layer, multistream-select "/noise", and a Noise
// handshake that takes whatever identity the listener proves, with a
// throwaway key of our own; then it hangs up.
//
// It is safe only under a swarm key: the PSK layer makes every byte
// unreadable to anyone without the key, so the identity learnt is that
// of a swarm member (who could join the swarm anyway). Without a key an
// attacker on the path could answer with its own identity, so a nil psk
// is refused (ErrProbeNeedsKey).
func ProbePeerID(ctx context.Context, hostport string, psk pnet.PSK) (peer.ID, error) {
	if len(psk) == 0 {
		return "", ErrProbeNeedsKey
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", hostport)
	if err != nil {
		return "", err
	}
	defer raw.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = raw.SetDeadline(dl)
	}
	conn, err := ipnet.NewProtectedConn(psk, raw)
	if err != nil {
		return "", err
	}
	if err := multistream.SelectProtoOrFail(noise.ID, conn); err != nil {
		return "", fmt.Errorf("no Noise handshake offered (another swarm key, or not a meshp2p node?): %w", err)
	}
	priv, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		return "", err
	}
	base, err := noise.New(noise.ID, priv, nil)
	if err != nil {
		return "", err
	}
	tr, err := base.WithSessionOptions(noise.DisablePeerIDCheck())
	if err != nil {
		return "", err
	}
	sc, err := tr.SecureOutbound(ctx, conn, "")
	if err != nil {
		return "", fmt.Errorf("handshake failed (another swarm key?): %w", err)
	}
	defer sc.Close()
	return sc.RemotePeer(), nil
}
