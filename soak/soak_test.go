//go:build linux

// Package soak holds the churn soak: a loopback swarm of 6 shard nodes (3
// layer ranges, 2 replicas each) serves 8 clients generating greedily and
// continuously while one random node is SIGKILLed and restarted every
// 20–40 s. Everything goes through the real CLI, started exactly as users
// start it. Every generation must finish and equal the whole model run
// in-process (--local); each node process's RSS, thread count and
// go_goroutines (scraped from its --metrics) are reported after warm-up and
// before its kill or teardown, and growth beyond 3x fails the soak. Every
// generation is audited (--audit-rate 1: one hop replayed from the model
// file) and half the clients speculate: every node is honest, so a failed
// audit (a false accusation) fails the soak.
//
//	MESHP2P_SOAK_DURATION=5m go test -run TestChurnSoak ./soak   (make test, after the other packages)
//	MESHP2P_SOAK_DURATION=25m go test -run TestChurnSoak -timeout 35m -v -count=1 ./soak   (make soak)
//
// Environment: MESHP2P_SOAK_DURATION (required; unset: skipped, so plain
// `go test ./...` does not run it next to the netns tests), MESHP2P_SOAK_SEED (default:
// the clock; printed, so a run can be repeated), MESHP2P_SOAK_REPORT (also
// write the report as JSON to this file), MESHP2P_BIN (a prebuilt CLI).
package soak

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/neuron-tai/meshp2p/internal/testbin"
)

const (
	modelFile   = "../models/stories260K.gguf"
	modelName   = "stories260K"
	nClients    = 8
	genTimeout  = 150 * time.Second // one generation; past it the generation is lost
	readyWithin = 90 * time.Second  // a node's start until "ready;"
)

// The clients' workload: four prompts, token counts between 16 and 48.
var combos = []combo{
	{"Once upon a time", 48},
	{"Once upon a time", 16},
	{"The little dog", 32},
	{"The little dog", 24},
	{"Lily and Tom went to the park", 40},
	{"Lily and Tom went to the park", 16},
	{"One day, a bird", 20},
	{"One day, a bird", 48},
}

type combo struct {
	Prompt string `json:"prompt"`
	N      int    `json:"max_tokens"`
}

// The ranges of stories260K's 5 layers; node i serves ranges[i%3].
var ranges = [][2]int{{0, 2}, {2, 4}, {4, 5}}

type genJSON struct {
	Text     string   `json:"text"`
	Tokens   []int32  `json:"tokens"`
	Reroutes int      `json:"reroutes"`
	Stop     string   `json:"stop"`
	TotalMs  float64  `json:"total_ms"`
	Failures []string `json:"failures"`
	Route    []struct {
		Peer       string `json:"peer"`
		Start, End int
	} `json:"route"`
	Audit *struct {
		Hop     int    `json:"hop"`
		Peer    string `json:"peer"`
		Outcome string `json:"outcome"`
		Reason  string `json:"reason"`
	} `json:"audit"`
}

// Report is what the soak prints and, with MESHP2P_SOAK_REPORT, writes.
type Report struct {
	Seed          uint64   `json:"seed"`
	Duration      string   `json:"duration"`
	WallS         float64  `json:"wall_s"` // churn phase, first client start to last client end
	Completed     int      `json:"generations_completed"`
	Lost          int      `json:"generations_lost"`
	Mismatches    int      `json:"mismatches"`
	Reroutes      int      `json:"reroutes"`             // sum of every generation's reroutes
	Rerouted      int      `json:"rerouted_generations"` // generations with reroutes > 0
	TokensChecked int      `json:"tokens_checked"`
	MaxGenS       float64  `json:"max_generation_s"`
	Kills         []*Kill  `json:"kills"`
	Processes     []*Proc  `json:"processes"`
	LostDetails   []*Gen   `json:"lost_details,omitempty"`
	Mismatched    []*Gen   `json:"mismatch_details,omitempty"`
	Notes         []string `json:"notes,omitempty"`
	// Audits counts the clients' audits by outcome (every client audits
	// every generation: --audit-rate 1); every node is honest, so a
	// failed audit is a false accusation.
	Audits           map[string]int `json:"audits"`
	FalseAccusations []*Gen         `json:"false_accusations,omitempty"`
	Speculative      int            `json:"speculative_generations"`
}

