package fetch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

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
// on disk (in st) only the tensors keep selects. The pass resumes after a
// crash: a journal in st records every tensor hashed, and the next pass
// starts at the first tensor it lacks (or the first kept one no longer
// staged), so the file is read once in all.
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
	jn := &journal{path: filepath.Join(st.Dir, journalName), ident: u.identity()}
	d.i = jn.load(f, st, keep, d.hashes)
	if d.i < len(f.Tensors) {
		d.pos = int64(f.Tensors[d.i].Offset)
	} else {
		d.pos = end - f.DataOffset
	}
	if d.i > 0 && u.Log != nil {
		u.Log.Info("resuming the streaming pass", "url", u.URL, "tensors_done", d.i, "of", len(f.Tensors), "from_byte", f.DataOffset+d.pos)
	}
	p.skip(d.pos)
	if err := jn.open(d.hashes[:d.i]); err != nil {
		return nil, err
	}
	defer jn.close()
	d.done = jn.add
	if rest := end - f.DataOffset - d.pos; rest > 0 {
		if err := u.get(ctx, f.DataOffset+d.pos, rest, progressWriter{d, p}); err != nil {
			return nil, err
		}
	}
	if d.i != len(f.Tensors) {
		return nil, fmt.Errorf("fetch: %s: stream ended in tensor %d of %d", u.URL, d.i, len(f.Tensors))
	}
	dg, err := gguf.DigestsFromHashes(f, d.hashes)
	if err != nil {
		return nil, err
	}
	m, err := gguf.NewManifest(f, hdr, dg)
	if err != nil {
		return nil, err
	}
	jn.close()
	_ = os.Remove(jn.path)
	return m, nil
}

// journalName is the streaming pass's journal in its stage directory
// (which is per file header).
const journalName = "stream.journal"

// identity names the file the server holds now: its size and validator.
func (u *URL) identity() string {
	return fmt.Sprintf("meshp2p-stream 1 %d %s", u.size, strconv.Quote(u.validator))
}

// journal lists the tensors a streaming pass has hashed: a first line
// with the file's identity, then one line "<index> <sha256 hex>" per
// tensor in file order.
type journal struct {
	path, ident string
	w           *os.File
}

// load fills hashes from a journal of the same file and returns how many
// leading tensors need not be streamed again: it stops at a line it cannot
// parse (a crash mid-write), and at a kept tensor st no longer holds.
func (j *journal) load(f *gguf.File, st *Stage, keep func(*gguf.TensorInfo) bool, hashes []gguf.Digest) int {
	b, err := os.ReadFile(j.path)
	if err != nil {
		return 0
	}
	lines := strings.Split(string(b), "\n")
	if len(lines) < 2 || lines[0] != j.ident {
		return 0 // another file, or the server's copy changed
	}
	n := 0
	for _, ln := range lines[1:] {
		idx, hx, ok := strings.Cut(ln, " ")
		if !ok || idx != strconv.Itoa(n) || n >= len(f.Tensors) || len(hx) != 2*len(gguf.Digest{}) {
			break
		}
		raw, err := hex.DecodeString(hx)
		if err != nil {
			break
		}
		t := &f.Tensors[n]
		h := gguf.Digest(raw)
		if keep(t) && !st.Have(h, int64(t.Bytes)) {
			break
		}
		hashes[n] = h
		n++
	}
	return n
}

// open rewrites the journal with the hashes kept and leaves it open for
// add.
func (j *journal) open(done []gguf.Digest) error {
	var sb strings.Builder
	sb.WriteString(j.ident + "\n")
	for i, h := range done {
		fmt.Fprintf(&sb, "%d %x\n", i, h[:])
	}
	tmp := j.path + ".tmp"
	if err := os.WriteFile(tmp, []byte(sb.String()), 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, j.path); err != nil {
		return err
	}
	var err error
	j.w, err = os.OpenFile(j.path, os.O_WRONLY|os.O_APPEND, 0)
	return err
}

// add records tensor i as hashed (its kept data already staged).
func (j *journal) add(i int, h gguf.Digest) error {
	_, err := fmt.Fprintf(j.w, "%d %x\n", i, h[:])
	return err
}

func (j *journal) close() {
	if j.w != nil {
		_ = j.w.Close()
		j.w = nil
	}
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
	done   func(i int, h gguf.Digest) error // after each tensor (nil: none)
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
			if d.done != nil {
				if err := d.done(d.i, d.hashes[d.i]); err != nil {
					return 0, err
				}
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
