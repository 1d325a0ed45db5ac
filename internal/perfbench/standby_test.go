package perfbench

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/neuron-tai/meshp2p/internal/testbin"
)

// standby: a failover as users meet it (issue 40, item 4). Four `meshp2p
// start` processes at default flags serve the 154M model on plain
// loopback: a head 0-4, a middle 4-8 and a tail 8-12, and a second
// process for the covered range (the middle's, then the head's: the
// standby covers the hop with a replica). `generate --json` runs a long
// prompt with and without `--standby`, interleaved, and the covered
// range's process on the route (the one that is not the standby) is
// SIGKILLed once it has decoded killAfter tokens; a new one replaces it
// before the next run. The stall is generate's recovery_ms (the failure
// to the next token), against the run's own token time outside the
// stall. Without a standby the survivor that replaces it recomputes its
// layers' share of the prompt (issue 40, item 3); with one it has them
// already (a middle's standby is fed by the head, the head's by the
// origin). The cost of standing by comes from the processes' /metrics.
func standby(b *testing.B, t *Table, rounds int) {
	for _, covered := range strings.Split(cmp.Or(os.Getenv("MESHP2P_BENCH_STANDBY_COVERED"), "middle,head"), ",") {
		if covered != "middle" && covered != "head" {
			b.Fatalf("MESHP2P_BENCH_STANDBY_COVERED: %q is neither middle nor head", covered)
		}
		standbyCovering(b, t, rounds, covered)
	}
}