// Kill is one SIGKILL and the restart that followed.
type Kill struct {
	AtS        float64 `json:"at_s"` // since the churn phase started
	Node       string  `json:"node"`
	Layers     string  `json:"layers"`
	PID        int     `json:"pid"`
	RestartAtS float64 `json:"restart_at_s"`
	NewPID     int     `json:"new_pid"`
	Port       int     `json:"port"`
	SamePort   bool    `json:"same_port"`
	Error      string  `json:"error,omitempty"`
	// Generations running at the kill (or starting up to its restart) that
	// re-routed, and how many of them equal --local.
	Rerouted      int `json:"rerouted_generations"`
	ReroutedExact int `json:"rerouted_exact"`
}

// Proc is one node process (an incarnation: a restart is a new one).
type Proc struct {
	Node          string  `json:"node"`
	Layers        string  `json:"layers"`
	PID           int     `json:"pid"`
	StartedS      float64 `json:"started_s"` // since the churn phase started (negative: before it)
	EndedS        float64 `json:"ended_s"`
	EndedBy       string  `json:"ended_by"` // "kill" or "teardown"
	RSSStartKB    int     `json:"rss_start_kb"`
	ThreadsStart  int     `json:"threads_start"`
	RSSEndKB      int     `json:"rss_end_kb"`
	ThreadsEnd    int     `json:"threads_end"`
	GoroutinesEnd int     `json:"goroutines_end"` // from the SIGQUIT dump at teardown; -1 if not known
	// go_goroutines scraped from the node's --metrics after warm-up, and
	// last just before its kill or teardown (0: not scraped).
	GoroutinesStart int `json:"goroutines_start"`
	GoroutinesLast  int `json:"goroutines_last"`
	metricsAddr     string
	Crash           string `json:"crash,omitempty"` // exit status and stderr tail of a node that exited without our signal
	signalled       bool
	measuredAt      time.Time
	started         time.Time
	ended           time.Time
	cmd             *exec.Cmd
	done            chan struct{}
	errPath         string
}

// Gen is one generation's record.
type Gen struct {
	Client      int      `json:"client"`
	Prompt      string   `json:"prompt"`
	N           int      `json:"max_tokens"`
	StartS      float64  `json:"start_s"`
	EndS        float64  `json:"end_s"`
	Exit        string   `json:"exit,omitempty"`
	StderrTail  string   `json:"stderr_tail,omitempty"`
	Reroutes    int      `json:"reroutes"`
	Failures    []string `json:"failures,omitempty"`
	Route       []string `json:"route,omitempty"`
	FirstDiff   int      `json:"first_diff,omitempty"`
	Got         []int32  `json:"got,omitempty"`
	Want        []int32  `json:"want,omitempty"`
	KillsDuring []string `json:"kills_during,omitempty"`
	Speculative bool     `json:"speculative,omitempty"`
	Audit       string   `json:"audit,omitempty"` // outcome
	AuditReason string   `json:"audit_reason,omitempty"`
}

type shardNode struct {
	name       string
	start, end int
	dir        string
	port       int
	peer       string
	addr       string
	cur        *Proc // nil while dead
}

func (n *shardNode) layers() string { return fmt.Sprintf("%d-%d", n.start, n.end) }

// live: started and not exited (caller holds s.mu).
func (n *shardNode) live() bool { return n.cur != nil && n.cur.EndedBy == "" }

type soak struct {
	t       *testing.T
	bin     string
	model   string
	network string
	work    string
	t0      time.Time // churn phase start (set before nodes start, reset after warm-up)

	mu    sync.Mutex
	nodes []*shardNode
	procs []*Proc
	kills []*Kill
	gens  []*Gen
}

func TestChurnSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("churn soak: skipped in -short (make test runs 5 minutes; make soak runs 25)")
	}
	model, err := filepath.Abs(modelFile)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(model); err != nil {
		t.Skipf("churn soak: %s absent (the committed trained model): %v", modelFile, err)
	}
	dur := 3 * time.Minute
	v := os.Getenv("MESHP2P_SOAK_DURATION")
	if v == "" {
		// Not under plain `go test ./...`: 6 nodes and 8 clients on a
		// 2-core machine next to the netns NAT tests starve both. `make
		// test` runs the 3-minute version after the other packages, `make
		// soak` the 25-minute one.
		t.Skip("churn soak: set MESHP2P_SOAK_DURATION (make test runs 5m after the other tests; make soak runs 25m)")
	}
	if v != "" {
		if dur, err = time.ParseDuration(v); err != nil || dur <= 0 {
			t.Fatalf("MESHP2P_SOAK_DURATION=%q: want a positive Go duration like 3m", v)
		}
	}
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("MESHP2P_SOAK_SEED"); v != "" {
		if seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("MESHP2P_SOAK_SEED=%q: %v", v, err)
		}
	}
	// The whole test must end before go test's deadline: churn, then at most
	// one generation timeout of drain, then teardown.
	if dl, ok := t.Deadline(); ok {
		if need := dur + genTimeout + 3*time.Minute; time.Until(dl) < need {
			t.Fatalf("soak of %v needs about %v, go test -timeout leaves %v", dur, need, time.Until(dl).Round(time.Second))
		}
	}
	t.Logf("churn soak: duration %v, seed %d (repeat with MESHP2P_SOAK_SEED=%d)", dur, seed, seed)

	s := &soak{t: t, bin: testbin.CLI(t), model: model, network: fmt.Sprintf("soak-%d", os.Getpid()), work: t.TempDir(), t0: time.Now()}
	t.Cleanup(s.killAll) // registered after TempDir: runs before the directory goes

	refs := s.references()

	// 6 nodes: n0..n5 serve ranges[i%3]; n0 and n1 are everyone's bootstrap
	// peers, so any single node can die. A restarted node keeps its data
	// dir (identity) and port, so these addresses stay valid.
	for i := 0; i < 6; i++ {
		r := ranges[i%3]
		n := &shardNode{name: fmt.Sprintf("n%d", i), start: r[0], end: r[1], dir: filepath.Join(s.work, fmt.Sprintf("n%d", i))}
		s.nodes = append(s.nodes, n)
		if err := s.startNode(n, 0); err != nil {
			t.Fatalf("starting %s (layers %s): %v", n.name, n.layers(), err)
		}
		t.Logf("%s serves layers %s as %s, pid %d, %s", n.name, n.layers(), short(n.peer), n.cur.cmd.Process.Pid, n.addr)
	}

	// Warm-up: one generation through the swarm must work before churn.
	w := s.generate(context.Background(), -1, combos[0], refs[combos[0]])
	if w.Exit != "" {
		t.Fatalf("warm-up generation failed (%s); the swarm does not work without churn:\n%s", w.Exit, w.StderrTail)
	}
	if w.Got != nil {
		t.Errorf("warm-up generation (no churn) differs from --local at token %d: got %v want %v", w.FirstDiff, w.Got, w.Want)
	}
	s.mu.Lock()
	s.gens = nil // the warm-up is not part of the soak's counts
	s.t0 = time.Now()
	for _, n := range s.nodes {
		s.measureStart(n.cur)
	}
	s.mu.Unlock()

	// Churn: 8 clients and the killer until the deadline.
	deadline := s.t0.Add(dur)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var wg sync.WaitGroup
	maxGens := int(dur/(50*time.Millisecond)) + 10 // a bound on each client's loop, far above what a process per generation allows
	for c := 0; c < nClients; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(c)+1))
			for k := 0; k < maxGens && time.Now().Before(deadline) && ctx.Err() == nil; k++ {
				cb := combos[rng.IntN(len(combos))]
				s.generate(ctx, c, cb, refs[cb])
			}
		}(c)
	}
	killerDone := make(chan struct{})
	go func() {
		defer close(killerDone)
		s.killer(ctx, rand.New(rand.NewPCG(seed, 0)), deadline)
	}()
	<-killerDone
	wg.Wait()
	wall := time.Since(s.t0)

	// Teardown: RSS and threads at the end, then SIGQUIT for the goroutine dump.
	s.teardown()

	rep := s.report(seed, dur, wall)
	s.logReport(rep)
	if p := os.Getenv("MESHP2P_SOAK_REPORT"); p != "" {
		b, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile(p, append(b, '\n'), 0o644); err != nil {
			t.Errorf("writing report: %v", err)
		} else {
			t.Logf("report written to %s", p)
		}
	}

	if rep.Completed == 0 {
		t.Errorf("no generation completed")
	}
	if rep.Lost != 0 {
		t.Errorf("%d generations lost (want 0); see lost_details above", rep.Lost)
	}
	if rep.Mismatches != 0 {
		t.Errorf("%d generations differ from --local (want 0); see mismatch_details above", rep.Mismatches)
	}
	if n := len(rep.FalseAccusations); n != 0 {
		t.Errorf("%d audits convicted an honest hop (want 0)", n)
	}
	if rep.Audits["passed"] == 0 {
		t.Errorf("no audit passed: the soak checked no hop")
	}
	if dur >= time.Minute {
		if len(rep.Kills) == 0 {
			t.Errorf("no node was killed: the soak proved nothing")
		}
		if rep.Rerouted == 0 {
			t.Errorf("no generation re-routed: the soak proved nothing")
		}
	}
	for _, p := range rep.Processes {
		if p.Crash != "" {
			t.Errorf("%s (layers %s) pid %d exited without being signalled: %s", p.Node, p.Layers, p.PID, p.Crash)
		}
		// Only gross growth fails (timing-like thresholds make flaky tests);
		// the numbers are in the report either way.
		if lived := p.ended.Sub(p.measuredAt); p.RSSStartKB > 0 && p.RSSEndKB > 3*p.RSSStartKB && lived >= time.Minute {
			t.Errorf("%s pid %d: RSS grew from %d kB to %d kB in %v (> 3x)", p.Node, p.PID, p.RSSStartKB, p.RSSEndKB, lived.Round(time.Second))
		}
		if lived := p.ended.Sub(p.measuredAt); p.GoroutinesStart > 0 && p.GoroutinesLast > 3*p.GoroutinesStart && lived >= time.Minute {
			t.Errorf("%s pid %d: goroutines grew from %d to %d in %v (> 3x: a leak)", p.Node, p.PID, p.GoroutinesStart, p.GoroutinesLast, lived.Round(time.Second))
		}
	}
}

