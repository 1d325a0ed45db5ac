package placement

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"
)

func TestSizingNeedAndWindows(t *testing.T) {
	g := Geometry{NLayer: 4, NEmbd: 8, NHead: 2, NFF: 16, NVocab: 100, KVWidth: 8}
	ts := []Tensor{{"token_embd.weight", 1000}, {"output_norm.weight", 10}, {"output.weight", 2000},
		{"blk.0.attn_q.weight", 100}, {"blk.0.ffn_up.weight", 50}, {"blk.1.attn_q.weight", 150}, {"blk.2.x", 150}, {"blk.3.x", 150}}
	e := EngineShape{NCtx: 10, NBatch: 2, KVElemBytes: 2}
	sz, err := FromTensors(g, ts, e)
	if err != nil {
		t.Fatal(err)
	}
	fixed, tail := ComputeEstimate(g, e)
	kv := int64(10 * 8 * 2)
	cases := []struct {
		r             Range
		weights, rest int64
	}{
		{Range{1, 3}, 300, 2 * kv},
		{Range{0, 1}, 150 + 1000, kv + tail}, // a head holds logits too
		{Range{3, 4}, 150 + 2010, kv + tail},
		{Range{0, 4}, 600 + 1000 + 2010, 4*kv + tail},
	}
	for _, c := range cases {
		// Loading weights leaves 1/DefaultLoadSlackDiv of them more resident.
		if got, want := sz.Need(c.r), fixed+c.weights+c.weights/DefaultLoadSlackDiv+c.rest; got != want {
			t.Errorf("Need(%s) = %d, want %d", c.r, got, want)
		}
	}
	// An architecture without a tied fallback: the head and the tail
	// carry the output matrix too.
	g.OutputRequired = true
	if o, _ := FromTensors(g, ts, e); o.HeadBytes != 3000 || o.TailBytes != 4010 {
		t.Errorf("output required: head %d B, tail %d B; want 3000, 4010", o.HeadBytes, o.TailBytes)
	}
	g.OutputRequired = false
	// The batch-invariant engine's compaction copies up to the whole
	// cache once: KV counts twice.
	e.Compacts = true
	if c, _ := FromTensors(g, ts, e); c.Need(Range{1, 3}) != sz.Need(Range{1, 3})+2*kv {
		t.Errorf("with compaction Need(1-3) = %d, want %d", c.Need(Range{1, 3}), sz.Need(Range{1, 3})+2*kv)
	}
	// An M-RoPE shard merges that copy into a second one (engine
	// kvmerge.go): KV counts three times.
	e.MergedRestore = true
	if c, _ := FromTensors(g, ts, e); c.Need(Range{1, 3}) != sz.Need(Range{1, 3})+4*kv {
		t.Errorf("with a merged restore Need(1-3) = %d, want %d", c.Need(Range{1, 3}), sz.Need(Range{1, 3})+4*kv)
	}
	e.Compacts, e.MergedRestore = false, false
	if got := sz.MaxWindow(1, fixed+300+300/DefaultLoadSlackDiv+2*kv); got != 2 {
		t.Errorf("MaxWindow = %d, want 2", got)
	}
	// A tied output: the tail holds a copy of the embeddings.
	tied, _ := FromTensors(g, ts[:2], e)
	if tied.TailBytes != 1010 || tied.HeadBytes != 1000 {
		t.Errorf("tied: head %d tail %d", tied.HeadBytes, tied.TailBytes)
	}
	if _, err := FromTensors(g, []Tensor{{"blk.9.x", 1}}, e); err == nil {
		t.Error("a tensor of layer 9 in a 4-layer model was accepted")
	}
}