// standbyCovering is the standby section with the covered range's two
// processes serving covered's layers ("middle": 4-8, "head": 0-4).
func standbyCovering(b *testing.B, t *Table, rounds int, covered string) {
	ctx := context.Background()
	whole, _, err := Files(ctx, 3)
	if err != nil {
		b.Fatal(err)
	}
	bin := testbin.CLI(b)
	dir := b.TempDir()
	debug := os.Getenv("MESHP2P_BENCH_STANDBY_DEBUG") != "" // every process's debug log after each run (a directory: written there, one file each)
	net := []string{"--network", "benchstandby", "--listen", "/ip4/127.0.0.1/tcp/0", "--metrics", "127.0.0.1:0", "-v=" + strconv.FormatBool(debug)}
	n := 0
	start := func(layers, boot string) *proc {
		n++
		args := append([]string{"start", "--model", whole, "--layers", layers, "--data-dir", filepath.Join(dir, fmt.Sprint("n", n))}, net...)
		if boot != "" {
			args = append(args, "--bootstrap", boot)
		}
		return startProc(b, bin, args...)
	}
	// The tail is never killed: everyone bootstraps from it.
	tail := start("8-12", "")
	layers := map[string]string{"middle": "4-8", "head": "0-4"}[covered]
	mids := []*proc{start(layers, tail.addr), start(layers, tail.addr)}
	// head mirrors a middle's standby (its /metrics count the bytes and
	// drops); a head's standby is fed by the origin (generate: no
	// /metrics), so head stays nil then.
	var head *proc
	others := []*proc{tail} // the processes never killed (their logs, with MESHP2P_BENCH_STANDBY_DEBUG)
	if covered == "middle" {
		head = start("0-4", tail.addr)
		others = append(others, head)
	} else {
		others = append(others, start("4-8", tail.addr))
	}
	model := nodeModel(b, filepath.Join(dir, "n1"))
	words := strings.Fields("once upon a time there was a little model split across four processes on one machine and")
	var sb strings.Builder
	for i := range envInt("MESHP2P_BENCH_STANDBY_WORDS", 250) {
		sb.WriteString(words[i%len(words)] + " ")
	}
	const killAfter = 16
	maxTok := envInt("MESHP2P_BENCH_STANDBY_TOKENS", 48)
	client := []string{"generate", "--json", "-v=" + strconv.FormatBool(debug), "--max-tokens", strconv.Itoa(maxTok), "--speculative", "off",
		"--model", model, "--bootstrap", tail.addr, "--data-dir", filepath.Join(dir, "client"), "--network", "benchstandby", "--listen", "/ip4/127.0.0.1/tcp/0"}
	type run struct{ stall, token time.Duration }
	runs := make([][]run, 2)
	var prompt int
	var cost standbyCost
	for r := range rounds {
		for j := range 2 {
			withStandby := alternate(r, j, 2) == 1
			// A prompt of its own: no hop holds any of it from an earlier
			// run (prefix cache).
			text := fmt.Sprintf("run %d %v: %s", r, withStandby, sb.String())
			args := append(slices.Clone(client), "--prompt", text, "--standby="+strconv.FormatBool(withStandby))
			before := cost.read(b, head, mids)
			g, killed := generateKilling(b, bin, args, mids, others, killAfter)
			if len(g.Tokens) != maxTok {
				b.Fatalf("--standby=%v: %d tokens, want %d", withStandby, len(g.Tokens), maxTok)
			}

			if len(g.RecoveryMs) != 1 || g.Takeovers != b2i(withStandby) || (g.Standbys > 0) != withStandby {
				b.Fatalf("--standby=%v: stalls %v, standbys %d, takeovers %d, reroutes %d: want one re-route, taken over by a standby only with --standby",
					withStandby, g.RecoveryMs, g.Standbys, g.Takeovers, g.Reroutes)
			}
			if withStandby {
				c := cost.read(b, head, mids).minus(before)
				if c.dropped > 0 && head != nil {
					b.Logf("the head dropped the standby:\n%s", grepLines(head.logs.String(), "standby"))
					for _, m := range mids {
						b.Logf("middle's warnings:\n%s", grepLines(m.logs.String(), "level=WARN"))
					}
				}
				cost.add(c)
			}
			stall := time.Duration(g.RecoveryMs[0] * float64(time.Millisecond))
			// The run's token time outside the stall (ms_per_token spans
			// the tokens after the first, the stall included).
			tok := (time.Duration(g.MsPerToken*float64(len(g.Tokens)-1)*float64(time.Millisecond)) - stall) / time.Duration(max(1, len(g.Tokens)-2))
			runs[b2i(withStandby)] = append(runs[b2i(withStandby)], run{stall, tok})
			prompt = g.PromptTokens
			mids[killed] = start(layers, tail.addr) // a fresh one for the next run
		}
	}
	for i, name := range []string{"no standby (the spare recomputes its layers' share of the prompt)", "--standby (takes over, no prefill)"} {
		var stalls, toks []time.Duration
		var ratios []float64
		for _, x := range runs[i] {
			stalls, toks = append(stalls, x.stall), append(toks, x.token)
			ratios = append(ratios, float64(x.stall)/float64(x.token))
		}
		b.Logf("standby %s: stalls %v, token times %v", name, stalls, toks)
		t.Add(Row{Name: fmt.Sprintf("standby: %d-token prompt, %s SIGKILLed, stall, %s", prompt, covered, name), Value: medianMs(stalls), Unit: "ms"})
		goal := ""
		if i == 1 {
			goal = "≤ 3"
		}
		t.Add(Row{Name: "  stall / the run's token time", Value: median(ratios), Unit: "x", Goal: goal})
	}
	k := float64(max(1, len(runs[1])))
	t.Add(Row{Name: "  standby cost per generation: rows the standby computed", Value: cost.sumRows / k, Unit: "rows"})
	t.Add(Row{Name: "  standby cost per generation: its compute", Value: cost.sumCPU / k * 1000, Unit: "ms"})
	if covered == "middle" { // a head's standby gets token ids from the origin (generate: no /metrics)
		t.Add(Row{Name: "  standby cost per generation: bytes the head mirrored", Value: cost.bytes / k / (1 << 20), Unit: "MiB"})
		t.Add(Row{Name: "  standbys dropped (lagging)", Value: cost.dropped, Unit: ""})
	}
}

func b2i(v bool) int {
	if v {
		return 1
	}
	return 0
}

// nodeModel is the model fingerprint a node's node.json in dir names.
func nodeModel(b *testing.B, dir string) string {
	var info struct {
		Model string `json:"model"`
	}
	raw, err := os.ReadFile(filepath.Join(dir, "node.json"))
	if err != nil || json.Unmarshal(raw, &info) != nil || info.Model == "" {
		b.Fatalf("%s/node.json names no model: %v", dir, err)
	}
	return info.Model
}

// standbyGen is what the standby section reads from generate --json.
type standbyGen struct {
	genJSON
	Reroutes     int       `json:"reroutes"`
	RecoveryMs   []float64 `json:"recovery_ms"`
	Takeovers    int       `json:"takeovers"`
	Standbys     int       `json:"standbys"`
	PromptTokens int       `json:"prompt_tokens"`
}

