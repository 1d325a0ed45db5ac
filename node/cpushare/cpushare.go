// Package cpushare chooses how many compute threads an engine of this
// process uses, so that several meshp2p processes on one machine (the
// demo's three nodes, a node beside `generate --local`) and other busy
// programs do not oversubscribe its cores. ggml's workers meet at a
// barrier after every operation: with more threads than free cores, one
// worker descheduled stalls the others for a scheduler time slice, and a
// 1 ms token becomes hundreds (issue 41: 410 against 1.2 ms/token).
//
// Each process joins a directory of members (a file per process, named by
// its pid and holding its start time, so a reused pid is not counted) and
// takes its share: the machine's CPUs over the live members, and no more
// than the CPUs idle beside it, measured over a short window from
// /proc/stat, or GetSystemTimes on Windows (this process's own time
// counted as idle). Where neither is there, every CPU counts as idle.
package cpushare

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"time"

	"github.com/neuron-tai/meshp2p/node/localnodes"
)

// Window is how long Threads measures the machine's idle CPUs.
const Window = 250 * time.Millisecond

// Member is this process's place among the meshp2p processes of the
// machine that compute.
type Member struct {
	dir, file string
	ncpu      int
	proc      string // the /proc root ("" : none)

	gateOnce sync.Once
	gate     *Gate // Gate's (nil: none here)
}

// DefaultDir is the members' directory: one per user, in the temporary
// directory.
func DefaultDir() string {
	return filepath.Join(localnodes.UserDir(), "engines")
}

// Join registers this process in dir (created if missing).
func Join(dir string) (*Member, error) {
	m := &Member{dir: dir, ncpu: runtime.NumCPU()}
	if _, err := os.Stat("/proc/self/stat"); err == nil {
		m.proc = "/proc"
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("cpushare: %w", err)
	}
	pid := os.Getpid()
	m.file = filepath.Join(dir, strconv.Itoa(pid))
	if err := os.WriteFile(m.file, []byte(m.startTime(pid)), 0o600); err != nil {
		return nil, fmt.Errorf("cpushare: %w", err)
	}
	return m, nil
}

// Leave removes this process from the members (and frees its slot in
// the claims file).
func (m *Member) Leave() {
	m.gate.Close()
	_ = os.Remove(m.file)
}

// Members counts the live members, this process included; files of
// processes that are gone are removed.
func (m *Member) Members() int {
	ents, err := os.ReadDir(m.dir)
	if err != nil {
		return 1
	}
	n := 0
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if pid == os.Getpid() {
			n++
			continue
		}
		b, err := os.ReadFile(filepath.Join(m.dir, e.Name()))
		if err != nil {
			continue
		}
		// A member's file holds its start time where the platform has one
		// (/proc, GetProcessTimes): a live pid with another start time is a
		// reused pid, not the member.
		if want := string(b); localnodes.Alive(pid) && (want == "" || m.startTime(pid) == want) {
			n++
		} else {
			_ = os.Remove(filepath.Join(m.dir, e.Name()))
		}
	}
	return max(n, 1)
}

// Threads is this process's share of the machine's CPUs now: the CPUs
// over the live members, at most the CPUs idle beside this process over
// Window, at least 1.
func (m *Member) Threads(ctx context.Context) int {
	share := max(1, m.ncpu/m.Members())
	idle, err := m.idleCPUs(ctx, false)
	if err != nil {
		return share
	}
	return max(1, min(share, int(math.Round(idle))))
}

// Cap is how many CPUs the machine's meshp2p processes may compute on
// now: those idle or running a member over Window, at least 1. It sizes
// the thread pool of an engine whose decodes a Gate sizes.
func (m *Member) Cap(ctx context.Context) int {
	free, err := m.idleCPUs(ctx, true)
	if err != nil {
		return max(1, m.ncpu/m.Members())
	}
	return max(1, int(math.Round(free)))
}

// othersTicks reads the CPU time (processTicks) of each other member that
// can be read, by pid.
func (m *Member) othersTicks() map[int]uint64 {
	ents, _ := os.ReadDir(m.dir)
	n := map[int]uint64{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if t, ok := m.processTicks(pid); ok {
			n[pid] = t
		}
	}
	return n
}

// idleCPUs measures how many CPUs were idle or running this process (with
// members, any member) over Window.
func (m *Member) idleCPUs(ctx context.Context, members bool) (float64, error) {
	idle0, total0, own0, ok, err := m.ticks()
	var others0 map[int]uint64
	if members {
		others0 = m.othersTicks()
	}
	if err != nil || !ok {
		return float64(m.ncpu), err
	}
	t := time.NewTimer(Window)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-t.C:
	}
	idle1, total1, own1, _, err := m.ticks()
	if err != nil {
		return 0, err
	}
	if total1 <= total0 {
		return float64(m.ncpu), nil
	}
	// Members' time over the window: only those there at both readings
	// (one that joined in between brings its whole lifetime).
	if members {
		for pid, t1 := range m.othersTicks() {
			if t0, ok := others0[pid]; ok && t1 >= t0 {
				own1 += t1 - t0
			}
		}
	}
	free := float64(idle1-idle0+own1-own0) / float64(total1-total0)
	return min(1, free) * float64(m.ncpu), nil
}
