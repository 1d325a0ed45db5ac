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
	"strconv"

	"github.com/neuron-tai/meshp2p/engine/gguf"
)

// progressWriter counts what passes through.
type progressWriter struct {
	w io.Writer
	p *Progress
}

func (pw progressWriter) Write(b []byte) (int, error) {
	n, err := pw.w.Write(b)
	pw.p.add(int64(n))
	return n, err
}

// FetchTensors downloads the tensors ts of manifest m (whose header must be
// the file's: the caller compares them) by range requests into st, each
// resumed from what a previous attempt staged and checked against its hash.
func (u *URL) FetchTensors(ctx context.Context, st *Stage, m *gguf.Manifest, ts []*gguf.TensorInfo, p *Progress) error {
	for _, t := range ts {
		h := m.DataHash(t)
		if st.Have(h, int64(t.Bytes)) {
			p.skip(int64(t.Bytes))
			continue
		}
		part, err := st.open(h, int64(t.Bytes), true)
		if err != nil {
			return err
		}
		p.skip(part.n)
		if !part.complete() {
			err = u.get(ctx, m.File.DataOffset+int64(t.Offset)+part.n, int64(t.Bytes)-part.n, progressWriter{part, p})
			if err != nil {
				part.close()
				return err
			}
		}
		if err := part.finish(); err != nil {
			if errors.Is(err, ErrBadData) {
				return fmt.Errorf("fetch: %s: tensor %q does not match the swarm's manifest of this model: %w", u.URL, t.Name, err)
			}
			return err
		}
	}
	return nil
}

// StreamAll is the first node of a model: no peer has a manifest, so it
// streams the whole data section once (one resumable range request),
// hashing every tensor to compute the manifest and fingerprint, and keeps
// on disk (in st) only the tensors keep selects.
func (u *URL) StreamAll(ctx context.Context, st *Stage, f *gguf.File, hdr []byte, keep func(*gguf.TensorInfo) bool, p *Progress) (*gguf.Manifest, error) {
	if err := os.MkdirAll(st.Dir, 0o755); err != nil {
		return nil, err
	}
	d := &demux{f: f, st: st, keep: keep, hashes: make([]gguf.Digest, len(f.Tensors))}
	defer d.abort()
	end := u.size
	if len(f.Tensors) > 0 {
		last := f.Tensors[len(f.Tensors)-1]
		end = f.DataOffset + int64(last.Offset+last.Bytes)
	}
	if err := u.get(ctx, f.DataOffset, end-f.DataOffset, progressWriter{d, p}); err != nil {
		return nil, err
	}
	if d.i != len(f.Tensors) {
		return nil, fmt.Errorf("fetch: %s: stream ended in tensor %d of %d", u.URL, d.i, len(f.Tensors))
	}
	dg, err := gguf.DigestsFromHashes(f, d.hashes)
	if err != nil {
		return nil, err
	}
	return gguf.NewManifest(f, hdr, dg)
}

// demux splits the data section stream into tensors (file order is offset
// order: the reader requires packed, increasing offsets).
type demux struct {
	f      *gguf.File
	st     *Stage
	keep   func(*gguf.TensorInfo) bool
	hashes []gguf.Digest
	pos    int64 // relative to DataOffset
	i      int   // current tensor
	h      hash.Hash
	out    *os.File
}

func (d *demux) Write(b []byte) (int, error) {
	n := len(b)
	for len(b) > 0 && d.i < len(d.f.Tensors) {
		t := &d.f.Tensors[d.i]
		if d.pos < int64(t.Offset) { // padding
			k := min(int64(len(b)), int64(t.Offset)-d.pos)
			b, d.pos = b[k:], d.pos+k
			continue
		}
		if d.h == nil {
			d.h = sha256.New()
			if d.keep(t) {
				var err error
				if d.out, err = os.Create(filepath.Join(d.st.Dir, "stream-"+strconv.Itoa(d.i)+".tmp")); err != nil {
					return 0, err
				}
			}
		}
		k := min(int64(len(b)), int64(t.Offset+t.Bytes)-d.pos)
		d.h.Write(b[:k])
		if d.out != nil {
			if _, err := d.out.Write(b[:k]); err != nil {
				return 0, err
			}
		}
		b, d.pos = b[k:], d.pos+k
		if d.pos == int64(t.Offset+t.Bytes) {
			d.hashes[d.i] = gguf.Digest(d.h.Sum(nil))
			if d.out != nil {
				if err := d.out.Close(); err != nil {
					return 0, err
				}
				if err := os.Rename(d.out.Name(), d.st.path(d.hashes[d.i])); err != nil {
					return 0, err
				}
				d.out = nil
			}
			d.h = nil
			d.i++
		}
	}
	return n, nil
}

func (d *demux) abort() {
	if d.out != nil {
		d.out.Close()
		_ = os.Remove(d.out.Name())
	}
}