func TestChooseGapsFirstThenWeakest(t *testing.T) {
	sz := uniformSizing(12)
	budget := sz.FixedBytes + 4*100 + 60 // 4 layers, also at the tail
	rng := rand.New(rand.NewPCG(1, 1))
	cases := []struct {
		name    string
		servers []Server
		want    []Range // acceptable choices
	}{
		{"fills the gap", []Server{{Peer: "a", Range: Range{0, 4}}, {Peer: "b", Range: Range{8, 12}}}, []Range{{4, 8}}},
		{"weakest layers", []Server{{Peer: "a", Range: Range{0, 6}, MsPerLayer: 1}, {Peer: "b", Range: Range{6, 12}, MsPerLayer: 1},
			{Peer: "c", Range: Range{0, 6}, MsPerLayer: 1}}, []Range{{6, 10}, {7, 11}, {8, 12}}},
		{"relayed counts half", []Server{{Peer: "a", Range: Range{0, 6}, MsPerLayer: 1, Relayed: true}, {Peer: "b", Range: Range{6, 12}, MsPerLayer: 1},
			{Peer: "c", Range: Range{0, 6}, MsPerLayer: 1, Relayed: true}, {Peer: "d", Range: Range{6, 12}, MsPerLayer: 2}}, []Range{{0, 4}, {1, 5}, {2, 6}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for range 20 {
				ch, ok := Choose(View{NLayer: 12, Servers: c.servers}, sz, budget, 1, nil, rng)
				if !ok {
					t.Fatal("no window fits")
				}
				found := false
				for _, w := range c.want {
					found = found || w == ch.Range
				}
				if !found {
					t.Fatalf("chose %s, want one of %v", ch.Range, c.want)
				}
			}
		})
	}
	if _, ok := Choose(View{NLayer: 12}, sz, sz.FixedBytes, 1, nil, rng); ok {
		t.Error("a budget with room for no layer chose a window")
	}
}

// TestRebalanceRules: a gap is filled at once; a throughput move waits for
// two checks in a row and the cooldown; a move that would uncover a layer
// is never made.
func TestRebalanceRules(t *testing.T) {
	sz := uniformSizing(12)
	budget := sz.FixedBytes + 4*100 + 60
	rng := rand.New(rand.NewPCG(2, 2))

	// Gap: "me" on 0-4 is a replica (a also serves 0-4); 8-12 is a gap.
	b := NewRebalancer(sz, budget, rng)
	gap := View{NLayer: 12, Servers: []Server{{Peer: "a", Range: Range{0, 4}}, {Peer: "b", Range: Range{4, 8}}}}
	if d := b.Check(gap, "me", Range{0, 4}, 1); !d.Move || d.Reason != ReasonGap || d.To != (Range{8, 12}) {
		t.Fatalf("gap not filled at once: %+v", d)
	}

	// A partial fix waits a check for a complete one: with 0-4 (me),
	// 3-7 and 8-12, layer 7 is on no route. 3-7 → 4-8 closes it at once;
	// me → 0-3 only narrows it (and would leave 3-7 nowhere to go), so me
	// waits one check.
	partial := View{NLayer: 12, Servers: []Server{{Peer: "x", Range: Range{3, 7}}, {Peer: "y", Range: Range{8, 12}}, {Peer: "me", Range: Range{0, 4}}}}
	if d := NewRebalancer(sz, budget, rng).Check(partial, "x", Range{3, 7}, 1); !d.Move || d.To != (Range{4, 8}) {
		t.Fatalf("the complete fix was not made at once: %+v", d)
	}
	b = NewRebalancer(sz, budget, rng)
	if d := b.Check(partial, "me", Range{0, 4}, 1); d.Move {
		t.Fatalf("a partial fix at the first check: %+v", d)
	}
	if d := b.Check(partial, "me", Range{0, 4}, 1); !d.Move || d.Reason != ReasonGap || d.To != (Range{0, 3}) {
		t.Fatalf("the partial fix at the second check: %+v", d)
	}

	// Never uncover: me is the only server of 0-4; the gap stays.
	b = NewRebalancer(sz, budget, rng)
	alone := View{NLayer: 12, Servers: []Server{{Peer: "b", Range: Range{4, 8}}}}
	if d := b.Check(alone, "me", Range{0, 4}, 1); d.Move {
		t.Fatalf("moved off the only copy of 0-4: %+v", d)
	}

	// A planned window is not yet a replica: me stays until it loads.
	b = NewRebalancer(sz, budget, rng)
	// (8-12 is a gap: counting p as loaded, me would fill it at once.)
	planned := View{NLayer: 12, Servers: []Server{{Peer: "b", Range: Range{4, 8}}, {Peer: "p", Range: Range{0, 4}, Planned: true}}}
	for range 4 {
		if d := b.Check(planned, "me", Range{0, 4}, 1); d.Move {
			t.Fatalf("left 0-4 to a window still loading: %+v", d)
		}
	}

	// Throughput: 0-4 has three fast replicas, 8-12 one slow server.
	tp := View{NLayer: 12, Servers: []Server{{Peer: "a", Range: Range{0, 4}, MsPerLayer: 1}, {Peer: "c", Range: Range{0, 4}, MsPerLayer: 1},
		{Peer: "b", Range: Range{4, 8}, MsPerLayer: 0.2}, {Peer: "d", Range: Range{8, 12}, MsPerLayer: 1}, {Peer: "e", Range: Range{4, 8}, MsPerLayer: 0.2}}}
	b = NewRebalancer(sz, budget, rng)
	var got []bool
	for range 5 {
		d := b.Check(tp, "me", Range{0, 4}, 1)
		got = append(got, d.Move)
		if d.Move {
			if d.Reason != ReasonThroughput || d.To != (Range{8, 12}) {
				t.Fatalf("move %+v", d)
			}
			break
		}
		if !strings.Contains(d.Why, "check") {
			t.Errorf("why = %q", d.Why)
		}
	}
	// The start counts as a move: checks 1-2 are in the cooldown, 3 is
	// the second check in a row that saw the better window.
	if len(got) != 3 || got[0] || got[1] || !got[2] {
		t.Fatalf("moves per check = %v, want [false false true]", got)
	}
	// Right after the move: in the cooldown again.
	if d := b.Check(tp, "me", Range{8, 12}, 1); d.Move {
		t.Fatalf("moved again at once: %+v", d)
	}
}