// references runs every combo on the whole model in-process (--local).
func (s *soak) references() map[combo][]int32 {
	refs := map[combo][]int32{}
	t0 := time.Now()
	for _, c := range combos {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		cmd := exec.CommandContext(ctx, s.bin, "generate", "--local", "--model", s.model, "--prompt", c.Prompt,
			"--max-tokens", strconv.Itoa(c.N), "--json")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		cancel()
		if err != nil {
			s.t.Fatalf("reference %q/%d: %v\n%s", c.Prompt, c.N, err, tail(stderr.String()))
		}
		var g genJSON
		if err := json.Unmarshal(out, &g); err != nil || len(g.Tokens) == 0 {
			s.t.Fatalf("reference %q/%d: bad JSON (%v): %s", c.Prompt, c.N, err, out)
		}
		refs[c] = g.Tokens
	}
	s.t.Logf("references: %d --local runs in %v", len(combos), time.Since(t0).Round(time.Millisecond))
	return refs
}

// bootstrap returns the addresses of n0 and n1 except the node's own.
func (s *soak) bootstrap(except *shardNode) []string {
	var out []string
	for _, n := range s.nodes[:min(2, len(s.nodes))] {
		if n != except && n.addr != "" {
			out = append(out, n.addr)
		}
	}
	return out
}

// startNode starts n on port (0: any) and waits for "ready;". Called
// without s.mu for the initial nodes and by the killer, which is the only
// writer of node state during churn.
func (s *soak) startNode(n *shardNode, port int) error {
	if err := os.MkdirAll(n.dir, 0o755); err != nil {
		return err
	}
	os.Remove(filepath.Join(n.dir, "node.json"))
	s.mu.Lock()
	boot := s.bootstrap(n)
	k := 0
	for _, p := range s.procs {
		if p.Node == n.name {
			k++
		}
	}
	s.mu.Unlock()
	args := []string{"start", "--model", s.model, "--layers", n.layers(), "--network", s.network,
		"--listen", fmt.Sprintf("/ip4/127.0.0.1/tcp/%d", port), "--port-mapping=false",
		"--data-dir", n.dir, "--threads", "1", "--metrics", "127.0.0.1:0"}
	if len(boot) > 0 {
		args = append(args, "--bootstrap", strings.Join(boot, ","))
	}
	base := filepath.Join(s.work, fmt.Sprintf("%s.%d", n.name, k))
	stdout, err := os.Create(base + ".out")
	if err != nil {
		return err
	}
	stderr, err := os.Create(base + ".err")
	if err != nil {
		stdout.Close()
		return err
	}
	cmd := exec.Command(s.bin, args...)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	// If the test binary dies (go test -timeout), its nodes die with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		stdout.Close()
		stderr.Close()
		return err
	}
	p := &Proc{Node: n.name, Layers: n.layers(), PID: cmd.Process.Pid, cmd: cmd, done: make(chan struct{}),
		errPath: base + ".err", GoroutinesEnd: -1}
	go func() {
		err := cmd.Wait()
		stdout.Close()
		stderr.Close()
		s.mu.Lock()
		if !p.signalled { // a node that died on its own: a finding, not churn
			b, _ := os.ReadFile(p.errPath)
			p.ended, p.EndedBy, p.Crash = time.Now(), "crashed", fmt.Sprintf("%v\n%s", err, tail(string(b)))
			s.t.Logf("t=%5.1fs NODE EXITED ON ITS OWN: %s (layers %s, pid %d): %s", time.Since(s.t0).Seconds(), p.Node, p.Layers, p.PID, indent(p.Crash))
		}
		s.mu.Unlock()
		close(p.done)
	}()
	s.mu.Lock()
	p.started = time.Now()
	s.procs = append(s.procs, p)
	s.mu.Unlock()

	ready := time.Now().Add(readyWithin)
	for {
		b, _ := os.ReadFile(base + ".out")
		if bytes.Contains(b, []byte("\nready;")) || bytes.HasPrefix(b, []byte("ready;")) {
			break
		}
		select {
		case <-p.done:
			s.mu.Lock()
			p.EndedBy, p.Crash = "failed start", "" // reported by the caller
			s.mu.Unlock()
			e, _ := os.ReadFile(p.errPath)
			return fmt.Errorf("exited before ready (%v):\n%s", cmd.ProcessState, tail(string(e)))
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(ready) {
			s.stop(p, syscall.SIGKILL)
			e, _ := os.ReadFile(p.errPath)
			return fmt.Errorf("not ready within %v:\n%s", readyWithin, tail(string(e)))
		}
	}
	if m := metricsLine.FindSubmatch(mustRead(base + ".out")); m != nil {
		s.mu.Lock()
		p.metricsAddr = string(m[1])
		s.mu.Unlock()
	}
	var info struct {
		PeerID string   `json:"peer_id"`
		Addrs  []string `json:"addrs"`
	}
	b, err := os.ReadFile(filepath.Join(n.dir, "node.json"))
	if err == nil {
		err = json.Unmarshal(b, &info)
	}
	if err != nil {
		s.stop(p, syscall.SIGKILL)
		return fmt.Errorf("node.json: %v", err)
	}
	addr := ""
	for _, a := range info.Addrs {
		if strings.HasPrefix(a, "/ip4/127.0.0.1/tcp/") {
			addr = a
			break
		}
	}
	m := regexp.MustCompile(`^/ip4/127\.0\.0\.1/tcp/(\d+)/p2p/`).FindStringSubmatch(addr)
	if m == nil {
		s.stop(p, syscall.SIGKILL)
		return fmt.Errorf("no loopback TCP address in node.json: %v", info.Addrs)
	}
	s.mu.Lock()
	n.port, _ = strconv.Atoi(m[1])
	n.peer, n.addr, n.cur = info.PeerID, addr, p
	s.mu.Unlock()
	return nil
}

