package perfbench

import (
	"bytes"
	"compress/flate"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/neuron-tai/meshp2p/engine"
	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/internal/delayproxy"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/session"
)

// uplinkPrompt is the uplink section's prompt: 2,000 tokens, issue 42's.
const uplinkPrompt = 2000

// UplinkSpec is the uplink section's model: wide hidden states (2048) for
// little compute (3 layers, one per hop, FF 512), so that a 2,000-token
// prompt's bytes, not its matmuls, are what a home uplink makes wait for:
// 2000 × 2048 × 4 = 16.4 MB of f32 per activation seam (f16: half).
func UplinkSpec() gguf.Spec {
	s := gguf.DefaultSpec("llama")
	s.Layers, s.Embd, s.Heads, s.KVHeads, s.FF, s.Type, s.Seed = 3, 2048, 16, 4, 512, gguf.TypeF16, 5
	return s
}

// uplink: a long prompt's time to first token over home uplinks (issue
// 42, item 3). Every node (the origin too) sits behind a delay proxy with
// a 20 ms one-way delay and an upload cap of 50, 10 or 5 Mbit/s: the
// bytes a hop sends to the next cross the next one's proxy in its upload
// direction, so each seam runs at the sender's uplink. UplinkSpec in 3
// hops has 2 activation seams. Each row's baseline is its floor: the
// longer of the same run with no cap (h = 20 ms: the compute) and one
// seam's bytes over the uplink (the seams overlap: the prefill is
// chunked). It also measures how far lossless compression of real f32
// activations would go.
func uplink(b *testing.B, t *Table, threads int) {
	ctx := context.Background()
	spec := UplinkSpec()
	_, shards, err := FilesOf(ctx, spec, 3)
	if err != nil {
		b.Fatal(err)
	}
	ec := engineCfg(threads)
	ec.NCtx, ec.NBatch, ec.MaxSessions = 2*(uplinkPrompt+64), 512, 2
	p := prompt(uplinkPrompt)
	compression(b, t, shards[0], ec, p)
	wires := []struct {
		name  string
		dtype meshp2pb.DType
		bytes float64 // per activation value on the wire
	}{{"f32", meshp2pb.DType_DTYPE_F32, 4}, {"f16", meshp2pb.DType_DTYPE_F16, 2}}
	uncapped := map[string]float64{}
	var want []int32
	for _, mbit := range []int64{0, 50, 10, 5} {
		rate := mbit * 1_000_000 / 8
		lb, err := StartWith(ctx, shards, ec, LoopbackOptions{Link: delayproxy.Link{Delay: 20 * time.Millisecond, UploadBytesPerSec: rate}})
		if err != nil {
			b.Fatal(err)
		}
		for _, w := range wires {
			res, err := lb.GenerateReq(ctx, session.GenerateRequest{Prompt: p, MaxTokens: 2, WireDType: w.dtype}, session.DefaultChunk)
			if err != nil {
				b.Fatal(err)
			}
			if want == nil {
				want = res.Tokens
			}
			ttft := float64(res.TTFT) / 1e6
			if mbit == 0 {
				uncapped[w.name] = ttft
				b.Logf("uplink uncapped %s: TTFT %.0f ms, tokens %v", w.name, ttft, res.Tokens)
				t.Add(Row{Name: "uplink uncapped, h=20ms, 2000-token TTFT, " + w.name + " wire", Value: ttft, Unit: "ms"})
				continue
			}
			// The floor: the seams' bytes over the uplink, or the
			// compute (the uncapped run), whichever is longer.
			bytesMs := float64(uplinkPrompt) * float64(spec.Embd) * w.bytes / float64(rate) * 1000
			floor := max(bytesMs, uncapped[w.name])
			b.Logf("uplink %d Mbit/s %s: TTFT %.0f ms (uncapped %.0f, bytes / uplink %.0f ms), tokens %v (first run: %v)", mbit, w.name, ttft, uncapped[w.name], bytesMs, res.Tokens, want)
			t.Add(Row{Name: fmt.Sprintf("uplink %d Mbit/s, h=20ms, 2000-token TTFT, %s wire", mbit, w.name), Value: ttft, Unit: "ms",
				Baseline: floor, BaseName: "max(uncapped, one seam's bytes / uplink)"})
		}
		lb.Close()
	}
}

// compression measures lossless compression (DEFLATE, Go's compress/flate)
// of the f32 hidden states the first shard sends for prompt p: as they are
// and byte-shuffled (the 4 bytes of each value split into 4 planes, which
// puts the exponents' low-entropy bytes together).
func compression(b *testing.B, t *Table, shard string, ec engine.Config, p []int32) {
	l, err := Load(context.Background(), shard, ec)
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	s, err := l.Shard.OpenSession(engine.SessionKey{}, engine.SessionParams{KVTokens: len(p) + 16})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	out, err := s.Forward(context.Background(), engine.Input{Tokens: p})
	if err != nil {
		b.Fatal(err)
	}
	raw := make([]byte, 4*len(out.Hidden))
	for i, v := range out.Hidden {
		binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(v))
	}
	shuffled := make([]byte, len(raw))
	n := len(out.Hidden)
	for i := range n {
		for k := range 4 {
			shuffled[k*n+i] = raw[4*i+k]
		}
	}
	for _, c := range []struct {
		name  string
		data  []byte
		level int
	}{{"flate level 1", raw, 1}, {"flate level 6", raw, 6}, {"byte-shuffled, flate level 1", shuffled, 1}, {"byte-shuffled, flate level 6", shuffled, 6}} {
		var buf bytes.Buffer
		began := time.Now()
		w, _ := flate.NewWriter(&buf, c.level)
		_, _ = w.Write(c.data)
		_ = w.Close()
		took := time.Since(began)
		mbps := float64(len(raw)) / took.Seconds() / 1e6
		b.Logf("compression %s: %d -> %d bytes in %v (%.0f MB/s)", c.name, len(raw), buf.Len(), took, mbps)
		t.Add(Row{Name: "f32 activations (2000 × 2048), " + c.name + ": size / raw", Value: float64(buf.Len()) / float64(len(raw)), Unit: "x"})
	}
}
