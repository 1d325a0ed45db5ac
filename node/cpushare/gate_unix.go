//go:build unix

package cpushare

import (
	"os"
	"syscall"
)

// mapShared maps size bytes of f, shared with every process that maps it.
func mapShared(f *os.File, size int) ([]byte, func(), error) {
	b, err := syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, nil, err
	}
	return b, func() { _ = syscall.Munmap(b) }, nil
}
