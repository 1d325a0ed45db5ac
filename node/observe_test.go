package node

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/internal/testmodels"
	"github.com/neuron-tai/meshp2p/metrics"
	"github.com/neuron-tai/meshp2p/session"
)

// sample is the value (a histogram's count) of metric name with label
// value lv ("" for none) in m's registry; -1 when absent.
func sample(t *testing.T, m *metrics.Metrics, name, lv string) float64 {
	t.Helper()
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, s := range f.GetMetric() {
			if lv != "" && (len(s.GetLabel()) == 0 || s.GetLabel()[0].GetValue() != lv) {
				continue
			}
			return value(s)
		}
	}
	return -1
}

func value(s *dto.Metric) float64 {
	switch {
	case s.Counter != nil:
		return s.GetCounter().GetValue()
	case s.Gauge != nil:
		return s.GetGauge().GetValue()
	case s.Histogram != nil:
		return float64(s.GetHistogram().GetSampleCount())
	}
	return -1
}

// A client node with metrics runs a generation whose middle hop dies:
// its origin metrics count the plans, the first token, the re-route and
// the recovery, and its status recorder the re-route and the generation.
func TestOriginMetricsFollowAReroute(t *testing.T) {
	model := testmodels.Path(t, "stories260K.gguf")
	tn := newTestNet(t)
	tn.shard(model, gguf.Range{Start: 0, End: 2})
	mids := []*Node{tn.shard(model, gguf.Range{Start: 2, End: 4}), tn.shard(model, gguf.Range{Start: 2, End: 4})}
	tn.shard(model, gguf.Range{Start: 4, End: 5})
	m := metrics.New()
	cfg := tn.config(t.TempDir())
	cfg.P2P = clientPreset(cfg.P2P)
	cfg.Metrics = m
	c, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fp, nl := waitModel(t, c, "stories260K")
	for deadline := time.Now().Add(30 * time.Second); len(c.Table().Shards(fp)) < 4 && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
	prompt := thinClientPrompt(t, c, fp, "Once upon a time")
	var killed atomic.Bool
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			for _, n := range mids {
				if n.Hop().Sessions() > 0 && n.Hop().DecodeSteps() >= 3 {
					killed.Store(true)
					_ = n.P2P().Host().Close()
					return
				}
			}
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	res, err := c.Origin(nil).Generate(context.Background(), session.GenerateRequest{Fingerprint: fp, NLayer: nl, Prompt: prompt, MaxTokens: 200})
	close(stop)
	<-done
	if err != nil || !killed.Load() || res.Reroutes != 1 {
		t.Fatalf("generate: %v, killed %v, reroutes %d", err, killed.Load(), res.Reroutes)
	}
	for _, w := range []struct {
		name, label string
		v           float64
	}{
		{"meshp2p_generations_total", "ok", 1},
		{"meshp2p_generations_total", "error", 0},
		{"meshp2p_generated_tokens_total", "", float64(len(res.Tokens))},
		{"meshp2p_ttft_seconds", "", 1},
		{"meshp2p_reroutes_total", "", 1},
		{"meshp2p_reroute_recovery_seconds", "", 1},
		{"meshp2p_route_plan_seconds", "ok", 2},
		{"meshp2p_sessions_admitted_total", "", 0}, // a client runs no hop
	} {
		if got := sample(t, m, w.name, w.label); got != w.v {
			t.Errorf("%s{%s} = %v, want %v", w.name, w.label, got, w.v)
		}
	}
	if cn := c.Recorder().Counters(); cn.Reroutes != 1 || cn.Generations != 1 || cn.TokensReceived != uint64(len(res.Tokens)) {
		t.Errorf("recorder %+v", cn)
	}
	if rs := c.Recorder().Routes(); len(rs) != 2 || !rs[0].Reroute || rs[0].HopIndex != -1 || rs[1].Reroute || len(rs[0].Hops) != 3 {
		t.Errorf("recorded routes %+v", rs)
	}
	if sample(t, m, "libp2p_rcmgr_streams", "") < 0 {
		t.Error("no go-libp2p metrics in the client's registry")
	}
}
