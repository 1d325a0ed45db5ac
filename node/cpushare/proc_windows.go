package cpushare

import (
	"fmt"
	"strconv"
	"unsafe"

	"golang.org/x/sys/windows"
)

// ticks reads the machine's idle and total CPU time (GetSystemTimes: its
// kernel time includes the idle time; both summed over the CPUs) and this
// process's own (GetProcessTimes), in 100 ns units.
func (m *Member) ticks() (idle, total, own uint64, ok bool, err error) {
	var fi, fk, fu windows.Filetime
	// GetSystemTimes: x/sys/windows does not wrap it.
	getSystemTimes := windows.NewLazySystemDLL("kernel32.dll").NewProc("GetSystemTimes")
	if r, _, e := getSystemTimes.Call(uintptr(unsafe.Pointer(&fi)), uintptr(unsafe.Pointer(&fk)), uintptr(unsafe.Pointer(&fu))); r == 0 {
		return 0, 0, 0, false, fmt.Errorf("cpushare: GetSystemTimes: %w", e)
	}
	var c, x, k, u windows.Filetime
	if err := windows.GetProcessTimes(windows.CurrentProcess(), &c, &x, &k, &u); err != nil {
		return 0, 0, 0, false, fmt.Errorf("cpushare: GetProcessTimes: %w", err)
	}
	return ft(fi), ft(fk) + ft(fu), ft(k) + ft(u), true, nil
}

// processTicks is pid's kernel + user time (GetProcessTimes), in the
// 100 ns units of ticks.
func (m *Member) processTicks(pid int) (uint64, bool) {
	_, used, ok := processTimes(pid)
	return used, ok
}

// processTimes is pid's creation time and its kernel + user time; ok is
// false when they cannot be read (the process is gone, or not ours to
// query).
func processTimes(pid int) (created, used uint64, ok bool) {
	h, err := windows.OpenProcess(windows.PROCESS_QUERY_LIMITED_INFORMATION, false, uint32(pid))
	if err != nil {
		return 0, 0, false
	}
	defer windows.CloseHandle(h)
	var c, x, k, u windows.Filetime
	if err := windows.GetProcessTimes(h, &c, &x, &k, &u); err != nil {
		return 0, 0, false
	}
	return ft(c), ft(k) + ft(u), true
}

func ft(f windows.Filetime) uint64 { return uint64(f.HighDateTime)<<32 | uint64(f.LowDateTime) }

// startTime is pid's creation time (GetProcessTimes), or "" when it
// cannot be read (the process is gone, or not ours to query).
func (m *Member) startTime(pid int) string {
	c, _, ok := processTimes(pid)
	if !ok {
		return ""
	}
	return strconv.FormatUint(c, 10)
}
