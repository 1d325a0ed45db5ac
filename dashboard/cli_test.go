package dashboard_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/neuron-tai/meshp2p/internal/testbin"
)

// proc is one meshp2p process a test started (stopped by PID at cleanup).
type proc struct {
	cmd     *exec.Cmd
	logs    *lockedBuf
	id      string
	addr    string // first listen address, with /p2p/<id>
	metrics string // host:port of --metrics
	api     string // host:port of --api
	exited  chan struct{}
}

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

// startProc runs `bin args...` and waits for its "ready" line, reading the
// peer id, first address and metrics address it prints.
func startProc(t *testing.T, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(bin, args...), logs: &lockedBuf{}, exited: make(chan struct{})}
	p.cmd.Stderr = p.logs
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan struct{})
	var once sync.Once
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			p.logs.Write([]byte("stdout: " + line + "\n"))
			f := strings.Fields(line)
			switch {
			case strings.HasPrefix(line, "peer id:") && len(f) >= 3:
				p.id = f[2]
			case strings.HasPrefix(line, "address:") && p.addr == "" && len(f) >= 2:
				p.addr = f[1]
			case strings.HasPrefix(line, "metrics:") && len(f) >= 2:
				p.metrics = strings.TrimSuffix(strings.TrimPrefix(f[1], "http://"), "/metrics")
			case strings.HasPrefix(line, "api:") && len(f) >= 2:
				p.api = strings.TrimSuffix(strings.TrimPrefix(f[1], "http://"), "/v1")
			case strings.HasPrefix(line, "ready"):
				once.Do(func() { close(ready) })
			}
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	go func() { _ = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() { p.stop(t) })
	select {
	case <-ready:
	case <-p.exited:
		t.Fatalf("%v exited before ready:\n%s", args, p.logs.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("%v: not ready after 60 s:\n%s", args, p.logs.String())
	}
	return p
}

// stop sends SIGTERM (the process's own pid only) and waits, then kills.
func (p *proc) stop(t *testing.T) {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(15 * time.Second):
		t.Logf("pid %d did not stop on SIGTERM; killing it", p.cmd.Process.Pid)
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// kill ends the process at once (SIGKILL to its pid), like a crash.
func (p *proc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// run runs a short CLI command and returns its stdout.
func run(t *testing.T, bin string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if err != nil {
		err = fmt.Errorf("%v: %w\n%s", args, err, errb.String())
	}
	return out.String(), err
}

// scrape fetches and parses /metrics.
func scrape(t *testing.T, addr string) (map[string]*dto.MetricFamily, string) {
	t.Helper()
	body := get(t, "http://"+addr+"/metrics")
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams, body
}

func get(t *testing.T, url string) string {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	r, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	b, err := io.ReadAll(io.LimitReader(r.Body, 8<<20))
	if err != nil || r.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v", url, r.StatusCode, err)
	}
	return string(b)
}

// value is the sample of family name whose labels include want (nil:
// any); -1 when absent.
func value(fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	f := fams[name]
	if f == nil {
		return -1
	}
next:
	for _, m := range f.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if have[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue()
		case m.Gauge != nil:
			return m.GetGauge().GetValue()
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount())
		}
	}
	return -1
}

// waitValue polls name until it equals v (bounded), for counters that
// settle after a session's release.
func waitValue(t *testing.T, addr, name string, labels map[string]string, v float64) map[string]*dto.MetricFamily {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		fams, _ := scrape(t, addr)
		got := value(fams, name, labels)
		if got == v {
			return fams
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s%v on %s = %v, want %v", name, labels, addr, got, v)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func netArgs(network, dir string) []string {
	return []string{"--network", network, "--listen", "/ip4/127.0.0.1/tcp/0", "--data-dir", dir}
}

func cli(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the CLI (slow)")
	}
	return testbin.CLI(t)
}

func dataDir(t *testing.T, name string) string { return filepath.Join(t.TempDir(), name) }

func decodeJSON(t *testing.T, s string, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(s), v); err != nil {
		t.Fatalf("decode %q: %v", s, err)
	}
}
