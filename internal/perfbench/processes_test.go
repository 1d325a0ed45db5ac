package perfbench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/neuron-tai/meshp2p/internal/testbin"
)

// processes: what users run (issue 42, item 2). Three `meshp2p start`
// processes at default flags (threads: each process's share of the
// machine) serve the 154M model 0-4, 4-8, 8-12 on plain loopback (h = 0),
// and `meshp2p generate` runs through them, against `generate --local` at
// its default flags, interleaved; decode ms/token from each run's --json.
// The route runs with --speculative off and auto (the default). The
// breakdown is what --json reports: the hops' compute per token and the
// rest ("network_ms_per_token": encode, Noise, yamux, wake-ups, waits).
func processes(b *testing.B, t *Table, rounds, tokens int) {
	ctx := context.Background()
	whole, _, err := Files(ctx, 3)
	if err != nil {
		b.Fatal(err)
	}
	bin := testbin.CLI(b)
	dir := b.TempDir()
	net := []string{"--network", "benchproc", "--listen", "/ip4/127.0.0.1/tcp/0"}
	var boot string
	for i, layers := range []string{"0-4", "4-8", "8-12"} {
		args := append([]string{"start", "--model", whole, "--layers", layers, "--data-dir", filepath.Join(dir, fmt.Sprint("n", i))}, net...)
		if boot != "" {
			args = append(args, "--bootstrap", boot)
		}
		args = append(args, strings.Fields(os.Getenv("MESHP2P_BENCH_PROC_START_ARGS"))...)
		pr := startProc(b, bin, args...)
		if boot == "" {
			boot = pr.addr
		}
	}
	prompt := "Once upon a time there was a little model split across three processes on one machine"
	gen := func(extra ...string) genJSON {
		args := append([]string{"generate", "--json", "--prompt", prompt, "--max-tokens", fmt.Sprint(tokens)}, extra...)
		out, err := exec.Command(bin, args...).Output()
		if err != nil {
			b.Fatalf("meshp2p %v: %v\n%s", args, err, out)
		}
		var g genJSON
		if err := json.Unmarshal(out, &g); err != nil {
			b.Fatalf("meshp2p %v: %v\n%s", args, err, out)
		}
		return g
	}
	var info struct {
		Model string `json:"model"`
	}
	if raw, err := os.ReadFile(filepath.Join(dir, "n0", "node.json")); err != nil || json.Unmarshal(raw, &info) != nil || info.Model == "" {
		b.Fatalf("the first node's node.json names no model: %v", err)
	}
	swarm := append([]string{"--model", info.Model, "--bootstrap", boot, "--data-dir", filepath.Join(dir, "client")}, net...)
	variants := []struct {
		name string
		args []string
	}{
		{"local", []string{"--local", "--model", whole}},
		{"route, --speculative off", append([]string{"--speculative", "off"}, swarm...)},
		{"route, --speculative auto (default)", swarm},
	}
	ms := make([][]time.Duration, len(variants))
	var netMs, hopMs []float64
	var want []int32
	for r := range rounds {
		for j := range variants {
			i := alternate(r, j, len(variants))
			g := gen(variants[i].args...)
			if want == nil {
				want = g.Tokens
			} else if !slices.Equal(g.Tokens, want) {
				b.Fatalf("%s: tokens differ from the first run's", variants[i].name)
			}
			ms[i] = append(ms[i], time.Duration(g.MsPerToken*float64(time.Millisecond)))
			if i == 1 {
				netMs = append(netMs, g.NetworkMsPerToken)
				sum := 0.0
				for _, h := range g.Hops {
					sum += h.MeanUs / 1000
				}
				hopMs = append(hopMs, sum)
			}
		}
	}
	for i, v := range variants {
		b.Logf("processes %s: %v", v.name, ms[i])
	}
	t.Add(Row{Name: "processes: generate --local, default flags", Value: medianMs(ms[0]), Unit: "ms/token"})
	for i := 1; i < len(variants); i++ {
		t.Add(Row{Name: "processes: 3 start + generate, " + variants[i].name, Value: medianMs(ms[i]), Unit: "ms/token", Baseline: medianMs(ms[0]), BaseName: "generate --local"})
		// tok/s of the route over --local's: the inverse ratio of ms/token.
		t.Add(Row{Name: "  tok/s " + variants[i].name + " / --local, paired", Value: pairedRatio(ms[0], ms[i]), Unit: "x", Goal: "≥ 0.95"})
	}
	t.Add(Row{Name: "  route (off): Σ hops' compute per token", Value: median(hopMs), Unit: "ms"})
	t.Add(Row{Name: "  route (off): per token not in a hop (--json network_ms_per_token)", Value: median(netMs), Unit: "ms"})
}

// genJSON is what the processes section reads from generate --json.
type genJSON struct {
	Tokens            []int32 `json:"tokens"`
	MsPerToken        float64 `json:"ms_per_token"`
	NetworkMsPerToken float64 `json:"network_ms_per_token"`
	Hops              []struct {
		MeanUs float64 `json:"mean_compute_us"`
	} `json:"hops"`
}

// lockedBuf is a bytes.Buffer a process writes while the bench reads it.
type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// proc is a `meshp2p start` process the bench started: its first
// address, its metrics address ("" without --metrics) and its output.
type proc struct {
	cmd     *exec.Cmd
	addr    string
	metrics string
	out     *lockedBuf
	logs    *lockedBuf // stderr
}

// kill SIGKILLs the process (by PID) and reaps it.
func (p *proc) kill() {
	_ = p.cmd.Process.Kill()
	_ = p.cmd.Wait()
}

// startProc starts `meshp2p start` (args), stopped by its PID when the
// bench ends, once it prints ready.
func startProc(b *testing.B, bin string, args ...string) *proc {
	cmd := exec.Command(bin, args...)
	var out, errOut lockedBuf
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			_ = cmd.Process.Signal(os.Interrupt) // by PID
			done := make(chan struct{})
			go func() { _ = cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				_ = cmd.Process.Kill()
				<-done
			}
		})
	}
	b.Cleanup(stop)
	p := &proc{cmd: cmd, out: &out, logs: &errOut}
	for deadline := time.Now().Add(5 * time.Minute); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		s := out.String()
		if !strings.Contains(s, "\nready") && !strings.HasPrefix(s, "ready") {
			continue
		}
		for _, line := range strings.Split(s, "\n") {
			if a, ok := strings.CutPrefix(line, "address:"); ok && p.addr == "" {
				p.addr = strings.TrimSpace(a)
			}
			if m, ok := strings.CutPrefix(line, "metrics:"); ok {
				m = strings.TrimPrefix(strings.Fields(m)[0], "http://")
				p.metrics = strings.TrimSuffix(m, "/metrics")
			}
		}
		return p
	}
	b.Fatalf("meshp2p %v did not get ready:\n%s\n%s", args, out.String(), errOut.String())
	return nil
}
