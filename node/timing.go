package node

import "time"

// Every duration the node waits, polls or bounds something by, and the
// ratios that shape those waits (jitter, re-publish threshold), each with
// its reason. The role presets and the node's other defaults (sizes,
// counts, names) are in defaults.go. The route-session protocol's timeouts
// live in session/defaults.go, the tracker's in tracker/defaults.go.
const (
	// DirectWait is how long a data-plane stream to a peer reached only
	// through a relay waits for a hole punch to give a direct connection
	// (punches measured 20–220 ms in the NAT testnet; a failed one is
	// remembered).
	DirectWait = 3 * time.Second
	// AdvertCheckInterval is how often a node compares its free capacity
	// and measured speed with what it last advertised.
	AdvertCheckInterval = 2 * time.Second
	// AdvertSessionGap is the least time between two capacity checks
	// that sessions starting or ending set off (a busy hop sees many a
	// second; each re-publish is one gossip message to the swarm).
	AdvertSessionGap = 250 * time.Millisecond
	// AdvertSpeedChange is the relative change of the measured speed that
	// re-publishes the advert (the tracker's cost model reads it; smaller
	// changes are noise).
	AdvertSpeedChange = 0.25
	// LookupTimeout bounds one DHT provider lookup for a model.
	LookupTimeout = 3 * time.Second
	// RediscoverPause separates the DHT lookups of an origin waiting for a
	// replacement peer (its advert may be one republish away).
	RediscoverPause = 2 * time.Second
)

// Placement timings (placement.go, docs/placement.md).
const (
	// DefaultRebalanceInterval is how often a node checks its window.
	DefaultRebalanceInterval = 2 * time.Minute
	// RebalanceJitter spreads the checks of nodes started together.
	RebalanceJitter = 0.25
	// PlacementSettle is how long a starting node waits to connect and
	// pull the swarm's adverts before choosing.
	PlacementSettle = 3 * time.Second
	// settlePoll is how often a settling node looks for a peer's advert.
	settlePoll = 100 * time.Millisecond
	// PlacementPause is the most a node waits between announcing its
	// choice and reconsidering it (random in [0, PlacementPause)), so
	// nodes starting together see each other's choices.
	PlacementPause = 2 * time.Second
	// DrainTimeout bounds how long a moving node lets sessions on its old
	// window finish before ending them (their origins re-route).
	DrainTimeout = 2 * time.Minute
	// LivenessDial bounds the dial that checks a peer we hold no
	// connection to before its adverts count (a crashed node's advert
	// lives until its TTL).
	LivenessDial = 2 * time.Second
	// LossCheckDelay is how soon after losing its connection to a peer a
	// self-placing node checks its window (plus up to LossCheckJitter, so
	// nodes that saw the same crash do not check in the same instant): a
	// crash is healed in seconds, not at the next period.
	LossCheckDelay  = 2 * time.Second
	LossCheckJitter = 2 * time.Second
	// HealRecheck is how soon a node checks again while the model has no
	// route (a heal plan waits for a second check that agrees; a planned
	// window for its load).
	HealRecheck = 5 * time.Second
)

// Fetch timings (fetch.go, docs/fetch.md).
const (
	// DefaultFetchWait is how long a fetch waits for peers that serve the
	// model.
	DefaultFetchWait = 60 * time.Second
	// urlManifestWait bounds how long a URL fetch looks for a peer with
	// the file's manifest before it concludes it is the model's first
	// node; it concludes so sooner once two advert pulls from connected
	// peers showed no candidate.
	urlManifestWait = 20 * time.Second
	// fetchPoll is how often a fetch waiting for peers re-pulls adverts
	// and asks the DHT, and what bounds each of those rounds.
	fetchPoll = time.Second
	// settleTableMax bounds how long a fetch waits for the table to stop
	// changing after a last pull; settleTableQuiet is how long unchanged
	// counts as settled.
	settleTableMax   = 2 * time.Second
	settleTableQuiet = 250 * time.Millisecond
	// MoveProgressInterval is how often a move's fetch logs its progress
	// (a move runs in the background: a log line, not a progress bar).
	MoveProgressInterval = 10 * time.Second
)

// DefaultDemandInterval is how often a node gossips the demand its
// origins measured (in its advert; readers keep one report per author
// per 5 s, package demand).
const DefaultDemandInterval = 10 * time.Second

// WarmCheck is how often a multi-model node looks whether a model it
// offers is asked for and has no route (then it checks at once, rather
// than at its next rebalance), jittered by ±RebalanceJitter.
const WarmCheck = 5 * time.Second

// ModelRetryBackoff is how long a multi-model node leaves a model out of
// its choice after a switch to it failed (its file could not be cut or
// loaded), so a lasting failure does not drain the served window again
// and again.
const ModelRetryBackoff = 10 * time.Minute
