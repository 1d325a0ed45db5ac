package p2p

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
)

// Bootstrap dialling: every bootstrap peer that is not connected is dialled
// with its own exponential backoff (bootstrapRetryMin doubling to
// bootstrapRetryMax), so a node started before its bootstrap peer joins
// within a second or two, and a dead address costs one dial a minute. Each
// failure is classified into the reason a user can act on (ErrNoPeers and
// BootstrapStatus carry it); the first failure of a peer, every change of
// reason and every 8th repeat are logged as warnings.
const (
	bootstrapRetryMin    = time.Second
	bootstrapRetryMax    = time.Minute
	bootstrapDialTimeout = 15 * time.Second
	// bootstrapDefinite is how many definite failures (refused, handshake,
	// wrong network or identity: retrying soon will not help) of every
	// bootstrap peer make Unreachable report true; one failure of an
	// endpoint that never answered is enough (it took a dial timeout).
	bootstrapDefinite = 2
)

// ErrNoPeers means the node is connected to no peer of its swarm. Its
// message carries what went wrong with each bootstrap peer.
var ErrNoPeers = errors.New("connected to no peer of the swarm")

// ErrWrongNetwork: a bootstrap peer answered, but it runs another swarm
// name (--network).
var ErrWrongNetwork = errors.New("peer is on another network")

// BootstrapPeerStatus is the state of one configured bootstrap peer.
type BootstrapPeerStatus struct {
	Peer      peer.ID
	Addrs     []string
	Connected bool
	Failures  int    // consecutive failed dials
	LastError string // classified reason of the last failure ("" if none)
	definite  bool   // the last failure is one a quick retry will not fix
	// silent: the last failure was an endpoint that accepted the
	// connection and never answered; one is conclusive, it took the whole
	// dial timeout.
	silent bool
}

type bootState struct {
	mu    sync.Mutex
	peers []*bootPeer
}

type bootPeer struct {
	ai      peer.AddrInfo
	next    time.Time
	backoff time.Duration
	st      BootstrapPeerStatus
}

func newBootState(ais []peer.AddrInfo) *bootState {
	b := &bootState{}
	for _, ai := range ais {
		bp := &bootPeer{ai: ai, backoff: bootstrapRetryMin}
		bp.st.Peer = ai.ID
		for _, a := range ai.Addrs {
			bp.st.Addrs = append(bp.st.Addrs, a.String())
		}
		b.peers = append(b.peers, bp)
	}
	return b
}

// BootstrapStatus reports each configured bootstrap peer.
func (n *Node) BootstrapStatus() []BootstrapPeerStatus {
	n.boot.mu.Lock()
	defer n.boot.mu.Unlock()
	out := make([]BootstrapPeerStatus, 0, len(n.boot.peers))
	for _, bp := range n.boot.peers {
		st := bp.st
		st.Connected = n.host.Network().Connectedness(bp.ai.ID) == network.Connected
		out = append(out, st)
	}
	return out
}

// PeerCount is the number of peers with a live connection.
func (n *Node) PeerCount() int { return len(n.host.Network().Peers()) }

// NoPeersError returns nil while the node has a connection to any peer,
// else an error wrapping ErrNoPeers that says why each bootstrap peer could
// not be reached.
func (n *Node) NoPeersError() error {
	if n.PeerCount() > 0 {
		return nil
	}
	sts := n.BootstrapStatus()
	if len(sts) == 0 {
		return fmt.Errorf("%w: no bootstrap peers configured (--bootstrap)", ErrNoPeers)
	}
	var parts []string
	for _, st := range sts {
		why := st.LastError
		if why == "" {
			why = "not reached yet"
		}
		parts = append(parts, fmt.Sprintf("bootstrap %s (%s): %s", st.Peer, strings.Join(st.Addrs, ", "), why))
	}
	return fmt.Errorf("%w: %s", ErrNoPeers, strings.Join(parts, "; "))
}