// stop signals p and waits up to 15 s for it to exit.
func (s *soak) stop(p *Proc, sig syscall.Signal) bool {
	s.mu.Lock()
	p.signalled = true
	s.mu.Unlock()
	p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
		return true
	case <-time.After(15 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
		return false
	}
}

// killAll is the cleanup: every node process still running is killed by
// its PID (generations are ended by their context).
func (s *soak) killAll() {
	s.mu.Lock()
	procs := slices.Clone(s.procs)
	s.mu.Unlock()
	for _, p := range procs {
		select {
		case <-p.done:
		default:
			s.stop(p, syscall.SIGKILL)
		}
	}
}

// procStatus reads VmRSS (kB) and Threads from /proc/<pid>/status.
func procStatus(pid int) (rssKB, threads int) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		switch f[0] {
		case "VmRSS:":
			rssKB, _ = strconv.Atoi(f[1])
		case "Threads:":
			threads, _ = strconv.Atoi(f[1])
		}
	}
	return rssKB, threads
}

// measureStart records p's RSS and threads now (caller holds s.mu).
func (s *soak) measureStart(p *Proc) {
	p.RSSStartKB, p.ThreadsStart = procStatus(p.PID)
	p.GoroutinesStart = scrapeGoroutines(p.metricsAddr)
	p.measuredAt = time.Now()
}

