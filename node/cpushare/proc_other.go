//go:build !windows

package cpushare

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// ticks reads the machine's idle and total CPU ticks and this process's
// own, from /proc (ok false where there is none).
func (m *Member) ticks() (idle, total, own uint64, ok bool, err error) {
	if m.proc == "" {
		return 0, 0, 0, false, nil
	}
	if idle, total, err = m.machineTicks(); err != nil {
		return 0, 0, 0, false, err
	}
	own, err = m.ownTicks()
	return idle, total, own, err == nil, err
}

// processTicks is pid's user + system ticks, from /proc.
func (m *Member) processTicks(pid int) (uint64, bool) {
	if m.proc == "" {
		return 0, false
	}
	f, err := m.statFields(pid)
	if err != nil || len(f) < 15 {
		return 0, false
	}
	u, _ := strconv.ParseUint(f[13], 10, 64)
	s, _ := strconv.ParseUint(f[14], 10, 64)
	return u + s, true
}

// machineTicks reads the idle (idle + iowait) and total ticks of every
// CPU from /proc/stat.
func (m *Member) machineTicks() (idle, total uint64, err error) {
	b, err := os.ReadFile(filepath.Join(m.proc, "stat"))
	if err != nil {
		return 0, 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return 0, 0, errors.New("cpushare: /proc/stat has no cpu line")
	}
	for i, s := range f[1:] {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("cpushare: /proc/stat: %w", err)
		}
		total += v
		if i == 3 || i == 4 { // idle, iowait
			idle += v
		}
	}
	return idle, total, nil
}

// ownTicks reads this process's user + system ticks.
func (m *Member) ownTicks() (uint64, error) {
	f, err := m.statFields(os.Getpid())
	if err != nil || len(f) < 15 {
		return 0, fmt.Errorf("cpushare: own stat: %v", err)
	}
	u, err1 := strconv.ParseUint(f[13], 10, 64)
	s, err2 := strconv.ParseUint(f[14], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, errors.New("cpushare: own stat: bad ticks")
	}
	return u + s, nil
}

// startTime is pid's start time (field 22 of /proc/pid/stat), or "" where
// there is no /proc.
func (m *Member) startTime(pid int) string {
	if m.proc == "" {
		return ""
	}
	f, err := m.statFields(pid)
	if err != nil || len(f) < 22 {
		return ""
	}
	return f[21]
}

// statFields splits /proc/pid/stat into its fields (the command name,
// which may hold spaces, counts as one).
func (m *Member) statFields(pid int) ([]string, error) {
	b, err := os.ReadFile(filepath.Join(m.proc, strconv.Itoa(pid), "stat"))
	if err != nil {
		return nil, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil, errors.New("no command name")
	}
	head, _, _ := strings.Cut(s, " ")
	return append([]string{head, s[strings.IndexByte(s, '(') : i+1]}, strings.Fields(s[i+1:])...), nil
}
