//go:build linux

package gguf

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// writtenFile writes a GGUF file of n floats through WriteFile in a
// directory on a disk (skipping on tmpfs, where pages are the file).
func writtenFile(t *testing.T, n int) string {
	t.Helper()
	dir := t.TempDir()
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		t.Fatal(err)
	}
	if fs.Type == unix.TMPFS_MAGIC || fs.Type == unix.RAMFS_MAGIC {
		t.Skipf("%s is in memory (tmpfs): its pages are the file, nothing to drop", dir)
	}
	data := bytes.Repeat([]byte{1, 2, 3, 4}, n)
	p := filepath.Join(dir, "w.gguf")
	md := Metadata{}
	md.Set("general.architecture", "llama")
	ts := []WriteTensor{{Name: "t", Type: TypeF32, Shape: []uint64{uint64(n)}, Data: bytes.NewReader(data)}}
	if err := WriteFile(context.Background(), p, md, ts, nil); err != nil {
		t.Fatal(err)
	}
	return p
}

// mapFile maps the file at p read-only (the caller unmaps it).
func mapFile(t *testing.T, p string) []byte {
	t.Helper()
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
	return m
}

// residentPages maps the file at p and counts its pages in the page cache,
// and how many pages it has.
func residentPages(t *testing.T, p string) (resident, pages int) {
	t.Helper()
	m := mapFile(t, p)
	defer unix.Munmap(m)
	page := os.Getpagesize()
	vec := make([]byte, (len(m)+page-1)/page)
	if err := mincore(m, vec); err != nil {
		t.Fatal(err)
	}
	for _, v := range vec {
		resident += int(v & 1)
	}
	return resident, len(vec)
}

// TestWriteFileLeavesNoPages: a written file's pages are dropped once
// synced, so the engine's mapping reads them back (WriteFile says why).
func TestWriteFileLeavesNoPages(t *testing.T) {
	p := writtenFile(t, 4<<20) // 16 MiB of data
	resident, pages := residentPages(t, p)
	// The header's page may be read back by the rename's checks; the
	// tensor data must not stay cached.
	if resident > pages/10 {
		t.Fatalf("%d of %d pages of the written file are still in the page cache", resident, pages)
	}
	t.Logf("%d of %d pages resident after WriteFile", resident, pages)
}

// pmdMappedKB maps the file at p and returns smaps' FilePmdMapped for the
// mapping (kB in 2 MiB entries) and its size in kB.
func pmdMappedKB(t *testing.T, p string) (pmd, size int) {
	t.Helper()
	m := mapFile(t, p)
	defer unix.Munmap(m)
	if err := unix.Madvise(m, unix.MADV_POPULATE_READ); err != nil {
		t.Skipf("MADV_POPULATE_READ: %v", err)
	}
	sm, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Skip(err)
	}
	defer sm.Close()
	start := strconv.FormatUint(uint64(uintptr(unsafe.Pointer(&m[0]))), 16) + "-"
	in := false
	for sc := bufio.NewScanner(sm); sc.Scan(); {
		l := sc.Text()
		if f := strings.Fields(l); len(f) > 0 && strings.Contains(f[0], "-") && !strings.HasSuffix(f[0], ":") {
			in = strings.HasPrefix(l, start)
		}
		if in && strings.HasPrefix(l, "FilePmdMapped:") {
			pmd, _ = strconv.Atoi(strings.Fields(l)[1])
		}
	}
	return pmd, len(m) / 1024
}

// TestWarmPagesReadsInHugeFolios: WarmPages brings a file that is not
// cached (a written shard) into the page cache, reports its progress and
// honours its context; a cached file is left alone. Where the kernel maps
// file pages with 2 MiB entries at all (an ordinary mapping's faults get
// some), every 2 MiB of a warmed file but the first (its header, read
// before as the loader reads it) is mapped with one. The file spans two of
// WarmPages' steps: the ordinary read-ahead, let loose, filled the second
// with small folios.
func TestWarmPagesReadsInHugeFolios(t *testing.T) {
	p := writtenFile(t, (warmStep+8<<20)/4)
	ordinary, size := pmdMappedKB(t, p) // read back by an ordinary mapping
	drop(t, p)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := WarmPages(ctx, p, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("WarmPages with its context done: %v", err)
	}
	if resident, pages := residentPages(t, p); resident > pages/8 {
		t.Fatalf("a cancelled warm-up read %d of %d pages", resident, pages)
	}
	f, err := os.Open(p) // the header, as the loader reads it (and some read-ahead)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.ReadAt(make([]byte, 64<<10), 0); err != nil {
		t.Fatal(err)
	}
	f.Close()
	var reports []float64
	read, err := WarmPages(context.Background(), p, func(d float64) { reports = append(reports, d) })
	if err != nil {
		t.Fatal(err)
	}
	resident, pages := residentPages(t, p)
	if resident != pages || read < int64(pages-pages/8)*int64(os.Getpagesize()) {
		t.Fatalf("after WarmPages %d of %d pages are cached, %d bytes read", resident, pages, read)
	}
	if len(reports) != 2 || reports[1] != 1 {
		t.Errorf("progress reports %v, want two, the last 1", reports)
	}
	if again, err := WarmPages(context.Background(), p, nil); err != nil || again != 0 {
		t.Errorf("WarmPages of a cached file read %d bytes (%v), want 0", again, err)
	}
	warmed, _ := pmdMappedKB(t, p)
	t.Logf("kB of %d mapped with 2 MiB entries: %d read back by an ordinary mapping, %d warmed", size, ordinary, warmed)
	if ordinary == 0 && warmed == 0 {
		t.Logf("this kernel or filesystem maps this file 4 KiB at a time (transparent huge pages: %s)", thpMode())
		return
	}
	if want := (size/2048 - 1) * 2048; warmed < want {
		t.Errorf("%d kB of %d in 2 MiB entries, want at least %d (all but the header's 2 MiB)", warmed, size, want)
	}
}

// drop drops the pages of the file at p from the page cache.
func drop(t *testing.T, p string) {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
	if resident, pages := residentPages(t, p); resident > pages/8 {
		t.Skipf("%d of %d pages stay cached after FADV_DONTNEED", resident, pages)
	}
}

func thpMode() string {
	b, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled")
	if err != nil {
		return err.Error()
	}
	return strings.TrimSpace(string(b))
}