// killer SIGKILLs one random node every 20–40 s, only one whose layer range
// has another live replica, and restarts it 2–5 s later with the same data
// dir and port.
func (s *soak) killer(ctx context.Context, rng *rand.Rand, deadline time.Time) {
	sleep := func(d time.Duration) bool {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(d):
			return true
		}
	}
	for i := 0; i < 1000; i++ {
		wait := 20*time.Second + time.Duration(rng.Int64N(int64(20*time.Second)))
		if time.Now().Add(wait).After(deadline) || !sleep(wait) {
			return
		}
		s.mu.Lock()
		var cand []*shardNode
		for _, n := range s.nodes {
			if !n.live() {
				continue
			}
			for _, o := range s.nodes {
				if o != n && o.live() && o.start == n.start && o.end == n.end {
					cand = append(cand, n)
					break
				}
			}
		}
		if len(cand) == 0 {
			s.mu.Unlock()
			s.t.Logf("killer: no node has a live replica; skipping a kill")
			continue
		}
		n := cand[rng.IntN(len(cand))]
		p := n.cur
		p.RSSEndKB, p.ThreadsEnd = procStatus(p.PID)
		p.GoroutinesLast = scrapeGoroutines(p.metricsAddr)
		k := &Kill{AtS: time.Since(s.t0).Seconds(), Node: n.name, Layers: n.layers(), PID: p.PID}
		s.kills = append(s.kills, k)
		n.cur = nil
		s.mu.Unlock()

		s.stop(p, syscall.SIGKILL)
		s.mu.Lock()
		p.ended, p.EndedBy = time.Now(), "kill"
		s.mu.Unlock()
		s.t.Logf("t=%5.1fs killer: SIGKILL %s (layers %s, pid %d, RSS %d kB, %d threads)", k.AtS, n.name, n.layers(), p.PID, p.RSSEndKB, p.ThreadsEnd)

		sleep(2*time.Second + time.Duration(rng.Int64N(int64(3*time.Second))))
		// Same port if we can (the bootstrap lists stay valid); a port still
		// held elsewhere falls back to a new one.
		port := n.port
		var err error
		for try := 0; try < 3; try++ {
			if err = s.startNode(n, port); err == nil {
				break
			}
			s.t.Logf("killer: restarting %s on port %d: %v", n.name, port, err)
			if try == 1 {
				port = 0
			}
		}
		s.mu.Lock()
		k.RestartAtS = time.Since(s.t0).Seconds()
		if err != nil {
			k.Error = err.Error()
			s.mu.Unlock()
			s.t.Errorf("killer: %s could not be restarted: %v", n.name, err)
			continue
		}
		k.NewPID, k.Port, k.SamePort = n.cur.PID, n.port, n.port == port && port != 0
		np := n.cur
		s.mu.Unlock()
		s.t.Logf("t=%5.1fs killer: restarted %s as pid %d on port %d", k.RestartAtS, n.name, k.NewPID, k.Port)
		// Its start numbers after a few seconds of joining.
		if !sleep(5 * time.Second) {
			return
		}
		s.mu.Lock()
		if n.cur == np {
			s.measureStart(np)
		}
		s.mu.Unlock()
	}
}

