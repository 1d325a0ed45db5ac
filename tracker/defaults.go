package tracker

import "time"

// Every default and timeout of the tracker, with its reason.
const (
	// DefaultTicketTTL is how long an issued ticket is valid. A ticket is
	// checked at admission only, so it bounds the time between asking and
	// opening the session, not the session.
	DefaultTicketTTL = 2 * time.Minute
	// DefaultPingInterval is how often every advertising peer's RTT is
	// measured.
	DefaultPingInterval = 10 * time.Second
	// StaleAfterPings: a peer without a successful ping for this many
	// intervals ages out of routes.
	StaleAfterPings = 3
	// PingTimeout bounds one ping (or the interval, if shorter).
	PingTimeout = 5 * time.Second
	// MaxConcurrentPings bounds pings in flight.
	MaxConcurrentPings = 16
	// RTTWindow is how many recent ping samples a peer's RTT is the
	// minimum of: the path's latency without the queueing noise of busy
	// hosts.
	RTTWindow = 8
	// RequestTimeout bounds one route request on the wire.
	RequestTimeout = 10 * time.Second
	// IdentifyWait bounds the relay ACL's wait for identify to tell
	// whether a peer speaks this swarm's protocols.
	IdentifyWait = 3 * time.Second
)
