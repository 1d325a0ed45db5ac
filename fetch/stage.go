package fetch

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"sort"
	"sync"

	"github.com/neuron-tai/meshp2p/engine/gguf"
)

// ErrBadData means downloaded bytes do not hash to the manifest's digest.
var ErrBadData = errors.New("tensor data does not match the manifest")

// Stage is a directory of tensors under download or verified, named by the
// sha256 of their data: "<hex>" once verified (renamed into place only
// then), "<hex>.part" while arriving. A crashed fetch resumes from what is
// there: verified tensors are not fetched again, and a partial one
// continues from its last byte.
type Stage struct {
	Dir string
}

func (s *Stage) path(h gguf.Digest) string { return filepath.Join(s.Dir, h.String()) }

// Have reports whether the verified tensor h of size bytes is staged.
func (s *Stage) Have(h gguf.Digest, size int64) bool {
	st, err := os.Stat(s.path(h))
	return err == nil && st.Mode().IsRegular() && st.Size() == size
}

// Partial returns how many bytes of tensor h a previous attempt left.
func (s *Stage) Partial(h gguf.Digest) int64 {
	st, err := os.Stat(s.path(h) + ".part")
	if err != nil {
		return 0
	}
	return st.Size()
}

// Remove deletes the staging directory (after the shard is written).
func (s *Stage) Remove() error { return os.RemoveAll(s.Dir) }

// Put stages tensor h of size bytes from r (a copy the caller already
// holds, such as a shard file's), checked like a download: bytes that do
// not hash to h are not staged (ErrBadData).
func (s *Stage) Put(h gguf.Digest, size int64, r io.Reader) error {
	if s.Have(h, size) {
		return nil
	}
	p, err := s.open(h, size, false)
	if err != nil {
		return err
	}
	if _, err := io.CopyN(p, r, size); err != nil {
		p.discard()
		return err
	}
	return p.finish()
}

// partial is one tensor being written: appended to "<hex>.part", hashed as
// it arrives, renamed to "<hex>" when complete and matching.
type partial struct {
	s    *Stage
	want gguf.Digest
	size int64
	f    *os.File
	h    hash.Hash
	n    int64
}

// open starts or continues tensor want of size bytes; from is where the
// next byte goes (what a previous attempt left, re-hashed here; more than
// size, or resume false, starts over).
func (s *Stage) open(want gguf.Digest, size int64, resume bool) (*partial, error) {
	if err := os.MkdirAll(s.Dir, 0o755); err != nil {
		return nil, err
	}
	p := &partial{s: s, want: want, size: size, h: sha256.New()}
	name := s.path(want) + ".part"
	flag := os.O_RDWR | os.O_CREATE
	if !resume {
		flag |= os.O_TRUNC
	}
	f, err := os.OpenFile(name, flag, 0o644)
	if err != nil {
		return nil, err
	}
	p.f = f
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if st.Size() > size {
		if err := f.Truncate(0); err != nil {
			f.Close()
			return nil, err
		}
	} else if st.Size() > 0 {
		if _, err := io.Copy(p.h, io.LimitReader(f, st.Size())); err != nil {
			f.Close()
			return nil, err
		}
		p.n = st.Size()
	}
	if _, err := f.Seek(p.n, io.SeekStart); err != nil {
		f.Close()
		return nil, err
	}
	return p, nil
}

// complete reports whether every byte is there (a previous attempt was
// stopped after the last byte but before finish): nothing is left to ask
// a source for, and asking for zero bytes is an error to an HTTP server
// (416) and a wasted request to a peer.
func (p *partial) complete() bool { return p.n == p.size }

// Write appends tensor bytes; more than the tensor's size is an error.
func (p *partial) Write(b []byte) (int, error) {
	if p.n+int64(len(b)) > p.size {
		return 0, fmt.Errorf("%w: more than the tensor's %d bytes", ErrBadData, p.size)
	}
	n, err := p.f.Write(b)
	p.h.Write(b[:n])
	p.n += int64(n)
	return n, err
}

// finish checks the complete tensor and moves it into place. On a hash
// mismatch the partial file is removed (ErrBadData).
func (p *partial) finish() error {
	defer p.f.Close()
	if p.n != p.size {
		return fmt.Errorf("fetch: tensor %s: %d of %d bytes", p.want.String()[:16], p.n, p.size)
	}
	if got := gguf.Digest(p.h.Sum(nil)); got != p.want {
		p.f.Close()
		_ = os.Remove(p.f.Name())
		return fmt.Errorf("%w: sha256 %s, want %s", ErrBadData, got.String()[:16], p.want.String()[:16])
	}
	if err := p.f.Close(); err != nil {
		return err
	}
	return os.Rename(p.f.Name(), p.s.path(p.want))
}

// discard drops the partial data (a source that sent bad bytes).
func (p *partial) discard() {
	p.f.Close()
	_ = os.Remove(p.f.Name())
}

// close keeps what arrived for a later resume.
func (p *partial) close() { p.f.Close() }

// reader reads the file offsets of manifest m's tensors from staged files,
// for gguf.File.WithData: WriteShard then copies verified data only.
type reader struct {
	s     *Stage
	m     *gguf.Manifest
	order []int // tensor indexes sorted by data offset
	mu    sync.Mutex
	open  map[gguf.Digest]*os.File
}

func (s *Stage) reader(m *gguf.Manifest) *reader {
	r := &reader{s: s, m: m, open: map[gguf.Digest]*os.File{}}
	for i := range m.File.Tensors {
		r.order = append(r.order, i)
	}
	ts := m.File.Tensors
	sort.Slice(r.order, func(i, j int) bool { return ts[r.order[i]].Offset < ts[r.order[j]].Offset })
	return r
}

func (r *reader) ReadAt(p []byte, off int64) (int, error) {
	ts := r.m.File.Tensors
	rel := off - r.m.File.DataOffset
	i := sort.Search(len(r.order), func(i int) bool { t := &ts[r.order[i]]; return int64(t.Offset+t.Bytes) > rel })
	if i == len(r.order) || rel < int64(ts[r.order[i]].Offset) {
		return 0, fmt.Errorf("fetch: no staged tensor at file offset %d", off)
	}
	t := &ts[r.order[i]]
	h := r.m.DataHash(t)
	r.mu.Lock()
	f := r.open[h]
	if f == nil {
		var err error
		if f, err = os.Open(r.s.path(h)); err != nil {
			r.mu.Unlock()
			return 0, fmt.Errorf("fetch: tensor %q is not staged: %w", t.Name, err)
		}
		r.open[h] = f
	}
	r.mu.Unlock()
	in := rel - int64(t.Offset)
	n := min(int64(len(p)), int64(t.Bytes)-in)
	return f.ReadAt(p[:n], in)
}

func (r *reader) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, f := range r.open {
		f.Close()
	}
}

// Assemble writes the shard of layers rg from manifest m and the staged
// tensors (all of gguf.ShardSources must be staged) with gguf.WriteShard,
// so the file is the one `shard split` writes from the whole model.
func (s *Stage) Assemble(ctx context.Context, m *gguf.Manifest, rg gguf.Range, path string) (gguf.SplitResult, error) {
	r := s.reader(m)
	defer r.close()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return gguf.SplitResult{}, err
	}
	return gguf.WriteShard(ctx, m.File.WithData(r), m.Digests, rg, path, nil)
}

func sha256Of(b []byte) []byte { h := sha256.Sum256(b); return h[:] }
