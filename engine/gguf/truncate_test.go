package gguf

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/neuron-tai/meshp2p/internal/testmodels"
)

func TestTruncate(t *testing.T) {
	src := testmodels.Path(t, "stories260K.gguf")
	dir := t.TempDir()
	res, err := Truncate(context.Background(), src, 2, filepath.Join(dir, TruncateName(src, 2)))
	if err != nil {
		t.Fatal(err)
	}
	f, err := Open(res.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if n, _ := f.NLayer(); n != 2 {
		t.Fatalf("%d layers, want 2", n)
	}
	for _, name := range []string{tokenEmbd, outputNorm, output, "blk.1.attn_q.weight"} {
		if _, ok := f.Tensor(name); !ok {
			t.Errorf("truncated model lacks %s", name)
		}
	}
	if _, ok := f.Tensor("blk.2.attn_q.weight"); ok {
		t.Error("truncated model keeps layer 2")
	}
	if _, ok := f.Metadata.Get(KeyParentFingerprint); ok {
		t.Error("truncated model claims to be a shard")
	}
	whole, err := Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer whole.Close()
	a, err1 := VocabDigest(whole)
	b, err2 := VocabDigest(f)
	if err1 != nil || err2 != nil || a != b {
		t.Fatalf("vocabulary digests %v %v (%v, %v) differ", a, b, err1, err2)
	}
	// A shard's vocabulary digest is its parent's.
	sh, err := Split(context.Background(), src, []Range{{0, 2}, {2, 5}}, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sh {
		sf, err := Open(s.Path)
		if err != nil {
			t.Fatal(err)
		}
		d, err := VocabDigest(sf)
		sf.Close()
		if err != nil || d != a {
			t.Fatalf("shard %v: vocabulary digest %v (%v), want %v", s.Range, d, err, a)
		}
	}
	for _, k := range []int{0, 5, 9} {
		if _, err := Truncate(context.Background(), src, k, filepath.Join(dir, "bad.gguf")); !errors.Is(err, ErrBadRange) {
			t.Errorf("truncate to %d layers: %v, want ErrBadRange", k, err)
		}
	}
	if _, err := Truncate(context.Background(), sh[0].Path, 1, filepath.Join(dir, "bad.gguf")); !errors.Is(err, ErrIsShard) {
		t.Errorf("truncating a shard: %v, want ErrIsShard", err)
	}
}
