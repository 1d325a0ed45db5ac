package p2p

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
)

// A bootstrap dial whose security handshake runs out of time is one of
// two things: an endpoint that accepts TCP connections and never speaks
// (a port forwarded to nothing, another program, a frozen process), or a
// meshp2p node on another swarm key, whose answer, decrypted with the
// wrong key, reads as the start of a message that never ends. Only the
// second speaks: a libp2p host writes its protocol header (under a swarm
// key, after its nonce) as soon as it accepts. So after such a timeout the
// node connects once more, says nothing, and listens.

// speech is what probeSilence heard.
type speech int

const (
	speechUnknown  speech = iota // no probe: the handshake did not time out
	speechNone                   // every address accepted and said nothing
	speechSome                   // some address spoke: a handshake mismatch
	speechUnprobed               // no address could be probed (not IP/TCP, or not accepted)
)

// silenceProbe is how long a probe connection waits for a first byte.
const silenceProbe = 2 * time.Second

// handshakeTimedOut reports whether a dial failed because the security
// negotiation ran out of time.
func handshakeTimedOut(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "failed to negotiate security protocol") &&
		(errors.Is(err, context.DeadlineExceeded) || strings.Contains(msg, "deadline exceeded") || strings.Contains(msg, "i/o timeout"))
}

// probeSilence connects to each IP/TCP address of addrs at once, sends
// nothing, and reports whether any of them spoke within silenceProbe.
func (n *Node) probeSilence(addrs []multiaddr.Multiaddr) speech {
	ctx, cancel := context.WithTimeout(n.ctx, silenceProbe)
	defer cancel()
	var (
		wg            sync.WaitGroup
		silent, spoke atomic.Int32
	)
	for _, a := range addrs {
		if _, err := a.ValueForProtocol(multiaddr.P_TCP); err != nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var d manet.Dialer
			c, err := d.DialContext(ctx, a)
			if err != nil {
				return
			}
			defer c.Close()
			dl, _ := ctx.Deadline()
			_ = c.SetReadDeadline(dl)
			_, err = c.Read(make([]byte, 1))
			var ne net.Error
			switch {
			case err == nil:
				spoke.Add(1)
			case errors.As(err, &ne) && ne.Timeout():
				silent.Add(1)
			} // closed or reset without a word: neither
		}()
	}
	wg.Wait()
	switch {
	case spoke.Load() > 0:
		return speechSome
	case silent.Load() == 0:
		return speechUnprobed
	}
	return speechNone
}
