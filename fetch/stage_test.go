package fetch

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"testing"

	"github.com/neuron-tai/meshp2p/engine/gguf"
)

// Put stages bytes the caller holds only when they hash to the digest.
func TestStagePut(t *testing.T) {
	st := &Stage{Dir: t.TempDir()}
	data := bytes.Repeat([]byte("tensor"), 1000)
	h := gguf.Digest(sha256.Sum256(data))
	bad := bytes.Clone(data)
	bad[10] ^= 1
	if err := st.Put(h, int64(len(bad)), bytes.NewReader(bad)); !errors.Is(err, ErrBadData) {
		t.Fatalf("bad bytes: %v, want ErrBadData", err)
	}
	if st.Have(h, int64(len(data))) || st.Partial(h) != 0 {
		t.Fatal("bad bytes were staged")
	}
	if err := st.Put(h, int64(len(data)), bytes.NewReader(data[:100])); err == nil || st.Have(h, int64(len(data))) {
		t.Fatalf("a short copy: %v", err)
	}
	if err := st.Put(h, int64(len(data)), bytes.NewReader(data)); err != nil || !st.Have(h, int64(len(data))) {
		t.Fatalf("good bytes: %v", err)
	}
}
