//go:build linux

package gguf

import (
	"context"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// dropPageCache asks the kernel to drop f's cached pages (f is synced, so
// they are clean). See WriteFile for why.
func dropPageCache(f *os.File) {
	_ = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED) // advice: nothing to do if refused
}

// warmStep is how much of a file WarmPages reads between two looks at its
// context and two progress reports.
const warmStep = 64 << 20

// WarmPages reads the pages of the file at path that are not in the page
// cache yet through a mapping advised MADV_HUGEPAGE, so that the kernel
// brings them in as 2 MiB folios; a later mapping of the file (the
// engine's) then maps them with 2 MiB entries instead of 4 KiB ones. A
// file already wholly cached is left as it is (its folios are what they
// are). It reports the fraction of the file read to progress (nil: none)
// and returns what it read, 0 when nothing was missing. Advice the kernel
// refuses (transparent huge pages off) leaves an ordinary read-ahead.
//
// Why: on the VM of docs/performance.md the weights of a freshly written
// or fetched shard, read back by the engine's own mapping, came 34% in
// 2 MiB entries (smaps FilePmdMapped), against 86% for a long-cached model
// file and ~100% after this; a decode streams every weight once a token,
// and each TLB miss under nested paging walks two page tables.
func WarmPages(ctx context.Context, path string, progress func(done float64)) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return 0, err
	}
	size := st.Size()
	if size == 0 || int64(int(size)) != size {
		return 0, nil
	}
	b, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return 0, fmt.Errorf("gguf: map %s: %w", path, err)
	}
	defer unix.Munmap(b)
	page := os.Getpagesize()
	vec := make([]byte, (len(b)+page-1)/page)
	if mincore(b, vec) == nil && allResident(vec) {
		return 0, nil
	}
	// Advice. Random: a fault on a page read before (the header, read
	// ahead a little) must not start the ordinary read-ahead, whose small
	// folios would fill the next megabytes before this pass gets there.
	_ = unix.Madvise(b, unix.MADV_HUGEPAGE)
	_ = unix.Madvise(b, unix.MADV_RANDOM)
	var read int64
	for off := 0; off < len(b); off += warmStep {
		if err := ctx.Err(); err != nil {
			return read, err
		}
		chunk := b[off:min(off+warmStep, len(b))]
		// Fault the chunk in (Linux 5.14+); before that, read-ahead.
		if unix.Madvise(chunk, unix.MADV_POPULATE_READ) != nil {
			_ = unix.Madvise(chunk, unix.MADV_WILLNEED)
		}
		for i := off / page; i < (off+len(chunk)+page-1)/page; i++ {
			if vec[i]&1 == 0 {
				read += int64(page)
			}
		}
		if progress != nil {
			progress(float64(off+len(chunk)) / float64(len(b)))
		}
	}
	return read, nil
}

// mincore fills vec with the residency of b's pages (bit 0: in memory).
func mincore(b, vec []byte) error {
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		return e
	}
	return nil
}

func allResident(vec []byte) bool {
	for _, v := range vec {
		if v&1 == 0 {
			return false
		}
	}
	return true
}
