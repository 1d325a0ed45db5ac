package perfbench

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/neuron-tai/meshp2p/engine"
	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/internal/delayproxy"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/session"
)

// scripted is a proposer of known acceptance: it proposes what the tail
// will choose (next, from the position and the token before it), made
// wrong at each position with probability 1-alpha by a hash of (seed,
// position), so proposing the same positions twice gives the same tokens.
type scripted struct {
	next  func(pos int, prev int32) int32
	wrong func(tok int32) int32
	alpha float64
	seed  uint64
	n     int
	last  int32
}

func (s *scripted) Append(toks ...int32) {
	if len(toks) > 0 {
		s.n += len(toks)
		s.last = toks[len(toks)-1]
	}
}

func (s *scripted) Propose(k int) ([]int32, int) {
	out := make([]int32, 0, k)
	prev := s.last
	for i := range k {
		pos := s.n + i
		t := s.next(pos, prev)
		if unitHash(s.seed, pos) >= s.alpha {
			t = s.wrong(t)
		}
		out = append(out, t)
		prev = t
	}
	return out, 1
}

func unitHash(seed uint64, pos int) float64 {
	h := fnv.New64a()
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:], seed)
	binary.LittleEndian.PutUint64(b[8:], uint64(pos))
	h.Write(b[:])
	return float64(h.Sum64()>>11) / float64(1<<53)
}

// curveAlphas are the acceptance rates of the curve.
var curveAlphas = []float64{0, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 1}

// curvePoint is one acceptance rate's measurement in virtual time.
type curvePoint struct {
	alpha, plain, spec float64 // ms per token
	accepted, proposed int
	k, w               int
	model              float64 // predicted speed-up, W = 1, best K
}

// modelGain is the analytical speed-up of K proposals per window at
// acceptance alpha with W = 1: E(K) = (1-α^(K+1))/(1-α) tokens per window
// of time T1 + K·row, against one token per T1.
func modelGain(alpha float64, k int, t1, row float64) float64 {
	e := float64(k + 1)
	if alpha < 1 {
		e = (1 - math.Pow(alpha, float64(k+1))) / (1 - alpha)
	}
	return e * t1 / (t1 + float64(k)*row)
}

