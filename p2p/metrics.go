package p2p

import (
	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/relay"
	"github.com/libp2p/go-libp2p/p2p/protocol/holepunch"
	"github.com/prometheus/client_golang/prometheus"
)

// go-libp2p registers its metrics (libp2p_rcmgr_*, libp2p_swarm_*,
// libp2p_identify_*, libp2p_autonat_*, libp2p_autonatv2_*,
// libp2p_holepunch_*, libp2p_autorelay_*, libp2p_eventbus_*) with the
// registerer it is given; the relay service and our hole-punch tracer are
// set up here, so they get it explicitly. kad-dht and gossipsub report
// through OpenTelemetry and are not exported.

// metricsOption turns go-libp2p's metrics on with reg, or off (nil).
func metricsOption(reg prometheus.Registerer) libp2p.Option {
	if reg == nil {
		return libp2p.DisableMetrics()
	}
	return libp2p.PrometheusRegisterer(reg)
}

// holePunchTracer keeps our event tracer (connection status, PathChanged)
// and adds go-libp2p's metrics tracer when metrics are on: go-libp2p's own
// default would be replaced by our option otherwise.
func holePunchTracer(reg prometheus.Registerer, et holepunch.EventTracer) holepunch.Option {
	if reg == nil {
		return holepunch.WithTracer(et)
	}
	return holepunch.WithMetricsAndEventTracer(holepunch.NewMetricsTracer(holepunch.WithRegisterer(reg)), et)
}

// relayMetrics are the relay service's metrics options.
func relayMetrics(reg prometheus.Registerer) []relay.Option {
	if reg == nil {
		return nil
	}
	return []relay.Option{relay.WithMetricsTracer(relay.NewMetricsTracer(relay.WithRegisterer(reg)))}
}