// TestGapClosersTakeTurns: two self-placing replicas of 8-12 after 4-8
// died can each close the gap alone, and each checks within seconds of
// the crash; both moving left 8-12 empty, and both moved back, in step
// (node TestAutoPlacementLoopback). The lower peer id moves at its first
// check; the other waits a check, stays once it sees the planned window,
// and moves at its second check if none came. A node that cannot close
// the gap alone, or is moving already, does not hold the others.
func TestGapClosersTakeTurns(t *testing.T) {
	sz := uniformSizing(12)
	budget := sz.FixedBytes + 4*100 + 60 // 4 layers, also at the tail
	rng := rand.New(rand.NewPCG(3, 3))
	head := Server{Peer: "a", Range: Range{0, 4}, Budget: budget}
	view := func(me string, others ...Server) View {
		v := View{NLayer: 12, Servers: []Server{head, {Peer: me, Range: Range{8, 12}, Budget: budget}}}
		v.Servers = append(v.Servers, others...)
		return v
	}
	if d := NewRebalancer(sz, budget, rng).Check(view("p2"), "p1", Range{8, 12}, 1); !d.Move || d.Reason != ReasonGap || d.To != (Range{4, 8}) {
		t.Fatalf("the lower peer id did not close the gap at once: %+v", d)
	}
	b := NewRebalancer(sz, budget, rng)
	d := b.Check(view("p1"), "p2", Range{8, 12}, 1)
	if d.Move || !d.Recheck || !strings.Contains(d.Why, "p1") {
		t.Fatalf("the higher peer id moved at its first check, with p1 able to: %+v", d)
	}
	if d := b.Check(view("p1", Server{Peer: "p1", Range: Range{4, 8}, Budget: budget, Planned: true}), "p2", Range{8, 12}, 1); d.Move {
		t.Fatalf("moved with p1's window planned on the gap: %+v", d)
	}
	b = NewRebalancer(sz, budget, rng)
	b.Check(view("p1"), "p2", Range{8, 12}, 1)
	if d := b.Check(view("p1"), "p2", Range{8, 12}, 1); !d.Move || d.To != (Range{4, 8}) {
		t.Fatalf("p1 never moved, and p2 did not at its second check: %+v", d)
	}
	// In step: each round both check on the same view (neither sees the
	// other's move before its own check), then both moves land. Without
	// turns both took 4-8, then both 8-12 again, round after round.
	cur := map[string]Range{"p1": {8, 12}, "p2": {8, 12}}
	rb := map[string]*Rebalancer{"p1": NewRebalancer(sz, budget, rng), "p2": NewRebalancer(sz, budget, rng)}
	other := map[string]string{"p1": "p2", "p2": "p1"}
	for round := 0; ; round++ {
		next := map[string]Range{}
		for p, r := range cur {
			v := View{NLayer: 12, Servers: []Server{head, {Peer: other[p], Range: cur[other[p]], Budget: budget}}}
			next[p] = r
			if d := rb[p].Check(v, p, r, 1); d.Move {
				next[p] = d.To
			}
		}
		cur = next
		if (View{NLayer: 12, Servers: []Server{head, {Range: cur["p1"]}, {Range: cur["p2"]}}}).Deficit() == 0 {
			break
		}
		if round == 3 {
			t.Fatalf("checking in step, the two replicas of 8-12 found no route in 4 rounds: p1 on %s, p2 on %s", cur["p1"], cur["p2"])
		}
	}
	for _, tc := range []struct {
		name string
		v    View
	}{
		{"a rival whose budget does not hold the gap", View{NLayer: 12, Servers: []Server{head, {Peer: "p1", Range: Range{8, 12}, Budget: sz.FixedBytes + 3*100 + 60}}}},
		{"a rival with fixed layers", View{NLayer: 12, Servers: []Server{head, {Peer: "p1", Range: Range{8, 12}}}}},
		{"a rival moving already", view("p1", Server{Peer: "p1", Range: Range{0, 3}, Budget: budget, Planned: true})},
		// p1 alone holds layer 0: any move of it keeps layer 0, and no 4
		// layers from 0 close 4-8.
		{"a rival alone on a layer far from the gap", View{NLayer: 12, Servers: []Server{{Peer: "p1", Range: Range{0, 1}, Budget: budget}, {Peer: "a", Range: Range{1, 4}},
			{Peer: "c", Range: Range{8, 12}}}}},
	} {
		if d := NewRebalancer(sz, budget, rng).Check(tc.v, "p2", Range{8, 12}, 1); !d.Move || d.To != (Range{4, 8}) {
			t.Errorf("%s: the gap not closed at once: %+v", tc.name, d)
		}
	}
}