// specCurve runs the 3-hop sleep ring (compute c per hop per window, +c/8
// per extra row; links of one-way delay h) in virtual time, plain and
// speculative with a scripted proposer at each acceptance rate.
func specCurve(t *testing.T, h time.Duration, n int) []curvePoint {
	var out []curvePoint
	c := 2 * time.Millisecond
	for _, alpha := range curveAlphas {
		synctest.Test(t, func(t *testing.T) {
			engines := sleepRing([3]time.Duration{c, c, c})
			for _, e := range engines {
				e.(*sleepEngine).perRow = c / 8
			}
			r, err := NewRingWith("sleep", engines, h, func(hc *session.HopConfig) {
				hc.Proposer = func(meshp2pb.SpecMode, int) (session.Proposer, string) {
					return &scripted{next: func(_ int, prev int32) int32 { return prev + 1 }, wrong: func(t int32) int32 { return t + 7 }, alpha: alpha, seed: 3}, "scripted"
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			gen := func(sp *meshp2pb.Speculation) *session.Result {
				res, err := r.Origin.Generate(context.Background(), session.GenerateRequest{Fingerprint: "sleep", NLayer: sleepNLayer, Prompt: []int32{3, 4, 5}, MaxTokens: n, Speculation: sp})
				if err != nil {
					t.Fatal(err)
				}
				for i, tok := range res.Tokens {
					if tok != int32(6+i) {
						t.Fatalf("token %d is %d, want %d", i, tok, 6+i)
					}
				}
				return res
			}
			plain := gen(nil)
			sp := gen(&meshp2pb.Speculation{Mode: meshp2pb.SpecMode_SPEC_MODE_AUTO})
			pt := PerToken(plain).Seconds()
			best := 1.0
			t1 := (3*c + 3*h).Seconds()
			for k := 1; k <= session.DefaultSpecDraft; k++ {
				best = max(best, modelGain(alpha, k, t1, 3*(c/8).Seconds()))
			}
			out = append(out, curvePoint{alpha: alpha, plain: pt * 1000, spec: PerToken(sp).Seconds() * 1000, accepted: sp.Spec.Accepted,
				proposed: sp.Spec.Proposed, k: sp.Spec.K, w: sp.Spec.W, model: best})
		})
	}
	return out
}

// TestSpeculationCurve: in virtual time the scripted proposer's tokens are
// exact at every acceptance rate; with nothing accepted the adaptive
// session falls back to plain decoding (never slower than 0.97× of it),
// and with everything accepted it commits several tokens per pass.
func TestSpeculationCurve(t *testing.T) {
	pts := specCurve(t, 20*time.Millisecond, 96)
	for _, p := range pts {
		t.Logf("α=%.2f plain %.2f ms/token, speculative %.2f ms/token (%.2fx; model W=1 %.2fx), accepted %d/%d, K %d W %d",
			p.alpha, p.plain, p.spec, p.plain/p.spec, p.model, p.accepted, p.proposed, p.k, p.w)
	}
	if p := pts[0]; p.plain/p.spec < 0.97 {
		t.Errorf("α=0: speculative %.2f ms/token against plain %.2f", p.spec, p.plain)
	}
	if p := pts[len(pts)-1]; p.plain/p.spec < 2 {
		t.Errorf("α=1: speculative %.2f ms/token against plain %.2f", p.spec, p.plain)
	}
}

// TestSpecCurveChild prints the curve for BenchmarkPerf's speculation
// section (virtual time needs a *testing.T).
func TestSpecCurveChild(t *testing.T) {
	if os.Getenv("MESHP2P_SPEC_CHILD") == "" {
		t.Skip("child of BenchmarkPerf's speculation section")
	}
	for _, p := range specCurve(t, 20*time.Millisecond, 128) {
		fmt.Printf("SPECCURVE %g %g %g %d %d %d %d %g\n", p.alpha, p.plain, p.spec, p.accepted, p.proposed, p.k, p.w, p.model)
	}
}

// parseCurve reads the child's SPECCURVE lines.
func parseCurve(out []byte) []curvePoint {
	var pts []curvePoint
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 9 || f[0] != "SPECCURVE" {
			continue
		}
		num := func(i int) float64 { v, _ := strconv.ParseFloat(f[i], 64); return v }
		pts = append(pts, curvePoint{alpha: num(1), plain: num(2), spec: num(3), accepted: int(num(4)), proposed: int(num(5)), k: int(num(6)), w: int(num(7)), model: num(8)})
	}
	return pts
}

// specWork is one workload of the speculation section.
type specWork struct {
	name   string
	prompt []int32
	n      int
	goal   string
	// script: a scripted proposer of this acceptance (0: the n-gram one).
	alpha float64
	// sampling (nil: greedy) and the speculation mode (0: auto).
	sampling *meshp2pb.SamplingParams
	mode     meshp2pb.SpecMode
}

// speculation: the curve (virtual time, child process), then real nodes
// behind delay proxies (internal/delayproxy) with plain and speculative
// decoding interleaved on the same route, tokens checked identical.
func speculation(b *testing.B, t *Table, threads, rounds int) {
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	curve := parseCurve(child(b, exe, "TestSpecCurveChild", "MESHP2P_SPEC_CHILD=1"))
	if os.Getenv("MESHP2P_BENCH_SPEC_ONLY") != "" {
		curve = nil
	}
	for _, p := range curve {
		goal := ""
		if p.alpha >= 0.8 {
			goal = ">= 2.5"
		} else if p.alpha == 0 {
			goal = ">= 0.97"
		}
		t.Add(Row{Name: fmt.Sprintf("spec curve α=%.2f, 3 hops h=20ms (virtual)", p.alpha), Value: 1000 / p.spec, Unit: "tok/s", Baseline: 1000 / p.plain, BaseName: "plain, same ring", Goal: goal})
		t.Add(Row{Name: fmt.Sprintf("  accepted %d/%d, K %d W %d; model W=1 %.2fx", p.accepted, p.proposed, p.k, p.w, p.model), Value: p.plain / p.spec, Unit: "x"})
	}
	ctx := context.Background()
	small, err := SmallFiles(ctx, 3)
	if err != nil {
		b.Fatal(err)
	}
	smallWhole, err := SmallModel()
	if err != nil {
		b.Fatal(err)
	}
	sl := loadAll(b, []string{smallWhole}, engineCfg(threads))[0]
	story, err := sl.Model.Tokenize("Once upon a time", true, false)
	if err != nil {
		b.Fatal(err)
	}
	// The reference continuation (plain, in-process) scripts the proposer
	// of known acceptance and makes the copy-heavy prompt: a passage the
	// model wrote, then the story's opening again.
	ref, err := engine.RunChain(ctx, []*engine.Shard{sl.Shard}, story, engine.ChainOptions{Steps: 399})
	if err != nil {
		b.Fatal(err)
	}
	copyPrompt := append(append(slices.Clone(story), ref.Tokens[:160]...), story[1:]...)
	nVocab := int32(sl.Model.Info().NVocab)
	n300 := envInt("MESHP2P_BENCH_SPEC_TOKENS", 300)
	links := []struct {
		name string
		link delayproxy.Link
		work []specWork
	}{
		// Plain loopback (no proxy): the hops' compute and the stack's
		// own costs are all a trip costs, and speculation must not lose.
		{"h=0", delayproxy.Link{}, []specWork{
			{name: fmt.Sprintf("260K %d-token continuation", n300), prompt: story, n: n300, goal: ">= 0.97"},
			{name: fmt.Sprintf("260K copy-heavy %d", n300), prompt: copyPrompt, n: n300, goal: ">= 0.97"},
			{name: fmt.Sprintf("260K t=0.8, %d", n300), prompt: story, n: n300, goal: ">= 0.97", sampling: &meshp2pb.SamplingParams{Temperature: 0.8, Seed: 5}},
		}},
		{"h=5ms", delayproxy.Ideal(5 * time.Millisecond), []specWork{{name: "260K first 128", prompt: story, n: 128}}},
		{"h=20ms", delayproxy.Ideal(20 * time.Millisecond), []specWork{
			{name: fmt.Sprintf("260K %d-token continuation", n300), prompt: story, n: n300, goal: ">= 1.3"},
			{name: "260K first 128", prompt: story, n: 128},
			{name: "260K copy-heavy 128", prompt: copyPrompt, n: 128},
			{name: "260K scripted α=0.8, 128", prompt: story, n: 128, alpha: 0.8, goal: ">= 2.5"},
			{name: "260K scripted α=0.95, 128", prompt: story, n: 128, alpha: 0.95},
			{name: "260K self-draft (first 4 layers), 128", prompt: story, n: 128, mode: meshp2pb.SpecMode_SPEC_MODE_DRAFT},
		}},
		{"h=50ms", delayproxy.Ideal(50 * time.Millisecond), []specWork{{name: "260K first 128", prompt: story, n: 128}}},
		{"broadband h=20ms", delayproxy.Broadband(20 * time.Millisecond), []specWork{
			{name: "260K first 128", prompt: story, n: 128},
			{name: "260K scripted α=0.8, 128", prompt: story, n: 128, alpha: 0.8},
		}},
	}
	only := os.Getenv("MESHP2P_BENCH_SPEC_ONLY") // a substring of the rows to run
	for _, l := range links {
		for _, w := range l.work {
			if only != "" && !strings.Contains(w.name+", "+l.name, only) {
				continue
			}
			var script session.ProposerFactory
			if w.alpha > 0 {
				pl := len(w.prompt)
				script = func(meshp2pb.SpecMode, int) (session.Proposer, string) {
					return &scripted{alpha: w.alpha, seed: 11, wrong: func(t int32) int32 { return (t + 1) % nVocab },
						next: func(pos int, prev int32) int32 {
							if i := pos - pl; i >= 0 && i < len(ref.Tokens) {
								return ref.Tokens[i]
							}
							return prev
						}}, "scripted"
				}
			}
			opt := LoopbackOptions{Link: l.link, Hop: func(hc *session.HopConfig) { hc.Proposer = script }}
			if w.mode == meshp2pb.SpecMode_SPEC_MODE_DRAFT {
				dir := b.TempDir()
				res, err := gguf.Truncate(ctx, smallWhole, 4, filepath.Join(dir, gguf.TruncateName(smallWhole, 4)))
				if err != nil {
					b.Fatal(err)
				}
				opt.HeadDraft = res.Path
			}
			lb, err := StartWith(ctx, small, engineCfg(threads), opt)
			if err != nil {
				b.Fatal(err)
			}
			specRow(b, t, lb, l.name, w, rounds)
			lb.Close()
		}
	}
	// Random weights (the 154M model, F16, and at h = 0 its Q8_0 and
	// Q4_K_M quantizations): compute-bound where the link is fast; at
	// h = 5 ms the link and the compute are of a size.
	for _, m := range []struct{ typ, link string }{{"f16", "h=0"}, {"q8_0", "h=0"}, {"q4_k_m", "h=0"}, {"f16", "h=5ms"}, {"f16", "h=20ms"}} {
		link := delayproxy.Link{}
		switch m.link {
		case "h=5ms":
			link = delayproxy.Ideal(5 * time.Millisecond)
		case "h=20ms":
			link = delayproxy.Ideal(20 * time.Millisecond)
		}
		name := "154M random weights"
		if m.typ != "f16" {
			name = "154M " + strings.ToUpper(m.typ) + " random weights"
		}
		if only != "" && !strings.Contains(name+", "+m.link, only) {
			continue
		}
		shards, err := specShards(ctx, m.typ)
		if err != nil {
			b.Fatal(err)
		}
		lb, err := StartWith(ctx, shards, engineCfg(threads), LoopbackOptions{Link: link})
		if err != nil {
			b.Fatal(err)
		}
		specRow(b, t, lb, m.link, specWork{name: name + " 32", prompt: prompt(16), n: 32, goal: ">= 0.97"}, max(rounds, 5))
		// Sampled at temperature 1 from random weights: next to no token
		// repeats its context, so proposals must stay off.
		specRow(b, t, lb, m.link, specWork{name: name + " t=1.0, 32", prompt: prompt(16), n: 32, goal: ">= 0.97",
			sampling: &meshp2pb.SamplingParams{Temperature: 1, Seed: 17}}, max(rounds, 5))
		lb.Close()
	}
}

// specShards is the 154M model of type typ (f16, q8_0, q4_k_m) split in
// 3 even shards, made once in the bench cache.
func specShards(ctx context.Context, typ string) ([]string, error) {
	if typ == "f16" {
		_, shards, err := Files(ctx, 3)
		return shards, err
	}
	whole, err := invModel(ctx, typ)
	if err != nil {
		return nil, err
	}
	dir := strings.TrimSuffix(whole, ".gguf") + ".split3"
	var shards []string
	missing := false
	for _, r := range gguf.EvenSplit(Spec().Layers, 3) {
		p := filepath.Join(dir, gguf.ShardName(whole, r))
		if f, err := gguf.Open(p); err == nil {
			f.Close()
		} else {
			missing = true
		}
		shards = append(shards, p)
	}
	if missing {
		if _, err := gguf.Split(ctx, whole, gguf.EvenSplit(Spec().Layers, 3), dir, nil); err != nil {
			return nil, err
		}
	}
	return shards, nil
}

// specRow measures w on lb, plain and auto interleaved, and adds its rows.
func specRow(b *testing.B, t *Table, lb *Loopback, link string, w specWork, rounds int) {
	ctx := context.Background()
	var plain, spec []time.Duration
	var last *session.Result
	var want []int32
	for r := range rounds {
		for j := range 2 {
			var sp *meshp2pb.Speculation
			if alternate(r, j, 2) == 1 {
				sp = &meshp2pb.Speculation{Mode: cmp.Or(w.mode, meshp2pb.SpecMode_SPEC_MODE_AUTO)}
			}
			res, err := lb.GenerateReq(ctx, session.GenerateRequest{Prompt: w.prompt, MaxTokens: w.n, Speculation: sp, Sampling: w.sampling}, session.DefaultChunk)
			if err != nil {
				b.Fatal(err)
			}
			if want == nil {
				want = res.Tokens
			} else if !slices.Equal(res.Tokens, want) {
				b.Fatalf("%s %s: tokens differ between runs (speculation %v)", link, w.name, sp != nil)
			}
			if sp == nil {
				plain = append(plain, PerToken(res))
			} else {
				spec, last = append(spec, PerToken(res)), res
			}
		}
	}
	st := lb.ProxyStats()
	b.Logf("spec %s %s: plain %v, speculative %v, stalls %d", link, w.name, plain, spec, st.Stalls())
	t.Add(Row{Name: fmt.Sprintf("spec %s, %s", w.name, link), Value: 1000 / medianMs(spec), Unit: "tok/s", Baseline: 1000 / medianMs(plain), BaseName: "plain, same route", Goal: w.goal})
	var hop float64
	for _, h := range last.HopStats {
		hop += h.MeanUs / 1000 / float64(len(last.HopStats))
	}
	sp := last.Spec
	t.Add(Row{Name: fmt.Sprintf("  %s: accepted %d/%d (%.0f%%), %d windows, K %d W %d", sp.Proposer, sp.Accepted, sp.Proposed, 100*sp.AcceptanceRate(), sp.Windows, sp.K, sp.W),
		Value: hop, Unit: "ms/hop/win"})
	t.Add(Row{Name: "  speculative / plain, paired", Value: pairedRatio(plain, spec), Unit: "x", Goal: w.goal})
}
