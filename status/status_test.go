package status

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/neuron-tai/meshp2p/session"
)

func TestCoverage(t *testing.T) {
	for _, tc := range []struct {
		name   string
		n      int
		shards []Shard
		rep    []int
		runs   []Run
		gaps   []Run
	}{
		{"none", 3, nil, []int{0, 0, 0}, []Run{{0, 3, 0}}, []Run{{0, 3, 0}}},
		{"full", 4, []Shard{{Start: 0, End: 2, Live: true}, {Start: 2, End: 4, Live: true}}, []int{1, 1, 1, 1}, []Run{{0, 4, 1}}, []Run{}},
		{"replica and gap", 5, []Shard{{Start: 0, End: 3, Live: true}, {Start: 1, End: 3, Live: true}}, []int{1, 2, 2, 0, 0},
			[]Run{{0, 1, 1}, {1, 3, 2}, {3, 5, 0}}, []Run{{3, 5, 0}}},
		{"dead shard is no coverage", 2, []Shard{{Start: 0, End: 2, Live: false}, {Start: 0, End: 1, Live: true}}, []int{1, 0},
			[]Run{{0, 1, 1}, {1, 2, 0}}, []Run{{1, 2, 0}}},
		{"planned window is no coverage", 2, []Shard{{Start: 0, End: 2, Live: true, Planned: true}, {Start: 0, End: 1, Live: true}}, []int{1, 0},
			[]Run{{0, 1, 1}, {1, 2, 0}}, []Run{{1, 2, 0}}},
		{"out of range clamped", 2, []Shard{{Start: -3, End: 9, Live: true}}, []int{1, 1}, []Run{{0, 2, 1}}, []Run{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep, runs, gaps := Coverage(tc.n, tc.shards)
			if !reflect.DeepEqual(rep, tc.rep) || !reflect.DeepEqual(runs, tc.runs) || !reflect.DeepEqual(gaps, tc.gaps) {
				t.Fatalf("got %v %v %v, want %v %v %v", rep, runs, gaps, tc.rep, tc.runs, tc.gaps)
			}
		})
	}
	if r, _, _ := Coverage(1<<20, nil); r != nil {
		t.Fatal("a huge advertised layer count must not allocate")
	}
}

func TestWriteTextAndRecorder(t *testing.T) {
	var rec Recorder
	for i := 0; i < MaxRoutes+5; i++ {
		rec.SessionAdmitted(sessionInfo(uint64(1 + i%2)))
	}
	rs := rec.Routes()
	if len(rs) != MaxRoutes || rs[0].Epoch != 1 || rs[1].Epoch != 2 || !rs[1].Reroute || rs[0].Reroute || rec.Counters().SessionsAdmitted != MaxRoutes+5 {
		t.Fatalf("routes %d, first %+v, counters %+v", len(rs), rs[0], rec.Counters())
	}
	rep, runs, gaps := Coverage(5, []Shard{{Start: 0, End: 3, Live: true}})
	d := &Document{Time: time.Now(), Models: []Model{{Name: "m", NLayer: 5, Replicas: rep, Runs: runs, Gaps: gaps, Missing: gapText(gaps),
		Shards: []Shard{{Peer: "p", Start: 0, End: 3, Live: true, Path: "direct", KernelClass: "cpu/a"}, {Peer: "q", Start: 3, End: 5, Path: "none", KernelClass: "cpu/b"}}}}, Routes: rs,
		Self: Self{Placement: &Placement{BudgetBytes: 3 << 20, Start: 0, End: 3, Draining: &Window{Start: 0, End: 3}, Loading: &Window{Start: 3, End: 5}, Moves: 1, LastReason: "gap"}}}
	var b strings.Builder
	if err := WriteText(&b, d); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"NOT routable: no live shard serves layers 3-5", "coverage  111..", "layers   0-3", "DEAD", "(re-route)",
		"placement: automatic, budget 3 MiB, serving layers 0-3, 1 move(s), loading 3-5, draining 0-3; last: gap",
		"kernel classes: 2 (hops of different classes agree only to rounding"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, b.String())
		}
	}
}

func sessionInfo(epoch uint64) session.SessionInfo {
	return session.SessionInfo{Fingerprint: "fp", Epoch: epoch, Hops: []session.HopInfo{{Start: 0, End: 5}}}
}
