package node

import "time"

// The node's timings besides the role presets (defaults.go), each with its
// reason. The route-session protocol's timeouts live in session/defaults.go,
// the tracker's in tracker/defaults.go.
const (
	// AdvertCheckInterval is how often a node compares its free capacity
	// and measured speed with what it last advertised.
	AdvertCheckInterval = 2 * time.Second
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
