//go:build linux

package gguf

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestWriteFileLeavesNoPages: a written file's pages are dropped once
// synced, so the engine's mapping reads them back (WriteFile says why).
func TestWriteFileLeavesNoPages(t *testing.T) {
	dir := t.TempDir()
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		t.Fatal(err)
	}
	if fs.Type == unix.TMPFS_MAGIC || fs.Type == unix.RAMFS_MAGIC {
		t.Skipf("%s is in memory (tmpfs): its pages are the file, nothing to drop", dir)
	}
	const n = 4 << 20 // floats: 16 MiB of data
	data := bytes.Repeat([]byte{1, 2, 3, 4}, n)
	p := filepath.Join(dir, "w.gguf")
	md := Metadata{}
	md.Set("general.architecture", "llama")
	ts := []WriteTensor{{Name: "t", Type: TypeF32, Shape: []uint64{n}, Data: bytes.NewReader(data)}}
	if err := WriteFile(context.Background(), p, md, ts, nil); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	page := os.Getpagesize()
	vec := make([]byte, (len(m)+page-1)/page)
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatal(e)
	}
	resident := 0
	for _, v := range vec {
		resident += int(v & 1)
	}
	// The header's page may be read back by the rename's checks; the
	// tensor data must not stay cached.
	if resident > len(vec)/10 {
		t.Fatalf("%d of %d pages of the written file are still in the page cache", resident, len(vec))
	}
	t.Logf("%d of %d pages resident after WriteFile", resident, len(vec))
}
