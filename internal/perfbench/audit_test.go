package perfbench

import (
	"context"
	"testing"
	"time"

	"github.com/neuron-tai/meshp2p/node"
	"github.com/neuron-tai/meshp2p/session"
)

// audit (issue 25): what verified hops cost on the 3-node loopback route.
// Transcripts (every hop digests its frames and signs a statement per
// window; the next hop checks it; the upstream hop keeps what it sent)
// against none, interleaved; then one audit of the middle hop: its replay
// against the hop's own compute for the same steps, and the recorded
// inputs fetched against the stated bound (n_ctx_needed × n_embd × 4).
func audit(b *testing.B, t *Table, lb *Loopback, whole string, threads, rounds, tokens int) {
	ctx := context.Background()
	p := prompt(16)
	// Transcripts on, never audited: what every session pays.
	transcripts := &session.Auditor{Rate: 1e-9, Draw: func() float64 { return 1 }}
	var off, on []time.Duration
	for r := range rounds {
		for j := range 2 {
			lb.Audit = nil
			if alternate(r, j, 2) == 1 {
				lb.Audit = transcripts
			}
			res, err := lb.Generate(ctx, p, tokens, session.DefaultChunk)
			if err != nil {
				b.Fatal(err)
			}
			if lb.Audit == nil {
				off = append(off, PerToken(res))
			} else {
				on = append(on, PerToken(res))
			}
		}
	}
	b.Logf("audit: transcripts off %v, on %v", off, on)
	t.Add(Row{Name: "3-node loopback, signed transcripts", Value: medianMs(on), Unit: "ms/token", Baseline: medianMs(off), BaseName: "no transcripts", Goal: "<= 1.01"})
	t.Add(Row{Name: "  transcripts / none, paired", Value: pairedRatio(off, on), Unit: "x", Goal: "<= 1.01"})

	// One audit of the middle hop, replayed from the whole model file.
	eng := &node.AuditEngines{Models: []string{whole}, DataDir: b.TempDir(), Threads: threads}
	defer eng.Close()
	var rep session.AuditReport
	draws := []float64{0, 0.5} // audit this generation; then hop 1 of 3
	lb.Audit = &session.Auditor{Rate: 1, Engines: eng, Protocol: lb.Client.P2P().ProtocolID(session.ProtoAudit, session.ProtoVersion),
		OnReport: func(r session.AuditReport) { rep = r },
		Draw: func() float64 {
			d := draws[0]
			draws = append(draws[1:], draws[0])
			return d
		}}
	defer func() { lb.Audit = nil }()
	// The first audit loads the window (split once, mapped); the second is
	// the one measured.
	var res *session.Result
	for range 2 {
		var err error
		if res, err = lb.Generate(ctx, p, tokens, session.DefaultChunk); err != nil {
			b.Fatal(err)
		}
		lb.Audit.Wait()
		if rep.Outcome != session.AuditPassed {
			b.Fatalf("audit of an honest hop: %+v", rep)
		}
	}
	h := res.HopStats[rep.Hop]
	hopCompute := time.Duration((float64(h.PrefillUs) + h.MeanUs*float64(len(res.Tokens)-1)) * float64(time.Microsecond))
	t.Add(Row{Name: "audit: replay of hop 1 (prefill + decode)", Value: medianMs([]time.Duration{rep.Replay}), Unit: "ms", Baseline: medianMs([]time.Duration{hopCompute}), BaseName: "the hop's compute, same steps", Goal: "~1"})
	nEmbd := lb.Nodes[rep.Hop].Shard().Info().NEmbd
	bound := float64((len(p)+tokens+1)*nEmbd*4) / 1024
	t.Add(Row{Name: "audit: recorded inputs fetched", Value: float64(rep.InputBytes) / 1024, Unit: "KiB", Baseline: bound, BaseName: "n_ctx_needed × n_embd × 4", Goal: "<= 1"})
}
