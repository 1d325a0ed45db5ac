package node

import (
	"context"
	"crypto/rand"
	"slices"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/fetch"
	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/route"
	"github.com/neuron-tai/meshp2p/session"
	"github.com/neuron-tai/meshp2p/vocab"
)

// servedBy is what node n serves of model fp as peer c finds it, one
// registry each: the vocabulary (vocab.Service), the manifest and tensor
// (fetch.Server), a session on all nl layers (the hop service's engines)
// and the advert (served.describe, and c's table once re-synced).
type servedBy struct {
	vocab, manifest, tensor, session, advert, table bool
}

// servedOf reports what n serves of model fp (nl layers; tensor: a tensor
// of it that n holds) to c; whole: n holds all its layers if any (else
// no session is tried).
func servedOf(t *testing.T, c, n *Node, fp string, nl int, tensor string, whole bool) servedBy {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var s servedBy
	id := n.P2P().ID()
	_, err := vocab.Fetch(ctx, c.ControlHost(), id, fp, t.TempDir())
	s.vocab = err == nil
	_, _, err = fetch.FetchManifest(ctx, c.ControlHost(), []peer.ID{id}, fp, nil, c.log)
	s.manifest = err == nil
	s.tensor = tensorServed(ctx, t, c, id, fp, tensor)
	if whole {
		s.session = sessionServed(ctx, t, c, id, fp, nl)
	}
	var ca meshp2pb.CapabilityAdvert
	keys := n.set.describe(&ca, n.place)
	s.advert = slices.Contains(keys, fp) || slices.ContainsFunc(ca.Shards, func(sa *meshp2pb.ShardAdvert) bool { return sa.ModelFingerprint == fp })
	c.P2P().Discovery().Sync(ctx)
	s.table = slices.ContainsFunc(c.Table().Shards(fp), func(sh route.Shard) bool { return sh.Peer == id })
	return s
}

// sessionServed opens a session of model fp on all its nl layers at peer
// p and reports whether p admitted it; a refusal must say the model is not
// served there (MODEL_MISMATCH) or its layers were just moved away from
// (NO_CAPACITY, which origins retry elsewhere).
func sessionServed(ctx context.Context, t *testing.T, c *Node, p peer.ID, fp string, nl int) bool {
	t.Helper()
	st, err := c.host.NewStream(ctx, p, c.host.ProtocolID(session.ProtoSession, session.ProtoVersion))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	sid := make([]byte, 16)
	_, _ = rand.Read(sid)
	o := &meshp2pb.SessionOpen{SessionId: sid, Epoch: 1, ModelFingerprint: fp, NCtxNeeded: 16,
		Route: &meshp2pb.Route{ModelFingerprint: fp, NLayer: uint32(nl), Epoch: 1, Hops: []*meshp2pb.RouteHop{{PeerId: []byte(p), Start: 0, End: uint32(nl)}}}}
	signOpen(t, c, o)
	if err := frame.NewWriter(st, frame.Limits{}).WriteStream(&meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Open{Open: o}}); err != nil {
		t.Fatal(err)
	}
	msg, _, err := frame.NewReader(st, frame.Limits{}).ReadStream()
	if err != nil {
		t.Fatal(err)
	}
	acc := msg.GetAccept()
	if code := acc.GetError().GetCode(); !acc.GetOk() && code != meshp2pb.ErrorCode_ERROR_CODE_MODEL_MISMATCH && code != meshp2pb.ErrorCode_ERROR_CODE_NO_CAPACITY {
		t.Errorf("a session of %.16s at %s was refused otherwise than as a model not served there: %v", fp, p, msg)
	}
	return acc.GetOk()
}

// tensorServed asks peer p for zero bytes of tensor name of model fp.
func tensorServed(ctx context.Context, t *testing.T, c *Node, p peer.ID, fp, name string) bool {
	t.Helper()
	st, err := c.ControlHost().NewStream(ctx, p, c.host.ProtocolID(fetch.ProtoTensor, fetch.ProtoVersion))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := frame.NewWriter(st, frame.Limits{}).WriteMessage(&meshp2pb.TensorRequest{ModelFingerprint: fp, Name: name}); err != nil {
		t.Fatal(err)
	}
	var resp meshp2pb.TensorResponse
	if err := frame.NewReader(st, frame.Limits{}).ReadMessage(&resp); err != nil {
		t.Fatal(err)
	}
	return resp.GetError() == nil
}

// firstTensor is the name of the first tensor of the GGUF file at path.
func firstTensor(t *testing.T, path string) string {
	t.Helper()
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	return f.Tensors[0].Name
}

// The served set owns what a node serves: adding a model (an extra here)
// registers it everywhere (vocabulary, manifest and tensors, hop engine,
// advert) in one call, and releasing it leaves it in none; the own model
// stays served throughout.
func TestReleaseLeavesNothingServed(t *testing.T) {
	a, b := synthModel(t, "release-a", 4), synthModel(t, "release-b", 3)
	tn := newTestNet(t)
	cfg := tn.config(t.TempDir())
	cfg.ModelPath, cfg.Models = a, []string{b}
	cfg.Placement = &PlacementConfig{Memory: wholeNeed(t, tn, a) + wholeNeed(t, tn, b) + 1<<20, Interval: time.Hour, Seed: 1}
	n, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	tn.boot = []peer.AddrInfo{n.P2P().AddrInfo()}
	c := tn.client()
	waitModel(t, c, "release-a")
	fpA, nlA := n.set.now().fp, n.set.now().nLayer
	mB := n.set.catalog[1]
	tensorA, tensorB := firstTensor(t, n.set.now().path), firstTensor(t, b)
	ownServed := func(when string) {
		if s := servedOf(t, c, n, fpA, nlA, tensorA, false); !s.vocab || !s.manifest || !s.tensor || !s.advert {
			t.Fatalf("%s, the own model is not served everywhere: %+v", when, s)
		}
	}
	ownServed("before the extra")

	// Nothing changes the served set but this test: the node has no
	// demand, so its placement loads and releases no extra itself.
	if err := n.set.addExtra(context.Background(), mB); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		s := servedOf(t, c, n, mB.fp, mB.nLayer, tensorB, true)
		if s == (servedBy{true, true, true, true, true, true}) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("an added extra is not served everywhere: %+v", s)
		}
	}
	if !slices.Equal(n.Info().AlsoServes, []string{"release-b"}) {
		t.Fatalf("node info after adding the extra: %+v", n.Info())
	}

	if ended := n.set.releaseExtra(context.Background(), mB.fp); ended != 0 {
		t.Fatalf("releasing an idle extra ended %d sessions", ended)
	}
	// The registries change within the call; the client's table follows
	// the re-published advert.
	s := servedOf(t, c, n, mB.fp, mB.nLayer, tensorB, true)
	if s.vocab || s.manifest || s.tensor || s.session || s.advert {
		t.Fatalf("a released extra is still served: %+v", s)
	}
	for deadline := time.Now().Add(10 * time.Second); s.table; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the client's table still has the released extra from the node: %+v", c.Table().Shards(mB.fp))
		}
		c.P2P().Discovery().Sync(context.Background())
		s.table = slices.ContainsFunc(c.Table().Shards(mB.fp), func(sh route.Shard) bool { return sh.Peer == n.P2P().ID() })
	}
	if len(n.Info().AlsoServes) != 0 {
		t.Fatalf("node info after releasing the extra: %+v", n.Info())
	}
	ownServed("after the extra's release")
}