// Unreachable reports whether the node has no connection and every
// bootstrap peer failed at least bootstrapDefinite times for a reason a
// retry will not fix soon (refused, handshake, other network, other
// identity). Clients use it to give up early.
func (n *Node) Unreachable() bool {
	if n.PeerCount() > 0 {
		return false
	}
	n.boot.mu.Lock()
	defer n.boot.mu.Unlock()
	if len(n.boot.peers) == 0 {
		return false
	}
	for _, bp := range n.boot.peers {
		if !bp.st.definite || (bp.st.Failures < bootstrapDefinite && !bp.st.silent) {
			return false
		}
	}
	return true
}

// bootstrapLoop dials bootstrap peers now and, while they are not
// connected, again after each one's backoff, until Close. After the first
// success it bootstraps the DHT.
func (n *Node) bootstrapLoop() {
	defer n.wg.Done()
	dhtStarted := false
	warnedAlone := false
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-timer.C:
		}
		now := time.Now()
		connected := 0
		next := now.Add(bootstrapRetryMax)
		for _, bp := range n.boot.peers {
			if bp.ai.ID == n.host.ID() {
				continue
			}
			if n.host.Network().Connectedness(bp.ai.ID) == network.Connected {
				connected++
				continue
			}
			if bp.next.After(now) {
				next = earliest(next, bp.next)
				continue
			}
			if err := n.dialBootstrap(bp); err != nil {
				if n.ctx.Err() != nil {
					return
				}
				next = earliest(next, bp.next)
				continue
			}
			connected++
		}
		if connected > 0 {
			warnedAlone = false
			if !dhtStarted && n.kad != nil {
				dhtStarted = true
				if err := n.kad.Bootstrap(n.ctx); err != nil {
					n.log.Warn("DHT bootstrap", "err", err)
				}
			}
		} else if n.PeerCount() == 0 && !warnedAlone {
			warnedAlone = true
			// The reason was just logged per peer: repeated only when
			// several peers' reasons add up to it.
			var args []any
			if len(n.boot.peers) > 1 {
				args = append(args, "err", n.NoPeersError())
			}
			n.log.Log(n.ctx, n.dialFailureLevel(), "connected to no peer of the swarm yet; still trying the bootstrap peers", args...)
		}
		// Come back when the next peer is due, or within a second while
		// anything is connected (a dropped bootstrap connection is then
		// redialled promptly with a fresh backoff).
		wait := time.Until(next)
		if connected > 0 {
			wait = min(wait, bootstrapRetryMin)
		}
		timer.Reset(max(wait, 10*time.Millisecond))
	}
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// dialBootstrap dials one bootstrap peer and updates its status.
func (n *Node) dialBootstrap(bp *bootPeer) error {
	// We pace bootstrap dials ourselves; the swarm's own dial backoff
	// would hide the real error behind "dial backoff".
	n.clearDialBackoff(bp.ai.ID)
	ctx, cancel := context.WithTimeout(n.ctx, bootstrapDialTimeout)
	err := n.host.Connect(ctx, bp.ai)
	cancel()
	if err == nil {
		err = n.checkNetwork(bp.ai.ID)
		if err != nil {
			_ = n.host.Network().ClosePeer(bp.ai.ID)
		}
	}
	silence := speechUnknown
	if err != nil && handshakeTimedOut(err) {
		silence = n.probeSilence(bp.ai.Addrs) // before the lock: it takes up to silenceProbe
	}
	n.boot.mu.Lock()
	defer n.boot.mu.Unlock()
	if err == nil {
		if bp.st.Failures > 0 {
			n.log.Info("connected to bootstrap peer", "peer", bp.ai.ID, "after_failures", bp.st.Failures)
		} else {
			n.log.Info("connected to bootstrap peer", "peer", bp.ai.ID)
		}
		bp.st.Failures, bp.st.LastError, bp.st.definite = 0, "", false
		bp.backoff = bootstrapRetryMin
		return nil
	}
	if n.ctx.Err() != nil {
		return err
	}
	why, definite := n.classifyDialError(err, bp.st.Addrs, silence)
	bp.st.silent = silence == speechNone
	bp.st.Failures++
	if why != bp.st.LastError || bp.st.Failures == 1 || bp.st.Failures%8 == 0 {
		n.log.Log(n.ctx, n.dialFailureLevel(), "cannot reach bootstrap peer", "peer", bp.ai.ID, "addrs", bp.st.Addrs,
			"reason", why, "attempts", bp.st.Failures, "retry_in", bp.backoff)
	}
	n.log.Debug("bootstrap dial failed", "peer", bp.ai.ID, "err", err)
	bp.st.LastError, bp.st.definite = why, definite
	bp.next = time.Now().Add(bp.backoff)
	bp.backoff = min(2*bp.backoff, bootstrapRetryMax)
	return err
}

