// Package perfbench measures the swarm against its floors (issue 16): the
// 3-hop ring over links with a one-way delay h against Σcompute + k·h,
// many concurrent sessions, the 3-node loopback route against the whole
// model, and a 512-token prefill. `make bench` runs BenchmarkPerf, which
// prints one table with every figure and its ratio to a baseline measured
// in the same run; docs/performance.md records the figures.
//
// The rings run the real route-session code (session.HopService and
// session.Origin) over go-libp2p's simulated network (mocknet), whose
// links deliver every write exactly h after it was made. Inside
// testing/synctest that time is virtual and exact (TestRingLatencyFloorExact);
// with real llama.cpp shards it is real time. The floor-tcp section checks
// the floor through real TCP instead: real nodes on 127.0.0.1, each behind
// an internal/delayproxy. The sessions-small section runs the many-sessions
// ring on the committed stories260K, whose compute is small against h.
package perfbench
