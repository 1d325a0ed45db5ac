package placement

import (
	"fmt"
	"syscall"
	"unsafe"
)

// memoryStatusEx is Windows' MEMORYSTATUSEX.
type memoryStatusEx struct {
	length, memoryLoad                   uint32
	totalPhys, availPhys                 uint64
	totalPageFile, availPageFile         uint64
	totalVirtual, availVirtual, availExt uint64
}

var globalMemoryStatusEx = syscall.NewLazyDLL("kernel32.dll").NewProc("GlobalMemoryStatusEx")

// hostAvailable is the physical memory Windows reports available
// (GlobalMemoryStatusEx's ullAvailPhys). A job object's limit is not
// read (docs/platforms.md).
func hostAvailable() (int64, string, error) {
	st := memoryStatusEx{length: uint32(unsafe.Sizeof(memoryStatusEx{}))}
	if r, _, err := globalMemoryStatusEx.Call(uintptr(unsafe.Pointer(&st))); r == 0 {
		return 0, "", fmt.Errorf("placement: memory budget: GlobalMemoryStatusEx: %w (pass --memory)", err)
	}
	return int64(st.availPhys), "GlobalMemoryStatusEx", nil
}
