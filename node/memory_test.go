package node

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/neuron-tai/meshp2p/engine"
	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/placement"
)

// shardRSS is what loading and running one shard did to a fresh
// process's memory (VmRSS and VmHWM from /proc/self/status, in bytes).
type shardRSS struct {
	Before, After, Peak int64
	// Phases: resident memory after each step (load, context, calibration,
	// a full batch, decodes).
	Phases map[string]int64
}

// measureShardRSS loads the shard file at path with ec in a child process
// (this test binary, TestShardRSSChild) so that nothing else this process
// did counts, runs what a node does with it (load without mmap, as
// `start` does by default; calibration) and then a full batch of ec.NBatch
// rows and a few decodes, and reports its memory.
func measureShardRSS(t *testing.T, path string, ec engine.Config) shardRSS {
	t.Helper()
	cfg, _ := json.Marshal(ec)
	cmd := exec.Command(os.Args[0], "-test.run=^TestShardRSSChild$", "-test.v")
	cmd.Env = append(os.Environ(), "MESHP2P_RSS_CHILD="+path, "MESHP2P_RSS_CONFIG="+string(cfg))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if j, ok := strings.CutPrefix(strings.TrimSpace(l), "RSS "); ok {
			var r shardRSS
			if err := json.Unmarshal([]byte(j), &r); err != nil {
				t.Fatal(err)
			}
			return r
		}
	}
	t.Fatalf("child printed no RSS line:\n%s", out)
	return shardRSS{}
}

