//go:build unix || windows

package cpushare

import (
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/neuron-tai/meshp2p/internal/testbin"
)

// fakeGate is a Gate of a made-up member pid on m's claims file (its
// member file written, so sweeps keep it), for claims of several
// "processes" in one test.
func fakeGate(t *testing.T, m *Member, pid int) *Gate {
	t.Helper()
	register(t, m, pid, "")
	b, _, err := mapClaims(m.dir + "/claims")
	if err != nil {
		t.Fatal(err)
	}
	g := &Gate{words: slots(b), ncpu: m.ncpu, pid: uint64(pid)}
	for i := range g.words {
		if g.words[i] == 0 {
			g.words[i] = uint64(pid) << 32
			g.mine.Store(&g.words[i])
			return g
		}
	}
	t.Fatal("no free slot")
	return nil
}

// A decode takes the CPUs no member computes on, at most its limit, at
// least one, and gives them back.
func TestGateClaims(t *testing.T) {
	m, err := Join(tempDir(t))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Leave()
	m.ncpu = 4
	a, b := fakeGate(t, m, 1<<30), fakeGate(t, m, 1<<30+1)
	for _, tc := range []struct {
		name        string
		hold        int // a's claim while b asks (0: none)
		limit, want int
	}{
		{"alone", 0, 4, 4},
		{"alone, limited", 0, 2, 2},
		{"beside a decode on 2", 2, 4, 2},
		{"beside a decode on 3", 3, 4, 1},
		{"beside a decode on every CPU: still one", 4, 4, 1},
		{"beside a decode on one: an even share, not the other 3", 1, 4, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.hold > 0 {
				if got := a.Acquire(tc.hold); got != tc.hold {
					t.Fatalf("a alone claimed %d, want %d", got, tc.hold)
				}
				defer a.Release(tc.hold)
			}
			got := b.Acquire(tc.limit)
			defer b.Release(got)
			if got != tc.want {
				busy, _ := b.busy()
				t.Fatalf("b claimed %d, want %d (busy %d)", got, tc.want, busy)
			}
		})
	}
	if n, _ := a.busy(); n != 0 {
		t.Fatalf("%d threads claimed after every release", n)
	}
	// After Close the slot is free, and a late Release does not touch it.
	k := b.Acquire(4)
	b.Close()
	b.Release(k)
	if w := *b.mine.Load(); w != 0 {
		t.Fatalf("slot after Close and a late Release: %#x", w)
	}
}

// Members that claim at once settle within the CPUs, beyond them only
// by members left with one thread, and every claim is given back.
func TestGateConcurrent(t *testing.T) {
	m, err := Join(tempDir(t))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Leave()
	m.ncpu = 4
	var gates []*Gate
	for i := range 6 {
		gates = append(gates, fakeGate(t, m, 1<<30+i))
	}
	for round := range 300 {
		n := 2 + round%5 // members decoding at once
		ks := make([]int, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Go(func() { <-start; ks[i] = gates[i].Acquire(4) })
		}
		close(start)
		wg.Wait()
		total, ones := 0, 0
		for _, k := range ks {
			total += k
			if k == 1 {
				ones++
			}
		}
		if busy, _ := gates[0].busy(); total != busy || total > 4+ones {
			t.Fatalf("round %d: claims %v (busy %d) on 4 CPUs", round, ks, busy)
		}
		for i, k := range ks {
			gates[i].Release(k)
		}
	}
	if n, _ := gates[0].busy(); n != 0 {
		t.Fatalf("%d threads claimed after every release", n)
	}
}

// The claims are shared between processes through the mapped file, and a
// member killed while holding a claim stops counting once it is swept.
func TestGateAcrossProcesses(t *testing.T) {
	dir := tempDir(t)
	m, err := Join(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Leave()
	g := m.Gate()
	if g == nil {
		t.Fatal("no gate")
	}
	defer g.Close()
	c := testbin.Child("sleep")
	c.Env = append(c.Env, gateChildEnv+"="+dir)
	out, err := c.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Process.Kill(); _ = c.Wait() })
	line := make([]byte, 16)
	n, _ := out.Read(line)
	if held, _ := strconv.Atoi(string(line[:max(0, n-1)])); held != m.ncpu {
		t.Fatalf("the child claimed %q, want %d", line[:n], m.ncpu)
	}
	if k := g.Acquire(m.ncpu); k != 1 {
		t.Fatalf("beside a child computing on every CPU: %d threads, want 1", k)
	} else {
		g.Release(k)
	}
	_ = c.Process.Kill()
	_ = c.Wait()
	m.Sweep(g)
	if k := g.Acquire(m.ncpu); k != m.ncpu {
		t.Fatalf("after the child was killed and swept: %d threads, want %d", k, m.ncpu)
	} else {
		g.Release(k)
	}
	// A process whose slot another cleared takes a new one at its next
	// sweep, so its claims are seen again.
	atomic.StoreUint64(g.mine.Load(), 0)
	m.Sweep(g)
	if w := atomic.LoadUint64(g.mine.Load()); w>>32 != uint64(os.Getpid()) {
		t.Fatalf("own slot after a sweep: %#x", w)
	}
	k := g.Acquire(m.ncpu)
	defer g.Release(k)
	if busy, _ := g.busy(); busy != k {
		t.Fatalf("a claim of %d after re-taking the slot: %d claimed", k, busy)
	}
}