// generate runs one generation through the swarm and records it.
func (s *soak) generate(ctx context.Context, client int, c combo, want []int32) *Gen {
	s.mu.Lock()
	boot := s.bootstrap(nil)
	// Odd clients speculate (n-gram windows); every client audits every
	// generation, replaying one hop with the model file.
	g := &Gen{Client: client, Prompt: c.Prompt, N: c.N, StartS: time.Since(s.t0).Seconds(), Speculative: client%2 == 1}
	s.mu.Unlock()
	dir := filepath.Join(s.work, fmt.Sprintf("client%d", client))
	gctx, cancel := context.WithTimeout(ctx, genTimeout)
	defer cancel()
	spec := "auto"
	if g.Speculative {
		spec = "ngram"
	}
	cmd := exec.CommandContext(gctx, s.bin, "generate", "--network", s.network, "--bootstrap", strings.Join(boot, ","),
		"--listen", "/ip4/127.0.0.1/tcp/0", "--port-mapping=false", "--data-dir", dir,
		"--model", modelName, "--prompt", c.Prompt, "--max-tokens", strconv.Itoa(c.N), "--json", "--wait", "30s",
		"--speculative", spec, "--audit-rate", "1", "--audit-model", s.model)
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var res genJSON
	if err == nil {
		if jerr := json.Unmarshal(stdout.Bytes(), &res); jerr != nil {
			err = fmt.Errorf("exit 0 but no JSON: %v", jerr)
		}
	}
	if err != nil && gctx.Err() == context.DeadlineExceeded {
		err = fmt.Errorf("timed out after %v (%v)", genTimeout, err)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	g.EndS = time.Since(s.t0).Seconds()
	for _, k := range s.kills {
		if k.AtS >= g.StartS-5 && k.AtS <= g.EndS {
			g.KillsDuring = append(g.KillsDuring, fmt.Sprintf("%s(%s) pid %d at %.1fs", k.Node, k.Layers, k.PID, k.AtS))
		}
	}
	if err != nil {
		if ctx.Err() != nil && !errors.Is(gctx.Err(), context.DeadlineExceeded) {
			return g // cancelled by the test's cleanup: not the product's fault
		}
		g.Exit = err.Error()
		g.StderrTail = tail(stderr.String())
		s.gens = append(s.gens, g)
		if client >= 0 {
			s.t.Logf("t=%5.1fs LOST generation (client %d, %q/%d, %.1fs): %s; kills during: %v\n%s",
				g.EndS, client, c.Prompt, c.N, g.EndS-g.StartS, g.Exit, g.KillsDuring, indent(g.StderrTail))
		}
		return g
	}
	g.Reroutes, g.Failures = res.Reroutes, res.Failures
	if a := res.Audit; a != nil {
		g.Audit, g.AuditReason = a.Outcome, a.Reason
		if a.Outcome == "inconclusive" && client >= 0 {
			s.t.Logf("t=%5.1fs audit inconclusive (client %d): hop %d %s: %s; kills during %v", g.EndS, client, a.Hop, s.nameOf(a.Peer), a.Reason, g.KillsDuring)
		}
		if a.Outcome == "failed" && client >= 0 {
			s.t.Logf("t=%5.1fs FALSE ACCUSATION (client %d): hop %d %s: %s", g.EndS, client, a.Hop, s.nameOf(a.Peer), a.Reason)
		}
	}
	for _, h := range res.Route {
		g.Route = append(g.Route, fmt.Sprintf("%d-%d@%s", h.Start, h.End, s.nameOf(h.Peer)))
	}
	if !slices.Equal(res.Tokens, want) {
		g.FirstDiff = firstDiff(res.Tokens, want)
		g.Got, g.Want = res.Tokens, want
		if client >= 0 {
			s.t.Logf("t=%5.1fs MISMATCH (client %d, %q/%d): first differing token %d, reroutes %d, route %v, kills during %v",
				g.EndS, client, c.Prompt, c.N, g.FirstDiff, g.Reroutes, g.Route, g.KillsDuring)
		}
	}
	s.gens = append(s.gens, g)
	return g
}

// nameOf maps a peer id to its node name (caller holds s.mu).
func (s *soak) nameOf(peer string) string {
	for _, n := range s.nodes {
		if n.peer == peer {
			return n.name
		}
	}
	return short(peer)
}

// A goroutine's header in the runtime's crash dump, e.g. "goroutine 7 gp=0x… m=nil [select]:"
// (goroutine 0, the idle g0, is not one).
var goroutineLine = regexp.MustCompile(`(?m)^goroutine [1-9][0-9]* .*\[`)

// teardown records every live node's RSS and threads, then ends it with
// SIGQUIT: the Go runtime's dump of all goroutines is the only goroutine
// count the CLI exposes (it has no pprof or debug endpoint).
func (s *soak) teardown() {
	s.mu.Lock()
	var live []*Proc
	for _, n := range s.nodes {
		if p := n.cur; n.live() {
			p.RSSEndKB, p.ThreadsEnd = procStatus(p.PID)
			p.GoroutinesLast = scrapeGoroutines(p.metricsAddr)
			live = append(live, p)
		}
	}
	s.mu.Unlock()
	for _, p := range live {
		s.stop(p, syscall.SIGQUIT)
		b, _ := os.ReadFile(p.errPath)
		s.mu.Lock()
		p.ended, p.EndedBy = time.Now(), "teardown"
		if n := len(goroutineLine.FindAll(b, -1)); n > 0 {
			p.GoroutinesEnd = n
		}
		s.mu.Unlock()
	}
}

func (s *soak) report(seed uint64, dur, wall time.Duration) *Report {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := &Report{Seed: seed, Duration: dur.String(), WallS: wall.Seconds(), Kills: s.kills, Processes: s.procs,
		Notes: []string{"goroutine counts come from the SIGQUIT dump at teardown only (runtime goroutines included): " +
			"the CLI exposes no goroutine count while running (no pprof/debug endpoint), so there is no start count; " +
			"a node restarted shortly before teardown gives a fresh process's count for comparison"}}
	for _, p := range s.procs {
		p.StartedS = p.started.Sub(s.t0).Seconds()
		if !p.ended.IsZero() {
			p.EndedS = p.ended.Sub(s.t0).Seconds()
		}
	}
	for _, k := range s.kills {
		k.Rerouted, k.ReroutedExact = 0, 0
		for _, g := range s.gens {
			if g.Exit == "" && g.Reroutes > 0 && g.StartS <= max(k.RestartAtS, k.AtS) && g.EndS >= k.AtS {
				k.Rerouted++
				if g.Got == nil {
					k.ReroutedExact++
				}
			}
		}
	}
	for _, g := range s.gens {
		switch {
		case g.Exit != "":
			r.Lost++
			r.LostDetails = append(r.LostDetails, g)
			continue
		case g.Got != nil:
			r.Mismatches++
			r.Mismatched = append(r.Mismatched, g)
		}
		r.Completed++
		if r.Audits == nil {
			r.Audits = map[string]int{}
		}
		if g.Audit != "" {
			r.Audits[g.Audit]++
		}
		if g.Audit == "failed" {
			r.FalseAccusations = append(r.FalseAccusations, g)
		}
		if g.Speculative {
			r.Speculative++
		}
		r.TokensChecked += g.N
		r.Reroutes += g.Reroutes
		if g.Reroutes > 0 {
			r.Rerouted++
		}
		r.MaxGenS = max(r.MaxGenS, g.EndS-g.StartS)
	}
	return r
}

func (s *soak) logReport(r *Report) {
	t := s.t
	t.Logf("=== churn soak report (seed %d, duration %s, churn wall time %.0f s)", r.Seed, r.Duration, r.WallS)
	t.Logf("generations: %d completed, %d lost, %d differ from --local; %d re-routes in %d generations; slowest %.1f s",
		r.Completed, r.Lost, r.Mismatches, r.Reroutes, r.Rerouted, r.MaxGenS)
	t.Logf("audits (every generation, one hop replayed): %v; %d false accusations; %d generations speculated (ngram)", r.Audits, len(r.FalseAccusations), r.Speculative)
	t.Logf("kills: %d", len(r.Kills))
	for _, k := range r.Kills {
		t.Logf("  t=%6.1fs %s (%s) pid %d -> pid %d at t=%.1fs port %d (same: %v); %d generations re-routed, %d of them equal --local %s",
			k.AtS, k.Node, k.Layers, k.PID, k.NewPID, k.RestartAtS, k.Port, k.SamePort, k.Rerouted, k.ReroutedExact, k.Error)
	}
	t.Logf("node processes (RSS kB, threads and go_goroutines: after warm-up -> before kill/teardown; goroutines in the teardown dump):")
	for _, p := range r.Processes {
		g := "-"
		if p.GoroutinesEnd >= 0 {
			g = strconv.Itoa(p.GoroutinesEnd)
		}
		t.Logf("  %s (%s) pid %-7d t=%6.1f..%6.1fs %-8s RSS %6d -> %6d kB  threads %3d -> %3d  go_goroutines %3d -> %3d  dump %s",
			p.Node, p.Layers, p.PID, p.StartedS, p.EndedS, p.EndedBy, p.RSSStartKB, p.RSSEndKB, p.ThreadsStart, p.ThreadsEnd, p.GoroutinesStart, p.GoroutinesLast, g)
	}
	for _, g := range r.LostDetails {
		t.Logf("lost: client %d %q/%d t=%.1f..%.1fs: %s; kills during %v\n%s", g.Client, g.Prompt, g.N, g.StartS, g.EndS, g.Exit, g.KillsDuring, indent(g.StderrTail))
	}
	for _, g := range r.Mismatched {
		t.Logf("mismatch: client %d %q/%d t=%.1f..%.1fs at token %d, reroutes %d, route %v, kills during %v\n    got  %v\n    want %v",
			g.Client, g.Prompt, g.N, g.StartS, g.EndS, g.FirstDiff, g.Reroutes, g.Route, g.KillsDuring, g.Got, g.Want)
	}
	for _, n := range r.Notes {
		t.Logf("note: %s", n)
	}
}

func firstDiff(a, b []int32) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

func short(p string) string {
	if len(p) > 8 {
		return "…" + p[len(p)-8:]
	}
	return p
}

// tail returns the last lines (at most 6 KiB: a lost generation's every
// re-route warning) of s.
func tail(s string) string {
	s = strings.TrimRight(s, "\n")
	if len(s) > 6<<10 {
		s = s[len(s)-6<<10:]
		if i := strings.IndexByte(s, '\n'); i >= 0 {
			s = s[i+1:]
		}
	}
	return s
}

func indent(s string) string {
	if s == "" {
		return ""
	}
	return "    " + strings.ReplaceAll(s, "\n", "\n    ")
}

// metricsLine is what `start --metrics 127.0.0.1:0` prints once it listens.
var metricsLine = regexp.MustCompile(`(?m)^metrics: +http://(127\.0\.0\.1:[0-9]+)/metrics`)

func mustRead(path string) []byte {
	b, _ := os.ReadFile(path)
	return b
}

// goroutinesGauge is the Go collector's gauge in the Prometheus text format.
var goroutinesGauge = regexp.MustCompile(`(?m)^go_goroutines ([0-9]+)$`)

// scrapeGoroutines reads go_goroutines from a node's /metrics (0 if the
// node has no metrics address or does not answer within 2 s).
func scrapeGoroutines(addr string) int {
	if addr == "" {
		return 0
	}
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return 0
	}
	m := goroutinesGauge.FindSubmatch(b)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(string(m[1]))
	return n
}
