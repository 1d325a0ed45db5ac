//go:build linux

package gguf

import (
	"os"

	"golang.org/x/sys/unix"
)

// dropPageCache asks the kernel to drop f's cached pages (f is synced, so
// they are clean). See WriteFile for why.
func dropPageCache(f *os.File) {
	_ = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED) // advice: nothing to do if refused
}
