//go:build unix

package cpushare

import (
	"fmt"
	"os"
	"syscall"
)

// mapClaims maps the claims file (created at GateSlots words of zeros if
// missing) shared between processes.
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
	b, err := syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, nil, fmt.Errorf("cpushare: mmap %s: %w", path, err)
	}
	return b, func() { _ = syscall.Munmap(b) }, nil
}