func TestBudgetParsing(t *testing.T) {
	if v, err := MemAvailable(strings.NewReader("MemTotal: 100 kB\nMemAvailable:    2048 kB\n")); err != nil || v != 2048<<10 {
		t.Errorf("MemAvailable = %d, %v", v, err)
	}
	if _, err := MemAvailable(strings.NewReader("MemTotal: 1 kB\n")); err == nil {
		t.Error("no MemAvailable accepted")
	}
	if p, ok := CgroupV2Path("1:cpu:/x\n0::/user.slice/app\n"); !ok || p != "/user.slice/app" {
		t.Errorf("cgroup path %q %v", p, ok)
	}
	for _, c := range []struct {
		max, cur string
		want     int64
		ok       bool
	}{{"max\n", "5", 0, false}, {"1000\n", "300\n", 700, true}, {"1000", "", 1000, true}, {"junk", "1", 0, false}, {"100", "200", 0, true}} {
		if v, ok := CgroupRoom(c.max, c.cur); v != c.want || ok != c.ok {
			t.Errorf("CgroupRoom(%q, %q) = %d %v", c.max, c.cur, v, ok)
		}
	}
	for avail, want := range map[int64]int64{10 << 30: 9 << 30, 1 << 30: 768 << 20, 4 << 30: 3584 << 20, 200 << 20: 150 << 20, 0: 0} {
		if got := ApplyReserve(avail); got != want {
			t.Errorf("ApplyReserve(%d) = %d, want %d", avail, got, want)
		}
	}
	for in, want := range map[string]int64{"512M": 512 << 20, "4G": 4 << 30, "1.5GiB": 3 << 29, "123456": 123456, "2gb": 2 << 30} {
		if v, err := ParseBytes(in); err != nil || v != want {
			t.Errorf("ParseBytes(%q) = %d, %v", in, v, err)
		}
	}
	for _, in := range []string{"", "x", "-1G", "0", "1e30T"} {
		if _, err := ParseBytes(in); err == nil {
			t.Errorf("ParseBytes(%q) accepted", in)
		}
	}
	if b, src, err := Budget(); err != nil || b <= 0 || src == "" {
		t.Errorf("Budget() = %d %q %v", b, src, err)
	}
}

// FuzzParseBytes: any --memory string either parses to a positive size
// within bounds or is refused; never a panic.
func FuzzParseBytes(f *testing.F) {
	for _, s := range []string{"512M", "4G", "1.5GiB", "123", "", "-1", "1e400", "NaNG", "0x10", "1e-300G", "InfM"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := ParseBytes(s)
		if err == nil && (v <= 0 || v > 1<<50) {
			t.Fatalf("ParseBytes(%q) = %d", s, v)
		}
	})
}

