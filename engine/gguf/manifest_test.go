package gguf

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// A manifest hashes to the model fingerprint, survives a round trip, and a
// shard written from its header plus the tensor data (WithData) is byte for
// byte the shard Split writes.
func TestManifestRoundTripAndShard(t *testing.T) {
	ctx := context.Background()
	for _, arch := range []string{"llama", "qwen3"} { // untied and tied output
		t.Run(arch, func(t *testing.T) {
			p := synthFile(t, tinySpec(arch))
			m, err := BuildManifest(ctx, p, nil)
			if err != nil {
				t.Fatal(err)
			}
			f := mustOpen(t, p)
			fp, err := Fingerprint(ctx, f)
			if err != nil {
				t.Fatal(err)
			}
			if m.Fingerprint() != fp {
				t.Fatalf("manifest fingerprint %s, model %s", m.Fingerprint(), fp)
			}
			m2, err := CheckManifest(m.Marshal(), fp)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(m2.Marshal(), m.Marshal()) {
				t.Fatal("round trip changed the manifest")
			}
			if _, err := CheckManifest(m.Marshal(), "00"+fp[2:]); !errors.Is(err, ErrWrongModel) {
				t.Fatalf("wrong fingerprint: %v", err)
			}
			dir := t.TempDir()
			for _, r := range []Range{{0, 1}, {1, 3}, {3, 4}, {0, 4}} {
				want, err := Split(ctx, p, []Range{r}, filepath.Join(dir, "split"), nil)
				if err != nil {
					t.Fatal(err)
				}
				srcs, err := ShardSources(m2.File, r)
				if err != nil {
					t.Fatal(err)
				}
				for _, s := range srcs {
					if _, ok := f.Tensor(s.Name); !ok {
						t.Fatalf("source %s not in the model", s.Name)
					}
				}
				out := filepath.Join(dir, "fetched.gguf")
				res, err := WriteShard(ctx, m2.File.WithData(f.r), m2.Digests, r, out, nil)
				if err != nil {
					t.Fatal(err)
				}
				a, _ := os.ReadFile(want[0].Path)
				b, _ := os.ReadFile(res.Path)
				if !bytes.Equal(a, b) {
					t.Fatalf("range %v: WriteShard from the manifest differs from Split", r)
				}
				if _, err := CheckShard(ctx, res.Path, fp, r); err != nil {
					t.Fatal(err)
				}
			}
			// Sources: a middle shard needs only its layers (and the other
			// globals), never the embeddings or the output.
			srcs, _ := ShardSources(m2.File, Range{1, 3})
			for _, s := range srcs {
				if s.Name == tokenEmbd || s.Name == output || s.Name == outputNorm {
					t.Fatalf("middle shard sources include %s", s.Name)
				}
			}
			// Data that does not match the manifest is refused.
			bad := make([]byte, f.Size)
			if _, err := f.r.ReadAt(bad, 0); err != nil {
				t.Fatal(err)
			}
			bad[f.DataOffset+int64(f.Tensors[len(f.Tensors)-1].Offset)] ^= 1
			r := Range{0, 4}
			if _, err := WriteShard(ctx, m2.File.WithData(bytes.NewReader(bad)), m2.Digests, r, out(dir), nil); !errors.Is(err, ErrSourceChanged) {
				t.Fatalf("corrupt data: %v", err)
			}
		})
	}
}

func out(dir string) string { return filepath.Join(dir, "x.gguf") }

func TestParseManifestRejects(t *testing.T) {
	p := synthFile(t, tinySpec("llama"))
	m, err := BuildManifest(context.Background(), p, nil)
	if err != nil {
		t.Fatal(err)
	}
	good := m.Marshal()
	hdrEnd := len(manifestMagic) + 16 + len(m.Header)
	mut := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	cases := map[string][]byte{
		"empty":        nil,
		"bad magic":    mut(func(b []byte) []byte { b[0] = 'X'; return b }),
		"truncated":    good[:len(good)-1],
		"extra byte":   append(bytes.Clone(good), 0),
		"huge header":  mut(func(b []byte) []byte { binary.LittleEndian.PutUint64(b[len(manifestMagic)+8:], 1<<40); return b }),
		"short header": mut(func(b []byte) []byte { binary.LittleEndian.PutUint64(b[len(manifestMagic)+8:], 100); return b }),
		"tiny file":    mut(func(b []byte) []byte { binary.LittleEndian.PutUint64(b[len(manifestMagic):], 10); return b }),
		"count":        mut(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[hdrEnd:], 1e6); return b }),
	}
	for name, b := range cases {
		if _, err := ParseManifest(b); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// A changed tensor hash parses (it is a well-formed manifest of some
	// other model) but no longer proves this fingerprint.
	b := mut(func(b []byte) []byte { b[len(b)-1] ^= 1; return b })
	if _, err := CheckManifest(b, m.Fingerprint()); !errors.Is(err, ErrWrongModel) {
		t.Fatalf("flipped hash: %v", err)
	}
}

// FuzzParseManifest: any input is refused or parses into a manifest that
// re-encodes to itself; time and memory stay linear in the input (ReadHeader
// checks counts against the bytes present, not the claimed file size).
func FuzzParseManifest(f *testing.F) {
	// A tiny model (one layer, one tensor, no vocabulary): small seeds keep
	// the fuzzer's minimisation of new inputs short.
	var buf bytes.Buffer
	md := Metadata{{KeyArchitecture, "llama"}, {"llama.block_count", uint32(1)}, {"tokenizer.ggml.model", "llama"}}
	ts := []WriteTensor{{Name: "blk.0.a", Type: TypeF32, Shape: []uint64{4}, Data: bytes.NewReader(make([]byte, 16))},
		{Name: "b", Type: TypeF32, Shape: []uint64{2, 2}, Data: bytes.NewReader(make([]byte, 16))}}
	if err := Write(context.Background(), &buf, md, ts, nil); err != nil {
		f.Fatal(err)
	}
	g, err := Read(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
	if err != nil {
		f.Fatal(err)
	}
	dg, err := ComputeDigests(context.Background(), g, nil)
	if err != nil {
		f.Fatal(err)
	}
	m, err := NewManifest(g, buf.Bytes()[:g.HeaderSize], dg)
	if err != nil {
		f.Fatal(err)
	}
	good := m.Marshal()
	f.Add(good)
	f.Add(good[:len(good)/2])
	// A header claiming a huge file and huge counts, with few bytes present.
	hb := []byte(manifestMagic)
	hb = binary.LittleEndian.AppendUint64(hb, 1<<49)
	h := header(1<<40, 1<<40).b
	hb = binary.LittleEndian.AppendUint64(hb, uint64(len(h)))
	f.Add(append(hb, h...))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseManifest(b)
		if err != nil {
			if m != nil || !errors.Is(err, ErrManifest) {
				t.Fatalf("error %v with manifest %v", err, m)
			}
			return
		}
		if !bytes.Equal(m.Marshal(), b) {
			t.Fatal("manifest does not re-encode to its input")
		}
		_ = sha256.Sum256(m.Header)
	})
}
