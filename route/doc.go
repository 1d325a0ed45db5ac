// Package route turns the swarm's capability adverts into routes: ordered
// hops covering a model's layers. It plans; it does not run generations
// (session.Origin does, and asks a Planner again when a hop fails).
//
//	table.go          Table: the shards adverts offer (DecodeAdvert), by
//	                  peer, with the convictions of trusted trackers
//	offers.go         offers of models peers would load, and the demand
//	                  reports adverts carry
//	plan.go           Route, Hop, Request, NoRouteError; the local planners
//	core.go           the planners' shared core: usable shards, shortest
//	                  covering chains
//	cost.go           CostPlanner: the cost model (compute, latency, queue)
//	defaults.go       the cost model's defaults
//	ticket.go         route tickets a tracker signs, and their checks
//	tracker_client.go TrackerPlanner: routes asked of trackers, verified
//	audit.go          audit assignments committed in tickets; submitting a
//	                  fraud proof to a tracker
package route