// FuzzFromTensors: tensor lists from a header or a manifest never panic
// the sizing, and a sizing that builds has one entry per layer.
func FuzzFromTensors(f *testing.F) {
	f.Add("blk.0.attn_q.weight", int64(10), "token_embd.weight", int64(5), 4)
	f.Add("blk.x.y", int64(1), "blk.-1.", int64(-3), 1)
	f.Fuzz(func(t *testing.T, n1 string, b1 int64, n2 string, b2 int64, nl int) {
		if nl > 1<<12 {
			return
		}
		sz, err := FromTensors(Geometry{NLayer: nl, NEmbd: 8, NHead: 2, KVWidth: 8}, []Tensor{{n1, b1}, {n2, b2}}, EngineShape{NCtx: 16, NBatch: 4})
		if err == nil && len(sz.LayerBytes) != nl {
			t.Fatalf("%d layer sizes for %d layers", len(sz.LayerBytes), nl)
		}
	})
}

// The cgroup v1 memory controller, as Docker on a cgroup v1 host sets a
// container's mem_limit.
func TestCgroupV1(t *testing.T) {
	for _, c := range []struct {
		in, want string
		ok       bool
	}{
		{"9:name=systemd:/\n4:memory:/docker/abc\n0::/\n", "/docker/abc", true},
		{"3:cpu,memory:/x\n", "/x", true},
		{"0::/user.slice\n", "", false},
		{"4:memoryless:/y\n", "", false},
	} {
		if p, ok := CgroupV1MemoryPath(c.in); p != c.want || ok != c.ok {
			t.Errorf("CgroupV1MemoryPath(%q) = %q %v", c.in, p, ok)
		}
	}
	for _, c := range []struct {
		lim, use string
		want     int64
		ok       bool
	}{
		{"1073741824\n", "73741824\n", 1<<30 - 73741824, true},
		{"9223372036854771712\n", "5721571328\n", 0, false}, // no limit
		{"209715200", "", 200 << 20, true},
		{"104857600", "209715200", 0, true}, // over the limit: no room
		{"x", "1", 0, false},
	} {
		if v, ok := CgroupV1Room(c.lim, c.use); v != c.want || ok != c.ok {
			t.Errorf("CgroupV1Room(%q, %q) = %d %v", c.lim, c.use, v, ok)
		}
	}
}

// An architecture's cut rules (Sizing.Cut) hold for every window
// placement proposes: candidates, the longest window, heal plans.
func TestPlacementHonoursCutRules(t *testing.T) {
	sz := Sizing{NLayer: 61, LayerBytes: make([]int64, 61)}
	for i := range sz.LayerBytes {
		sz.LayerBytes[i] = 100
	}
	illegal := func(r Range) bool { return r.Len() != 61 && (r.Len() == 26 || r.Len() == 27) }
	sz.Cut = func(r Range) error {
		if illegal(r) {
			return fmt.Errorf("%v: 26 or 27 layers", r)
		}
		return nil
	}
	for _, r := range Candidates(sz, 2700) {
		if illegal(r) {
			t.Fatalf("candidate %v breaks the cut rule", r)
		}
	}
	if got := sz.MaxWindow(0, 2750); got != 25 {
		t.Errorf("MaxWindow(0) within 27.5 layers' bytes = %d, want 25 (26 and 27 are illegal)", got)
	}
	members := []Member{{Peer: "a", Budget: 2700}, {Peer: "b", Budget: 2700}, {Peer: "c", Budget: 2700}}
	plan, err := Heal(sz, members)
	if err != nil {
		t.Fatal(err)
	}
	for id, r := range plan.Moves {
		if illegal(r) {
			t.Errorf("heal moves %s to %v, which breaks the cut rule", id, r)
		}
	}
	t.Logf("heal plan %v", plan.Moves)
}

// Budget reads this machine's available memory: /proc/meminfo and the
// cgroup limits on Linux, GlobalMemoryStatusEx on Windows (run under wine
// by make test-platforms).
func TestBudgetHost(t *testing.T) {
	b, src, err := Budget()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{"windows": {"GlobalMemoryStatusEx"}}[runtime.GOOS]
	if want == nil {
		want = []string{"MemAvailable", "cgroup memory.max", "cgroup v1 memory.limit_in_bytes"}
	}
	if b <= 0 || b > 1<<50 || !slices.Contains(want, src) {
		t.Fatalf("Budget() = %d bytes from %q; want a positive budget from one of %q", b, src, want)
	}
	t.Logf("budget %.1f GiB (%s, %s/%s)", float64(b)/(1<<30), src, runtime.GOOS, runtime.GOARCH)
}
