package cpushare

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"unsafe"
)

// GateSlots is how many processes the claims file has room for; a
// process that finds no free slot computes with its static share.
const GateSlots = 64

// Gate hands each decode of this process its compute threads at the
// moment it starts, out of the CPUs the machine's meshp2p processes are
// not computing on right then. The route's hops on one machine decode one
// after another (a token goes head, middle, tail), so a hop that finds
// the others idle takes every core where a static share would leave it
// one; hops that decode at once (sessions in flight) split the cores
// evenly, as the static share would. Claims live in a small file of the members'
// directory, mapped into every member's memory: one 64-bit slot per
// process, its pid in the high half and the threads it is computing with
// in the low half. A slot whose process is gone is cleared when the next
// process joins or re-checks (Sweep). Results do not depend on the thread
// count (docs/architecture.md, "Batch invariance").
type Gate struct {
	words  []uint64               // the mapped slots
	mine   atomic.Pointer[uint64] // this process's slot
	closed atomic.Bool
	pid    uint64
	ncpu   int
}

// slots views the mapped file as GateSlots words.
func slots(b []byte) []uint64 {
	return unsafe.Slice((*uint64)(unsafe.Pointer(&b[0])), GateSlots)
}

// mapClaims maps the claims file (created at GateSlots words of zeros if
// missing) shared between processes: mmap on Unix, a file mapping object
// on Windows.
func mapClaims(path string) ([]byte, func(), error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, nil, fmt.Errorf("cpushare: %w", err)
	}
	defer f.Close()
	const size = GateSlots * 8
	if fi, err := f.Stat(); err != nil {
		return nil, nil, fmt.Errorf("cpushare: %w", err)
	} else if fi.Size() < size {
		// Growing only: two processes truncating at once both grow it to size.
		if err := f.Truncate(size); err != nil {
			return nil, nil, fmt.Errorf("cpushare: %w", err)
		}
	}
	b, unmap, err := mapShared(f, size)
	if err != nil {
		return nil, nil, fmt.Errorf("cpushare: mapping %s: %w", path, err)
	}
	return b, unmap, nil
}

// Gate is this process's gate: the first call opens the members' claims
// file and takes a slot in it. Nil where the platform has no shared
// mapping (neither Unix nor Windows: the static share applies), the file
// cannot be used, or every slot is taken.
func (m *Member) Gate() *Gate {
	m.gateOnce.Do(func() { m.gate = m.openGate() })
	return m.gate
}

func (m *Member) openGate() *Gate {
	b, unmap, err := mapClaims(m.dir + string(os.PathSeparator) + "claims")
	if err != nil {
		return nil
	}
	pid := uint64(os.Getpid())
	g := &Gate{words: slots(b), ncpu: m.ncpu, pid: pid}
	// A slot of this pid is a dead process's whose pid was reused.
	for i := range g.words {
		if w := atomic.LoadUint64(&g.words[i]); w>>32 == pid {
			atomic.CompareAndSwapUint64(&g.words[i], w, 0)
		}
	}
	m.Sweep(g) // the slots of processes that are gone (no slot of its own yet)
	if !g.takeSlot() {
		unmap()
		return nil
	}
	return g
}

// takeSlot takes a free slot for this process.
func (g *Gate) takeSlot() bool {
	for i := range g.words {
		if atomic.CompareAndSwapUint64(&g.words[i], 0, g.pid<<32) {
			g.mine.Store(&g.words[i])
			return true
		}
	}
	return false
}

// sweep clears the slots of processes that are not members any more (no
// member file: Members removes those of processes that are gone).
func (m *Member) sweep(g *Gate) {
	for i := range g.words {
		w := atomic.LoadUint64(&g.words[i])
		if w == 0 || &g.words[i] == g.mine.Load() {
			continue
		}
		if _, err := os.Stat(m.dir + string(os.PathSeparator) + strconv.FormatUint(w>>32, 10)); os.IsNotExist(err) {
			atomic.CompareAndSwapUint64(&g.words[i], w, 0)
		}
	}
}

// Pool is the thread pool an engine of this process takes now, and the
// gate its decodes claim threads through: Cap with this process's gate
// (swept first, so a killed member's claim does not count), or the
// static share (Threads) and nil where there is no gate.
func (m *Member) Pool(ctx context.Context) (int, *Gate) {
	if g := m.Gate(); g != nil {
		m.Sweep(g)
		return m.Cap(ctx), g
	}
	return m.Threads(ctx), nil
}

// Sweep clears the slots of members that are gone (the node's periodic
// re-check, generate --local and the gate's opening call it). A process whose own slot was
// cleared (its member file was taken for a dead process's) takes another,
// so it does not compute unseen by the others.
func (m *Member) Sweep(g *Gate) {
	if g == nil {
		return
	}
	m.Members()
	m.sweep(g)
	if mine := g.mine.Load(); !g.closed.Load() && mine != nil && atomic.LoadUint64(mine)>>32 != g.pid {
		g.takeSlot()
	}
}

// busy is how many threads the members are computing with now, and how
// many slots other than this process's hold a claim.
func (g *Gate) busy() (threads, others int) {
	mine := g.mine.Load()
	for i := range g.words {
		n := int(uint32(atomic.LoadUint64(&g.words[i])))
		threads += n
		if n > 0 && &g.words[i] != mine {
			others++
		}
	}
	return threads, others
}

// add adds d (negative: takes it off) to this process's claim, as long
// as the slot is still this process's (Close clears it).
func (g *Gate) add(d int) {
	mine := g.mine.Load()
	for {
		w := atomic.LoadUint64(mine)
		if w>>32 != g.pid || int(uint32(w))+d < 0 {
			return
		}
		if atomic.CompareAndSwapUint64(mine, w, w+uint64(int64(d))) {
			return
		}
	}
}

// Acquire claims the threads of a decode that starts now: the CPUs no
// member is computing on, at most limit, at least 1, and while other
// members compute at most an even share of the CPUs (so a process that
// decodes back to back does not keep the CPUs from one that got a
// single thread). Two members that claim at the same moment see each
// other's claim (the atomics are sequentially consistent) and the later
// reading gives back what oversubscribes the machine, so together they
// never exceed its CPUs unless each holds one thread. Release gives the
// claim back.
func (g *Gate) Acquire(limit int) int {
	busy, others := g.busy()
	k := max(1, min(limit, g.ncpu-busy))
	if others > 0 {
		k = max(1, min(k, g.ncpu/(others+1)))
	}
	g.add(k)
	if busy, _ = g.busy(); busy > g.ncpu && k > 1 {
		back := min(k-1, busy-g.ncpu)
		g.add(-back)
		k -= back
	}
	return k
}

// Release gives back the threads an Acquire claimed.
func (g *Gate) Release(k int) {
	if k > 0 {
		g.add(-k)
	}
}

// Close frees this process's slot; Acquire still answers after it (with
// nothing claimed), so a decode that ends after Close does no harm. The
// mapping (one page) stays until the process exits.
func (g *Gate) Close() {
	if g != nil {
		g.closed.Store(true)
		atomic.StoreUint64(g.mine.Load(), 0)
	}
}