// generateKilling runs generate (args) and SIGKILLs the middle on its
// route once that middle has decoded killAfter tokens; it returns the
// report and which middle it killed.
func generateKilling(b *testing.B, bin string, args []string, mids, others []*proc, killAfter int) (standbyGen, int) {
	rows := make([]float64, len(mids))
	sessions := make([]float64, len(mids))
	for i, m := range mids {
		rows[i] = scrape(b, m, `meshp2p_hop_rows_total{kind="decode"}`)
		sessions[i] = scrape(b, m, "meshp2p_standby_sessions_total")
	}
	cmd := exec.Command(bin, args...)
	var out, errOut lockedBuf
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	killed := -1
	for killed < 0 {
		select {
		case err := <-done:
			b.Fatalf("generate ended before a middle decoded %d tokens: %v\n%s%s", killAfter, err, out.String(), errOut.String())
		case <-time.After(20 * time.Millisecond):
		}
		for i, m := range mids {
			// The route's middle: decoding, and not the standby (whose
			// rows count as a standby's, not as decode rows).
			if scrape(b, m, "meshp2p_standby_sessions_total") > sessions[i] {
				continue
			}
			if scrape(b, m, `meshp2p_hop_rows_total{kind="decode"}`)-rows[i] >= float64(killAfter) {
				m.kill()
				killed = i
				break
			}
		}
	}
	if err := <-done; err != nil {
		b.Fatalf("generate: %v\n%s%s", err, out.String(), errOut.String())
	}
	var g standbyGen
	if err := json.Unmarshal([]byte(out.String()), &g); err != nil {
		b.Fatalf("generate --json: %v\n%s", err, out.String())
	}
	if d := os.Getenv("MESHP2P_BENCH_STANDBY_DEBUG"); d != "" {
		logs := map[string]string{"generate": errOut.String()}
		for i, m := range mids {
			logs[fmt.Sprint("covered", i)] = m.logs.String()
		}
		for i, m := range others {
			logs[fmt.Sprint("other", i)] = m.logs.String()
		}
		for name, l := range logs {
			if st, err := os.Stat(d); err == nil && st.IsDir() { // whole logs, one file each per run
				_ = os.WriteFile(filepath.Join(d, fmt.Sprintf("%d-%s.log", time.Now().UnixMilli(), name)), []byte(l), 0o644)
			} else {
				b.Logf("%s's log:\n%s", name, l)
			}
		}
	}
	return g, killed
}

// standbyCost is what standing by cost, from the processes' /metrics:
// per process, since the killed one's counters vanish with it (a
// difference of sums then lost the rows of a process that stood by in an
// earlier run and was killed in this one).
type standbyCost struct {
	rows, compute   map[*proc]float64
	bytes, dropped  float64
	sumRows, sumCPU float64 // add's totals
}

func (c standbyCost) read(b *testing.B, head *proc, mids []*proc) standbyCost {
	x := standbyCost{rows: map[*proc]float64{}, compute: map[*proc]float64{}}
	for _, m := range mids {
		if m.cmd.ProcessState == nil { // alive
			x.rows[m] = scrape(b, m, "meshp2p_standby_rows_total")
			x.compute[m] = scrape(b, m, "meshp2p_standby_compute_seconds_total")
		}
	}
	if head != nil {
		x.bytes = scrape(b, head, "meshp2p_standby_mirrored_bytes_total")
		x.dropped = scrape(b, head, "meshp2p_standby_dropped_total")
	}
	return x
}

// minus is what the processes alive in c did since o.
func (c standbyCost) minus(o standbyCost) standbyCost {
	d := standbyCost{bytes: c.bytes - o.bytes, dropped: c.dropped - o.dropped}
	for p, v := range c.rows {
		if v >= o.rows[p] { // counters only grow; less: it died (scrape read 0)
			d.sumRows += v - o.rows[p]
			d.sumCPU += c.compute[p] - o.compute[p]
		}
	}
	return d
}

func (c *standbyCost) add(o standbyCost) {
	c.sumRows, c.sumCPU, c.bytes, c.dropped = c.sumRows+o.sumRows, c.sumCPU+o.sumCPU, c.bytes+o.bytes, c.dropped+o.dropped
}

// scrape is the value of the sample named series (name and labels as
// /metrics prints them) on p's /metrics: 0 when absent or p is dead.
func scrape(b *testing.B, p *proc, series string) float64 {
	if p.cmd.ProcessState != nil {
		return 0 // killed
	}
	resp, err := http.Get("http://" + p.metrics + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				b.Fatalf("%s: %v", series, err)
			}
			return f
		}
	}
	return 0
}

// grepLines is s's lines that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
