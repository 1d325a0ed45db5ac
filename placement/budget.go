package placement

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Reserve is what the default budget leaves to the rest of the machine
// (and this process's own heap): 10% of what is available, at least
// MinReserve, but never more than a quarter (a container with a 200 MiB
// limit keeps 150 MiB for layers).
const (
	ReserveFraction = 0.10
	MinReserve      = 512 << 20
)

// Budget is the memory a node may use when --memory is not given: the
// available RAM, minus the reserve. On Linux that is /proc/meminfo's
// MemAvailable, or less when the process's cgroup v2 limit (memory.max
// less memory.current), or its cgroup v1 one (memory.limit_in_bytes less
// memory.usage_in_bytes), leaves less; on Windows GlobalMemoryStatusEx's
// ullAvailPhys. src says which bound applied.
func Budget() (budget int64, src string, err error) {
	avail, src, err := hostAvailable()
	if err != nil {
		return 0, "", err
	}
	return ApplyReserve(avail), src, nil
}

// linuxAvailable is MemAvailable, bounded by the process's cgroup (v2,
// else v1).
func linuxAvailable() (avail int64, src string, err error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, "", fmt.Errorf("placement: memory budget: %w (pass --memory)", err)
	}
	avail, err = MemAvailable(f)
	f.Close()
	if err != nil {
		return 0, "", err
	}
	src = "MemAvailable"
	if lim, ok := cgroupRoom(); ok && lim < avail {
		avail, src = lim, "cgroup memory.max"
	} else if lim, ok := cgroupV1Room(); ok && lim < avail {
		avail, src = lim, "cgroup v1 memory.limit_in_bytes"
	}
	return avail, src, nil
}

// ApplyReserve subtracts the reserve from avail (never below 0).
func ApplyReserve(avail int64) int64 {
	r := max(int64(float64(avail)*ReserveFraction), min(MinReserve, avail/4))
	return max(0, avail-r)
}

// MemAvailable reads MemAvailable from a /proc/meminfo.
func MemAvailable(r io.Reader) (int64, error) {
	sc := bufio.NewScanner(io.LimitReader(r, 1<<16))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && f[0] == "MemAvailable:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil || kb < 0 || kb > 1<<50 {
				return 0, fmt.Errorf("placement: bad MemAvailable %q", f[1])
			}
			return kb << 10, nil
		}
	}
	return 0, errors.New("placement: no MemAvailable in /proc/meminfo")
}

// cgroupRoom is memory.max − memory.current of this process's cgroup v2
// (false when there is none, or no limit).
func cgroupRoom() (int64, bool) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return 0, false
	}
	dir, ok := CgroupV2Path(string(b))
	if !ok {
		return 0, false
	}
	base := filepath.Join("/sys/fs/cgroup", dir)
	maxB, err := os.ReadFile(filepath.Join(base, "memory.max"))
	if err != nil {
		return 0, false
	}
	curB, _ := os.ReadFile(filepath.Join(base, "memory.current"))
	return CgroupRoom(string(maxB), string(curB))
}

// CgroupV2Path is the unified hierarchy's path in a /proc/self/cgroup
// ("0::/path").
func CgroupV2Path(procCgroup string) (string, bool) {
	for _, l := range strings.Split(procCgroup, "\n") {
		if p, ok := strings.CutPrefix(l, "0::"); ok {
			return p, true
		}
	}
	return "", false
}

// CgroupRoom is what memory.max leaves given memory.current (false for
// "max", i.e. no limit, or a file that does not parse).
func CgroupRoom(memMax, memCurrent string) (int64, bool) {
	m := strings.TrimSpace(memMax)
	if m == "" || m == "max" {
		return 0, false
	}
	lim, err := strconv.ParseInt(m, 10, 64)
	if err != nil || lim <= 0 {
		return 0, false
	}
	cur, err := strconv.ParseInt(strings.TrimSpace(memCurrent), 10, 64)
	if err != nil || cur < 0 {
		cur = 0
	}
	return max(0, lim-cur), true
}

// ParseBytes reads a size such as 512M, 4G, 1.5GiB or 123456 (bytes).
func ParseBytes(s string) (int64, error) {
	t := strings.TrimSpace(strings.ToUpper(s))
	t = strings.TrimSuffix(strings.TrimSuffix(t, "B"), "I")
	mult := int64(1)
	if t != "" {
		switch t[len(t)-1] {
		case 'K':
			mult = 1 << 10
		case 'M':
			mult = 1 << 20
		case 'G':
			mult = 1 << 30
		case 'T':
			mult = 1 << 40
		}
		if mult != 1 {
			t = t[:len(t)-1]
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || !(v > 0) || !(v*float64(mult) <= 1<<50) { // also NaN and Inf
		return 0, fmt.Errorf("placement: bad size %q (want e.g. 512M, 4G, 1.5GiB)", s)
	}
	n := int64(v * float64(mult))
	if n < 1 {
		return 0, fmt.Errorf("placement: bad size %q (less than a byte)", s)
	}
	return n, nil
}
