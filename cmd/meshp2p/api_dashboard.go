package main

import (
	"context"
	"log/slog"

	"github.com/neuron-tai/meshp2p/api"
	"github.com/neuron-tai/meshp2p/dashboard"
	"github.com/neuron-tai/meshp2p/metrics"
	"github.com/neuron-tai/meshp2p/node"
	"github.com/neuron-tai/meshp2p/status"
)

// dashboardMount serves /metrics, /api/status and the dashboard beside the
// API's /v1/ (outside its key, like --metrics): the dashboard's chat panel
// then streams from the same origin's /v1/chat/completions. n's status
// document is served under role.
func dashboardMount(m *metrics.Metrics, n *node.Node, role string, log *slog.Logger) func(*api.Server) {
	return func(s *api.Server) {
		o := dashboard.Options{Status: func(ctx context.Context) *status.Document { return n.Status(ctx, role) }, Logger: log}
		if m != nil {
			o.Metrics = m.Handler()
		}
		s.Handle("/", dashboard.Handler(o))
	}
}