// TestShardRSSChild is measureShardRSS's child (skipped otherwise).
func TestShardRSSChild(t *testing.T) {
	path := os.Getenv("MESHP2P_RSS_CHILD")
	if path == "" {
		t.Skip("the child of measureShardRSS")
	}
	var ec engine.Config
	if err := json.Unmarshal([]byte(os.Getenv("MESHP2P_RSS_CONFIG")), &ec); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	r := shardRSS{Before: procStatus(t, "VmRSS"), Phases: map[string]int64{}}
	m, err := engine.LoadModel(ctx, path, engine.LoadOptions{NoMmap: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	r.Phases["load"] = procStatus(t, "VmRSS")
	sh, err := engine.NewShard(ctx, m, ec)
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Close()
	r.Phases["context"] = procStatus(t, "VmRSS")
	if _, err := sh.MeasureDecode(ctx, calibrationRows); err != nil {
		t.Fatal(err)
	}
	r.Phases["calibrated"] = procStatus(t, "VmRSS")
	runShardPeak(t, sh, r.Phases)
	r.After, r.Peak = procStatus(t, "VmRSS"), procStatus(t, "VmHWM")
	j, _ := json.Marshal(r)
	t.Logf("RSS %s", j)
	os.Stdout.WriteString("RSS " + string(j) + "\n")
}

// runShardPeak drives a loaded shard to the most memory the estimate
// allows for (placement.Sizing.Need), as a busy node can: a full batch
// of ec.NBatch rows, every row an output (the head always asks for them;
// a tail verifying a full batch of speculative rows, as here); sessions filling the context, prefixes kept in the prefix
// cache, and one more batch that does not fit, so that the engine
// compacts its cache through a copy of the live sessions' and the cached
// prefixes' cells. Each step's resident memory goes into phases.
func runShardPeak(t *testing.T, sh *engine.Shard, phases map[string]int64) {
	ctx := context.Background()
	in, ec := sh.Info(), sh.Config()
	rows, perSess := ec.NBatch, ec.NCtx/ec.MaxSessions
	forward := func(x *engine.Session, n int, all bool) {
		t.Helper()
		for n > 0 {
			k := min(n, rows)
			pos := x.NextPos()
			fin := engine.Input{Pos: pos, Sample: in.IsTail()}
			if in.IsTail() && all { // every row's logits: a verification
				fin.Sample, fin.Verify, fin.Draft = false, true, make([]int32, k-1)
			}
			if in.IsHead() {
				for i := range k {
					fin.Tokens = append(fin.Tokens, int32(1+(pos+i)*7919%max(1, in.NVocab-1)))
				}
			} else {
				fin.Hidden = make([]float32, k*in.NEmbd)
				for i := range fin.Hidden {
					fin.Hidden[i] = float32(math.Sin(float64(i+pos))) * 0.1
				}
			}
			if _, err := x.Forward(ctx, fin); err != nil {
				t.Fatal(err)
			}
			n -= k
		}
	}
	open := func(id int, kv int) *engine.Session {
		t.Helper()
		x, err := sh.OpenSession(engine.SessionKey{ID: [16]byte{byte(id), 0xee}}, engine.SessionParams{KVTokens: kv})
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	var live []*engine.Session
	for i := range ec.MaxSessions {
		x := open(i, perSess)
		forward(x, min(perSess, rows), i == 0)
		if i == 0 {
			phases["batch"] = procStatus(t, "VmRSS")
		}
		forward(x, perSess-min(perSess, rows), false)
		live = append(live, x)
	}
	phases["full"] = procStatus(t, "VmRSS")
	if ec.PrefixCacheCells == 0 {
		return
	}
	// Keep half the sessions' cells as cached prefixes (as many as the
	// prefix cache holds), end one more session without keeping it, and
	// refill: the last session's batch finds no room above the cells in
	// use and the cache is compacted.
	kept := min(ec.MaxSessions/2, ec.PrefixCacheCells/perSess)
	for i, x := range live[:kept] {
		x.Keep(engine.Prefix{Block: perSess, Hashes: [][16]byte{{byte(i + 1)}}})
		x.Close()
	}
	live[kept].Close()
	for i := range kept {
		forward(open(100+i, perSess), perSess-1, false)
	}
	before := sh.Capacity().Compactions
	forward(open(200, perSess), perSess, false)
	if sh.Capacity().Compactions == before {
		t.Logf("no compaction")
	}
	phases["compacted"] = procStatus(t, "VmRSS")
}

// procStatus is a /proc/self/status field in bytes.
func procStatus(t *testing.T, key string) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skip("no /proc/self/status")
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == key+":" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	t.Skipf("no %s in /proc/self/status", key)
	return 0
}

// checkShardsRSS splits model into ranges, measures each shard in a child
// process with ec and returns, per shard, the estimate and what resident
// memory reached above the child's start (its peak).
func checkShardsRSS(t *testing.T, model string, ranges []gguf.Range, ec engine.Config) (est, grew []int64) {
	t.Helper()
	sz, err := ModelSizing(model, ec)
	if err != nil {
		t.Fatal(err)
	}
	res, err := gguf.Split(context.Background(), model, ranges, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range ranges {
		m := measureShardRSS(t, res[i].Path, ec)
		e := sz.Need(placement.Range{Start: r.Start, End: r.End})
		var w int64
		for l := r.Start; l < r.End; l++ {
			w += sz.LayerBytes[l]
		}
		if r.Start == 0 {
			w += sz.HeadBytes
		}
		if r.End == sz.NLayer {
			w += sz.TailBytes
		}
		mib := func(b int64) string { return strconv.FormatFloat(float64(b)/(1<<20), 'f', 1, 64) }
		kv := (sz.KVBytesPerLayer + sz.KVScratchBytesPerLayer) * int64(r.Len())
		fixed := sz.FixedBytes
		if r.End == sz.NLayer {
			fixed += sz.TailFixedBytes
		}
		t.Logf("%d-%d: estimate %s MiB (weights %s, KV %s, compute and overhead %s); RSS %s → %s MiB, peak %s: grew %s MiB (peak %s, %.3f of the estimate); phases %v",
			r.Start, r.End, mib(e), mib(w), mib(kv), mib(fixed), mib(m.Before), mib(m.After), mib(m.Peak), mib(m.After-m.Before), mib(m.Peak-m.Before),
			float64(m.Peak-m.Before)/float64(e), phasesMiB(m))
		est, grew = append(est, e), append(grew, m.Peak-m.Before)
	}
	return est, grew
}

func phasesMiB(m shardRSS) string {
	var b strings.Builder
	for _, k := range []string{"load", "context", "calibrated", "batch", "full", "compacted"} {
		fmt.Fprintf(&b, "%s +%.1f ", k, float64(m.Phases[k]-m.Before)/(1<<20))
	}
	return b.String()
}

// TestMemoryAtRealSize measures the shards of MESHP2P_RSS_MODEL (a
// model of a real geometry; skipped without it), split in
// MESHP2P_RSS_SPLIT ways, at the node's default engine settings.
func TestMemoryAtRealSize(t *testing.T) {
	model := os.Getenv("MESHP2P_RSS_MODEL")
	if model == "" {
		t.Skip("MESHP2P_RSS_MODEL not set")
	}
	info, err := gguf.Inspect(context.Background(), model, false)
	if err != nil {
		t.Fatal(err)
	}
	k, _ := strconv.Atoi(os.Getenv("MESHP2P_RSS_SPLIT"))
	k = max(k, 1)
	var ranges []gguf.Range
	for i := range k {
		ranges = append(ranges, gguf.Range{Start: i * info.NLayer / k, End: (i + 1) * info.NLayer / k})
	}
	ec := DefaultEngine()
	ec.Threads = 2
	checkShardsRSS(t, model, ranges, ec)
}