// dialFailureLevel is the level of bootstrap dial failures: warn on a
// node; info on a client (generate, chat, status, serve), whose command
// fails with the same reason when no peer answers (so generate, which
// logs warnings only, says it once, not three times).
func (n *Node) dialFailureLevel() slog.Level {
	if n.cfg.Role == "client" {
		return slog.LevelInfo
	}
	return slog.LevelWarn
}

// checkNetwork compares the swarm name in p's user agent
// (meshp2p/<network>/<role>/<version>, learnt by identify during Connect)
// with ours.
func (n *Node) checkNetwork(p peer.ID) error {
	v, err := n.host.Peerstore().Get(p, "AgentVersion")
	if err != nil {
		return nil // identify has not told us: nothing to compare
	}
	agent, _ := v.(string)
	rest, ok := strings.CutPrefix(agent, "meshp2p/")
	if !ok {
		return fmt.Errorf("%w: the peer is not a meshp2p node (agent %q)", ErrWrongNetwork, agent)
	}
	if netName, _, _ := strings.Cut(rest, "/"); netName != n.cfg.Network {
		return fmt.Errorf("%w: it answers on --network %q, this node is on %q", ErrWrongNetwork, netName, n.cfg.Network)
	}
	return nil
}

// classifyDialError turns a dial error for a peer at addrs into a reason a
// user can act on, and says whether retrying soon is pointless. silence is
// what probeSilence found after a handshake that ran out of time.
func (n *Node) classifyDialError(err error, addrs []string, silence speech) (string, bool) {
	msg := err.Error()
	private, fp := n.Private()
	var ne net.Error
	switch {
	case silence == speechNone:
		return fmt.Sprintf("no answer from %s: it accepted the connection but never said a word of the handshake (is it a meshp2p node, and the port right? a stopped or frozen process?)", strings.Join(addrs, ", ")), true
	case silence == speechUnprobed:
		return fmt.Sprintf("no answer from %s within the handshake (a silent endpoint, or a node with another swarm key)", strings.Join(addrs, ", ")), true
	case errors.Is(err, ErrWrongNetwork):
		return err.Error(), true
	case strings.Contains(msg, "peer id mismatch"):
		return "the address answers with another peer id (is the /p2p/<id> in --bootstrap current? the node's identity may have changed)", true
	case errors.Is(err, syscall.ECONNREFUSED) || strings.Contains(msg, "connection refused"):
		return "connection refused: nothing listens at that address (is the node running? is the port right?)", true
	case strings.Contains(msg, "failed to negotiate security protocol") || strings.Contains(msg, "failed to negotiate stream multiplexer"):
		if private {
			return fmt.Sprintf("handshake failed: different swarm key? (this node's key fingerprint %s; the peer has another key or none)", fp), true
		}
		return "handshake failed: the peer may run a private swarm (start with its --swarm-key)", true
	case errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) || strings.Contains(msg, "timeout"):
		return "timed out: host unreachable, a firewall drops the packets, or the address is wrong", false
	case errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH) || strings.Contains(msg, "no route to host") || strings.Contains(msg, "network is unreachable"):
		return "no route to the host (wrong address or network down)", false
	default:
		return msg, false
	}
}
