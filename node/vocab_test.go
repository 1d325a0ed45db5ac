package node

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/internal/testmodels"
	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/vocab"
)

// One peer holds at most one vocabulary transfer at a time, so it cannot
// occupy every slot; other peers are still served.
func TestVocabOneTransferPerPeer(t *testing.T) {
	model := testmodels.Path(t, "stories260K.gguf")
	tn := newTestNet(t)
	srv := tn.shardWith(model, nil, nil)
	fp := srv.Fingerprint()
	hog, honest := tn.client(), tn.client()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pid := hog.Host().ProtocolID(vocab.Proto, vocab.ProtoVersion)
	// The hog opens a transfer and never sends its request: it holds a slot.
	first, err := hog.ControlHost().NewStream(ctx, srv.P2P().ID(), pid)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Reset()
	if _, err := first.Write([]byte{0}); err != nil { // the stream reaches the handler
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	// Its further streams are refused at once …
	for range vocab.MaxTransfers {
		s, err := hog.ControlHost().NewStream(ctx, srv.P2P().ID(), pid)
		if err != nil {
			continue
		}
		_ = frame.NewWriter(s, frame.Limits{}).WriteMessage(nil)
		buf := make([]byte, 1)
		_ = s.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := s.Read(buf); err == nil {
			t.Fatal("a second concurrent transfer to the same peer was served")
		}
		s.Reset()
	}
	// … while another peer gets the vocabulary.
	if _, err := vocab.Fetch(ctx, honest.ControlHost(), srv.P2P().ID(), fp, t.TempDir()); err != nil {
		t.Fatalf("honest peer refused while one peer hogs the service: %v", err)
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
