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
	// RouteRequestBurst is how many route requests one client peer may
	// send at once: an origin asks once per session and once per reroute,
	// and an application starting a batch opens a few sessions together
	// (8 concurrent sessions from one origin is the spread test's load).
	RouteRequestBurst = 8
	// RouteRequestsPerSecond refills a client's bucket: 2 new sessions or
	// reroutes a second, sustained, is more than one origin's generations
	// take (each lasts seconds), and bounds what one peer id can make the
	// tracker sign and count as load.
	RouteRequestsPerSecond = 2
	// MaxPendingPerClient caps, per hop, the tickets of one client that
	// count as pending load: pending load exists to spread a burst before
	// adverts catch up, and sessions a client really opens show up in the
	// hop's advertised load within a few seconds. Tickets beyond this that
	// a client never uses cannot fill a hop for everyone else.
	MaxPendingPerClient = 2
	// MaxTrackedClients bounds the per-client rate-limit state; beyond it
	// the least recently seen client is forgotten (p2p/peerlimit).
	MaxTrackedClients = 4096
	// MaxVerifiedModels bounds the models whose verified layer count the
	// tracker keeps (the least recently used goes).
	MaxVerifiedModels = 256
	// MaxVocabSources is how many peers advertising a model's vocabulary
	// the tracker asks (hedged, vocab.FetchFirst) to verify its layer count.
	MaxVocabSources = 4
	// VerifyWait is how long a route request waits for a layer-count
	// verification under way (below route.DefaultTrackerTimeout); after
	// it the request is refused with a retry hint and the verification
	// goes on.
	VerifyWait = 4 * time.Second
	// VerifyRetryAfter is the retry hint of a request refused while its
	// model's layer count is being verified.
	VerifyRetryAfter = time.Second
)
