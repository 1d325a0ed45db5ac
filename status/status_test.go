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

func TestBackendOf(t *testing.T) {
	for _, tc := range []struct {
		class, backend, device string
	}{
		{"", "", ""},
		{"cpu/amd64/sse3+ssse3+avx+avx2+f16c+fma+bmi2/llama.cpp@ec98e2002/fa", "cpu", ""},
		{"cpu/arm64/neon+arm_fma+fp16_va+dotprod/llama.cpp@ec98e2002/fa", "cpu", ""},
		{"cpu/a", "cpu", ""},
		{"vulkan/llvmpipe (LLVM 15.0.6, 256 bits)/llama.cpp@ec98e2002/fa", "vulkan", "llvmpipe (LLVM 15.0.6, 256 bits)"},
		{"cuda/NVIDIA H200/llama.cpp@ec98e2002/fa", "cuda", "NVIDIA H200"},
		// A '/' in the description: the device runs to the last
		// "/llama.cpp@".
		{"vulkan/AMD Radeon RX 7900 XTX (RADV NAVI31) / Mesa 24.0/llama.cpp@ec98e2002/fa", "vulkan", "AMD Radeon RX 7900 XTX (RADV NAVI31) / Mesa 24.0"},
		{"vulkan/odd/llama.cpp@x/llama.cpp@ec98e2002/fa", "vulkan", "odd/llama.cpp@x"},
		{"vulkan//llama.cpp@ec98e2002/fa", "vulkan", ""},
		{"vulkan/llama.cpp@ec98e2002/fa", "vulkan", ""},
		// No revision: the rest is the device.
		{"metal/Apple M2", "metal", "Apple M2"},
		{"fake", "fake", ""},
		{"/x", "", "x"},
	} {
		if b, d := BackendOf(tc.class); b != tc.backend || d != tc.device {
			t.Errorf("BackendOf(%q) = %q, %q; want %q, %q", tc.class, b, d, tc.backend, tc.device)
		}
	}
}

// The per-shard lines name each shard's backend (and a GPU's device),
// its speed, and the model line which backends serve it when kernel
// classes differ.
func TestWriteTextBackends(t *testing.T) {
	cpu := "cpu/amd64/sse3+avx2/llama.cpp@ec98e2002/fa"
	vk := "vulkan/llvmpipe (LLVM 15.0.6, 256 bits)/llama.cpp@ec98e2002/fa"
	shard := func(peer string, start, end int, class string, tps float64) Shard {
		s := Shard{Peer: peer, Start: start, End: end, Live: true, Path: "direct", MsPerLayer: 0.25, TokensPerSec: tps, KernelClass: class}
		s.Backend, s.Device = BackendOf(class)
		return s
	}
	for _, tc := range []struct {
		name         string
		shards       []Shard
		want, reject []string
	}{
		{"cpu and vulkan", []Shard{shard("p", 0, 2, cpu, 2000), shard("q", 2, 4, vk, 0)}, []string{
			"layers   0-2   p  direct  cpu  sessions 0/0 free, 0 KV free, 0.250 ms/layer, 2000.0 tok/s\n",
			"layers   2-4   q  direct  vulkan (llvmpipe (LLVM 15.0.6, 256 bits))  sessions 0/0 free, 0 KV free, 0.250 ms/layer\n",
			"kernel classes: 2 (hops of different classes agree only to rounding; see kernel_class in --json); backends: cpu, vulkan\n",
		}, nil},
		{"one class: no kernel class line", []Shard{shard("p", 0, 2, cpu, 0), shard("q", 2, 4, cpu, 0)}, []string{
			"layers   2-4   q  direct  cpu  sessions",
		}, []string{"kernel classes", "tok/s"}},
		{"older node: no backend", []Shard{shard("p", 0, 4, "", 0)}, []string{
			"layers   0-4   p  direct  sessions 0/0 free",
		}, []string{"kernel classes"}},
		{"planned", []Shard{func() Shard {
			s := shard("p", 0, 4, "cuda/NVIDIA H200/llama.cpp@ec98e2002/fa", 0)
			s.Planned = true
			return s
		}()}, []string{
			"layers   0-4   p  direct  cuda (NVIDIA H200)  planned: loading (placement)\n",
		}, nil},
		{"control characters in a device", []Shard{shard("p", 0, 4, "vulkan/evil\x1b[2J\xff/llama.cpp@ec98e2002/fa", 0)}, []string{
			"vulkan (evil?[2J?)  sessions",
		}, []string{"\x1b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &Document{Models: []Model{{Name: "m", NLayer: 4, Shards: tc.shards}}}
			var b strings.Builder
			if err := WriteText(&b, d); err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(b.String(), w) {
					t.Errorf("text lacks %q:\n%s", w, b.String())
				}
			}
			for _, r := range tc.reject {
				if strings.Contains(b.String(), r) {
					t.Errorf("text has %q:\n%s", r, b.String())
				}
			}
		})
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

// The text view lists the swarm's demand per model, with the standby
// peers offering the warming ones, and a multi-model node's model choice.
func TestWriteTextDemand(t *testing.T) {
	d := &Document{Self: Self{Placement: &Placement{Start: 0, End: 5, ModelReason: "b is asked for and has no route"}},
		Demand: []ModelDemand{
			{Fingerprint: strings.Repeat("bb", 32), Name: "bee", Requests: 1.5, Refused: 1.5, Offers: 2, State: "warming"},
			{Fingerprint: strings.Repeat("aa", 32), Name: "", Requests: 0.25, TokensPerSec: 12, State: "served"},
		}}
	var b strings.Builder
	if err := WriteText(&b, d); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"demand (per second, gossiped)", "bee", "warming", "1.50 requests", "2 peer(s) offer to load it",
		"served", "12.0 tokens", "models: b is asked for and has no route"} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}
}
