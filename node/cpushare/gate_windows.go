package cpushare

import (
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/windows"
)

// mapShared maps size bytes of f through a file mapping object: every
// process that maps the same file sees the same pages, as with a shared
// mmap. The view keeps the mapping alive once its handle is closed.
func mapShared(f *os.File, size int) ([]byte, func(), error) {
	h, err := windows.CreateFileMapping(windows.Handle(f.Fd()), nil, windows.PAGE_READWRITE, 0, uint32(size), nil)
	if err != nil {
		return nil, nil, fmt.Errorf("CreateFileMapping: %w", err)
	}
	defer windows.CloseHandle(h)
	addr, err := windows.MapViewOfFile(h, windows.FILE_MAP_WRITE, 0, 0, uintptr(size))
	if err != nil {
		return nil, nil, fmt.Errorf("MapViewOfFile: %w", err)
	}
	// addr is memory the Go heap does not own: no GC pointer rule applies.
	b := unsafe.Slice((*byte)(unsafe.Add(nil, addr)), size)
	return b, func() { _ = windows.UnmapViewOfFile(addr) }, nil
}
