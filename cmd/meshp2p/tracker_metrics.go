package main

import (
	"context"
	"io"
	"log/slog"

	"github.com/neuron-tai/meshp2p/route"
	"github.com/neuron-tai/meshp2p/status"
	"github.com/neuron-tai/meshp2p/tracker"
)

// serveTrackerMetrics registers the tracker's gauges and serves --metrics.
func serveTrackerMetrics(stdout io.Writer, log *slog.Logger, mf *metricsFlag, tr *tracker.Tracker) (func(), error) {
	if mf.m == nil {
		return func() {}, nil
	}
	mf.m.P2P(tr.P2P())
	mf.m.Table(tr.Table())
	mf.m.Counter("tracker_tickets_issued_total", "Route tickets this tracker signed.", func() float64 { return float64(tr.Issued()) })
	c := &status.Collector{P2P: tr.P2P(), Table: tr.Table(), Self: func() (status.Self, []route.Shard) {
		in := tr.Info()
		return status.Self{PeerID: in.PeerID, Role: "tracker", Network: in.Network, Addrs: in.Addrs}, nil
	}}
	return mf.serve(stdout, log, func(ctx context.Context) *status.Document { return c.Document(ctx) })
}
