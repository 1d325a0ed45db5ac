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

// othersTicks: not read on Windows (there is no Gate there).
func (m *Member) othersTicks() map[int]uint64 { return nil }

func ft(f windows.Filetime) uint64 { return uint64(f.HighDateTime)<<32 | uint64(f.LowDateTime) }

// startTime is pid's creation time (GetProcessTimes), or "" when it
// cannot be read (the process is gone, or not ours to query).
func (m *Member) startTime(pid int) string {
	h, err := windows.OpenProcess(windows.PROCESS_QUERY_LIMITED_INFORMATION, false, uint32(pid))
	if err != nil {
		return ""
	}
	defer windows.CloseHandle(h)
	var c, x, k, u windows.Filetime
	if err := windows.GetProcessTimes(h, &c, &x, &k, &u); err != nil {
		return ""
	}
	return strconv.FormatUint(ft(c), 10)
}
