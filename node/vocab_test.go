package node

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/neuron-tai/meshp2p/client"
	"github.com/neuron-tai/meshp2p/client/enginevocab"
	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/internal/testmodels"
	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/vocab"
)

// Issue 21, attack 5: four identities each holding idle vocabulary
// streams to a node (nothing sent, or half a request) take no transfer
// slot, so a thin client still gets the vocabulary at once.
func TestVocabStarvationFourIdentities(t *testing.T) {
	model := testmodels.Path(t, "stories260K.gguf")
	tn := newTestNet(t)
	srv := tn.shardWith(model, nil, nil)
	fp := srv.Fingerprint()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var req bytes.Buffer
	if err := frame.NewWriter(&req, frame.Limits{}).WriteMessage(&meshp2pb.VocabRequest{ModelFingerprint: fp}); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		hog := tn.client()
		pid := hog.host.ProtocolID(vocab.Proto, vocab.ProtoVersion)
		for _, b := range [][]byte{{0}, req.Bytes()[:req.Len()/2]} {
			s, err := hog.ControlHost().NewStream(ctx, srv.P2P().ID(), pid)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Reset()
			if _, err := s.Write(b); err != nil { // the stream reaches the handler
				t.Fatal(err)
			}
		}
	}
	time.Sleep(200 * time.Millisecond)
	c := tn.client()
	waitModel(t, c, "stories260K")
	cl, err := client.New(client.Config{Swarm: c.P2P(), Host: c.ControlHost(), Table: c.Table(),
		LoadVocab: enginevocab.Load, VocabDir: t.TempDir(), Logger: c.log})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	t0 := time.Now()
	v, err := cl.Vocab(ctx, fp)
	if err != nil {
		t.Fatalf("thin client refused while four identities hold idle vocabulary streams: %v", err)
	}
	took := time.Since(t0)
	t.Logf("vocabulary fetched in %s", took)
	if took >= vocab.RequestTimeout {
		t.Fatalf("the fetch took %s: it waited for the idle streams", took)
	}
	if toks, err := v.Tokenize("Once upon a time", true, false); err != nil || len(toks) < 2 {
		t.Fatalf("tokens %v, %v", toks, err)
	}
}

// A cached vocabulary that no longer matches the model is rewritten at
// start, never served.
func TestCachedVocabIsChecked(t *testing.T) {
	model := testmodels.Path(t, "stories260K.gguf")
	tn := newTestNet(t)
	dir := t.TempDir()
	start := func() *Node {
		cfg := tn.config(dir)
		cfg.ModelPath = model
		n, err := Start(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	n := start()
	fp := n.Fingerprint()
	n.Close()
	vp := filepath.Join(dir, "shards", fp[:16], "vocab.gguf")
	if err := os.WriteFile(vp, []byte("GGUF not really"), 0o600); err != nil {
		t.Fatal(err)
	}
	n = start()
	defer n.Close()
	if err := gguf.CheckVocab(context.Background(), vp, fp); err != nil {
		t.Fatalf("corrupt cached vocabulary kept: %v", err)
	}
}
