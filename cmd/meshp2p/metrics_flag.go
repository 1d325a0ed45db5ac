package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"

	"github.com/neuron-tai/meshp2p/dashboard"
	"github.com/neuron-tai/meshp2p/metrics"
	"github.com/neuron-tai/meshp2p/status"
)

// metricsFlag is --metrics ADDR: one HTTP server with Prometheus metrics
// (/metrics), the status document (/api/status) and the dashboard (/).
type metricsFlag struct {
	addr   string
	always bool // make the registry without --metrics too (start --api serves it)
	m      *metrics.Metrics
}

func (f *metricsFlag) register(fs *flag.FlagSet) {
	fs.StringVar(&f.addr, "metrics", "", "serve Prometheus metrics (/metrics), the status document (/api/status) and the dashboard (/) on this HOST:PORT (e.g. 127.0.0.1:9090; not authenticated: keep it on loopback or a trusted network)")
}

// metrics returns the process's registry (nil without --metrics, unless
// always).
func (f *metricsFlag) metrics() (*metrics.Metrics, error) {
	if f.addr == "" && !f.always {
		return nil, nil
	}
	if f.addr != "" {
		if _, _, err := net.SplitHostPort(f.addr); err != nil {
			return nil, fmt.Errorf("%w: --metrics %q: want HOST:PORT: %v", errUsage, f.addr, err)
		}
	}
	if f.m == nil {
		f.m = metrics.New()
	}
	return f.m, nil
}

// serve starts the server (a no-op without --metrics) and prints its URL.
func (f *metricsFlag) serve(stdout io.Writer, log *slog.Logger, doc func(context.Context) *status.Document) (func(), error) {
	if f.m == nil || f.addr == "" {
		return func() {}, nil
	}
	srv, err := dashboard.Listen(f.addr, dashboard.Handler(dashboard.Options{Metrics: f.m.Handler(), Status: doc, Logger: log}), log)
	if err != nil {
		return nil, fmt.Errorf("--metrics: %w", err)
	}
	fmt.Fprintf(stdout, "metrics:  http://%s/metrics (dashboard http://%s/)\n", srv.Addr(), srv.Addr())
	log.Info("metrics, status and dashboard served", "addr", srv.Addr())
	var once sync.Once
	return func() { once.Do(func() { _ = srv.Close() }) }, nil
}
