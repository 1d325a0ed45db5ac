package p2p

import (
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// Path is how a peer is reached right now.
type Path int

const (
	PathNone    Path = iota // not connected
	PathDirect              // at least one connection without /p2p-circuit
	PathRelayed             // only connections through a circuit relay
)

func (p Path) String() string {
	switch p {
	case PathDirect:
		return "direct"
	case PathRelayed:
		return "relayed"
	default:
		return "none"
	}
}

// ConnStatus is the local view of one peer's connectivity.
type ConnStatus struct {
	Path Path
	// Limited is true when every live connection is limited (a relay that
	// enforces a data/duration limit). meshp2p relays run unlimited, so a
	// relayed connection through them has Limited false.
	Limited bool
	// Conns counts live connections to the peer.
	Conns     int
	HolePunch HolePunchStats
}

// HolePunchStats counts DCUtR activity with one peer since the node started.
type HolePunchStats struct {
	Attempts  int // hole-punch rounds started (StartHolePunch events)
	Successes int
	Failures  int
	LastError string
	LastAt    time.Time // end of the last round
}

// ConnEventKind says what happened to a peer's connectivity.
type ConnEventKind int

const (
	// Connected: first connection to the peer (Path says which kind).
	Connected ConnEventKind = iota + 1
	// Disconnected: the last connection closed.
	Disconnected
	// PathChanged: the best path changed while connected (relayed → direct
	// after a hole punch, or direct → relayed when the direct one dropped).
	// Owners of long-lived streams reopen them on this event; new streams
	// already prefer the direct connection.
	PathChanged
	// HolePunchStarted and HolePunchFinished report DCUtR rounds;
	// Status.HolePunch holds the running counts.
	HolePunchStarted
	HolePunchFinished
)

func (k ConnEventKind) String() string {
	switch k {
	case Connected:
		return "connected"
	case Disconnected:
		return "disconnected"
	case PathChanged:
		return "path-changed"
	case HolePunchStarted:
		return "holepunch-started"
	case HolePunchFinished:
		return "holepunch-finished"
	default:
		return "unknown"
	}
}

// ConnEvent is one connectivity change.
type ConnEvent struct {
	Kind   ConnEventKind
	Peer   peer.ID
	Status ConnStatus // after the change
	// Success and Error are set on HolePunchFinished.
	Success bool
	Error   string
	At      time.Time
}
