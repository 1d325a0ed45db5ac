package route

import "time"

// The route package's defaults, with their reasons. Wire limits (ticket
// and advert bounds) stay with the formats they bound (ticket.go,
// table.go); LocalPlanner's edge costs are its fixed model (plan.go).
const (
	// DefaultClockSkew is tolerated around a ticket's validity window.
	DefaultClockSkew = 30 * time.Second
	// DefaultTrackerTimeout bounds one route request to a tracker: it
	// answers from memory, so a slow answer means an unreachable tracker
	// (the planner then asks the next one or falls back to local
	// planning).
	DefaultTrackerTimeout = 5 * time.Second
)

// DefaultCostModel returns the default constants.
func DefaultCostModel() CostModel {
	return CostModel{DefaultMsPerLayer: 1, DefaultRTT: 20 * time.Millisecond, RelayRTTFactor: 2, RelayExtra: 10 * time.Millisecond,
		LoadSlowdown: 1, MaxQueue: 8, PendingWindow: 5 * time.Second, Quantum: time.Millisecond, MaxPendingPerClient: 2}
}
