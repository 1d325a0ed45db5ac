package node

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/engine"
	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/internal/testmodels"
	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/route"
	"github.com/neuron-tai/meshp2p/session"
)

// Several sessions at once share each hop's batch and each still gets the
// whole model's answer.
func TestConcurrentSessionsThroughSwarm(t *testing.T) {
	model := testmodels.Path(t, "stories260K.gguf")
	tn := newTestNet(t)
	var nodes []*Node
	for _, r := range gguf.EvenSplit(5, 3) {
		nodes = append(nodes, tn.shard(model, r))
	}
	c := tn.client()
	fp, nl := waitModel(t, c, "stories260K")
	prompts := [][]int32{{1, 403, 407}, {1, 76, 91, 32, 44}, {1, 300, 301, 302, 303, 304}, {1, 17}}
	const maxTok = 16
	var wg sync.WaitGroup
	got := make([]*session.Result, len(prompts))
	errs := make([]error, len(prompts))
	for i, p := range prompts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i], errs[i] = c.Origin(nil).Generate(context.Background(), session.GenerateRequest{Fingerprint: fp, NLayer: nl, Prompt: p, MaxTokens: maxTok})
		}()
	}
	wg.Wait()
	for i, p := range prompts {
		if errs[i] != nil {
			t.Fatalf("session %d: %v", i, errs[i])
		}
		// Interleaved KV cells change float rounding (engine tests); tokens
		// of this trained model stay identical.
		if want := localTokens(t, model, p, maxTok); !equalTokens(got[i].Tokens, want) {
			t.Fatalf("session %d: swarm %v local %v", i, got[i].Tokens, want)
		}
	}
	assertReleased(t, tn, nodes...)
	for _, n := range nodes {
		if c := n.Shard().Capacity(); c.FreeSessions != c.MaxSessions {
			t.Fatalf("engine slots not returned: %+v", c)
		}
	}
}

// A client that vanishes mid-generation leaves nothing behind on any hop.
func TestClientDisconnectReleasesSessions(t *testing.T) {
	model := testmodels.Path(t, "stories260K.gguf")
	tn := newTestNet(t)
	var nodes []*Node
	for _, r := range gguf.EvenSplit(5, 3) {
		nodes = append(nodes, tn.shard(model, r))
	}
	c := tn.client()
	fp, nl := waitModel(t, c, "stories260K")
	ctx, cancel := context.WithCancel(context.Background())
	n := 0
	_, err := c.Origin(nil).Generate(ctx, session.GenerateRequest{Fingerprint: fp, NLayer: nl, Prompt: []int32{1, 2, 3}, MaxTokens: 500,
		OnToken: func(int32) bool {
			if n++; n == 3 {
				cancel()
			}
			return false
		}})
	if err == nil {
		t.Fatal("cancelled generation returned no error")
	}
	assertReleased(t, tn, nodes...)
}

// A session whose origin opens it and then goes silent is freed after the
// idle timeout on the hop.
func TestIdleSessionFreed(t *testing.T) {
	model := testmodels.Path(t, "stories260K.gguf")
	tn := newTestNet(t)
	whole := tn.shardWith(model, nil, func(c *Config) { c.Hop.Idle = 500 * time.Millisecond })
	c := tn.client()
	fp, nl := waitModel(t, c, "stories260K")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := c.host.NewStream(ctx, whole.P2P().ID(), c.host.ProtocolID(session.ProtoSession, session.ProtoVersion))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sid := make([]byte, 16)
	_, _ = rand.Read(sid)
	open := &meshp2pb.SessionOpen{SessionId: sid, Epoch: 1, ModelFingerprint: fp, NCtxNeeded: 64,
		Route: &meshp2pb.Route{ModelFingerprint: fp, NLayer: uint32(nl), Epoch: 1, Hops: []*meshp2pb.RouteHop{{PeerId: []byte(whole.P2P().ID()), Start: 0, End: uint32(nl)}}}}
	signOpen(t, c, open)
	w, r := frame.NewWriter(s, frame.Limits{}), frame.NewReader(s, frame.Limits{})
	if err := w.WriteStream(&meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Open{Open: open}}); err != nil {
		t.Fatal(err)
	}
	msg, _, err := r.ReadStream()
	if err != nil || !msg.GetAccept().GetOk() {
		t.Fatalf("accept: %v %v", msg, err)
	}
	if whole.Hop().Sessions() != 1 {
		t.Fatalf("sessions %d, want 1", whole.Hop().Sessions())
	}
	// Silence: the hop must time the session out and say so.
	_ = s.SetReadDeadline(time.Now().Add(5 * time.Second))
	msg, _, err = r.ReadStream()
	if err != nil || msg.GetError().GetCode() != meshp2pb.ErrorCode_ERROR_CODE_TIMEOUT {
		t.Fatalf("want TIMEOUT error, got %v %v", msg, err)
	}
	assertReleased(t, tn, whole)
}

// Malformed and oversized frames reset that stream only; the node keeps
// serving everyone else.
func TestMalformedFramesDoNotHurtOthers(t *testing.T) {
	model := testmodels.Path(t, "stories260K.gguf")
	tn := newTestNet(t)
	a := tn.shard(model, gguf.Range{Start: 0, End: 3})
	b := tn.shard(model, gguf.Range{Start: 3, End: 5})
	c := tn.client()
	fp, nl := waitModel(t, c, "stories260K")
	bad := [][]byte{
		[]byte("garbage that is not a frame at all"),
		{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0},          // header length over the limit
		{0, 0, 0, 4, 0xff, 0xff, 0xff, 0xff, 1, 2, 3}, // payload over the limit
		{0, 0, 0, 3, 0, 0, 0, 0, 0x0a, 0x05, 0x01},    // protobuf that does not parse
		{0, 0, 0, 2, 0, 0, 0, 0, 0x1a, 0x00},          // a SessionClose before any SessionOpen
	}
	want := []meshp2pb.ErrorCode{
		meshp2pb.ErrorCode_ERROR_CODE_FRAME_TOO_LARGE, meshp2pb.ErrorCode_ERROR_CODE_FRAME_TOO_LARGE,
		meshp2pb.ErrorCode_ERROR_CODE_FRAME_TOO_LARGE, meshp2pb.ErrorCode_ERROR_CODE_MALFORMED,
		meshp2pb.ErrorCode_ERROR_CODE_UNEXPECTED_MESSAGE,
	}
	for _, target := range []*Node{a, b} {
		for i, frameBytes := range bad {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			s, err := c.host.NewStream(ctx, target.P2P().ID(), c.host.ProtocolID(session.ProtoSession, session.ProtoVersion))
			if err != nil {
				cancel()
				t.Fatal(err)
			}
			_, _ = s.Write(frameBytes)
			_ = s.CloseWrite()
			_ = s.SetReadDeadline(time.Now().Add(5 * time.Second))
			msg, _, err := frame.NewReader(s, frame.Limits{}).ReadStream()
			_ = s.Close()
			cancel()
			if err != nil {
				t.Fatalf("bad frame %d: no error reply: %v", i, err)
			}
			code := msg.GetError().GetCode()
			if msg.GetAccept() != nil {
				code = msg.GetAccept().GetError().GetCode()
			}
			if code != want[i] {
				t.Errorf("bad frame %d: node answered %v, want %s", i, msg, want[i])
			}
		}
	}
	res, err := c.Origin(nil).Generate(context.Background(), session.GenerateRequest{Fingerprint: fp, NLayer: nl, Prompt: []int32{1, 2, 3}, MaxTokens: 8})
	if err != nil || len(res.Tokens) != 8 {
		t.Fatalf("node stopped serving after bad frames: %v", err)
	}
	if want := localTokens(t, model, []int32{1, 2, 3}, 8); !equalTokens(res.Tokens, want) {
		t.Fatalf("tokens %v want %v", res.Tokens, want)
	}
	assertReleased(t, tn, a, b)
}

// A synthesized quantized model (Q4_K_M with real k-quants: dims are
// multiples of 256) split over 3 nodes matches the whole model exactly.
func TestSwarmQuantizedMatchesLocal(t *testing.T) {
	if testing.Short() {
		t.Skip("quantizes a model")
	}
	dir := t.TempDir()
	f16 := dir + "/q.f16.gguf"
	spec := gguf.DefaultSpec("llama")
	spec.Layers, spec.Embd, spec.Heads, spec.KVHeads, spec.FF = 4, 256, 4, 2, 512
	spec.Type, spec.Seed, spec.Name = gguf.TypeF16, 11, "qsynth"
	if err := gguf.Synth(context.Background(), spec, f16); err != nil {
		t.Fatal(err)
	}
	model := dir + "/qsynth.gguf"
	if err := engine.Quantize(context.Background(), f16, model, engine.QuantQ4_KM); err != nil {
		t.Fatal(err)
	}
	tn := newTestNet(t)
	for _, r := range gguf.EvenSplit(4, 3) {
		tn.shard(model, r)
	}
	c := tn.client()
	fp, nl := waitModel(t, c, "qsynth")
	prompt := thinClientPrompt(t, c, fp, "Once upon a time")
	res, err := c.Origin(nil).Generate(context.Background(), session.GenerateRequest{Fingerprint: fp, NLayer: nl, Prompt: prompt, MaxTokens: 24})
	if err != nil {
		t.Fatal(err)
	}
	if want := localTokens(t, model, prompt, 24); !equalTokens(res.Tokens, want) {
		t.Fatalf("swarm %v\nlocal %v", res.Tokens, want)
	}
}

// A one-hop route (one node serving every layer) keeps generating past the
// idle timeout: tokens are activity too.
func TestSingleHopOutlivesIdleTimeout(t *testing.T) {
	model := testmodels.Path(t, "stories260K.gguf")
	tn := newTestNet(t)
	const idle = 100 * time.Millisecond
	tn.shardWith(model, nil, func(c *Config) { c.Hop.Idle = idle })
	c := tn.client()
	fp, nl := waitModel(t, c, "stories260K")
	t0 := time.Now()
	res, err := c.Origin(nil).Generate(context.Background(), session.GenerateRequest{Fingerprint: fp, NLayer: nl, Prompt: []int32{1, 2}, MaxTokens: 400})
	if err != nil {
		t.Fatalf("after %s: %v", time.Since(t0), err)
	}
	if want := localTokens(t, model, []int32{1, 2}, 400); !equalTokens(res.Tokens, want) {
		t.Fatal("tokens differ from local")
	}
	t.Logf("400 tokens in %s with a %s idle timeout", time.Since(t0), idle)
}

// A next hop that admits a session and then stops reading must not wedge
// the hop: its write fails, the error names that peer, the session is
// released and the node still shuts down promptly.
func TestStalledNextHopIsBlamedAndReleased(t *testing.T) {
	model := testmodels.Path(t, "stories260K.gguf")
	tn := newTestNet(t)
	head := tn.shardWith(model, &gguf.Range{Start: 0, End: 3}, func(c *Config) { c.Hop.Idle, c.Engine.NCtx = time.Second, 2048 })
	c := tn.client()
	stall := tn.client()
	release := make(chan struct{})
	defer close(release)
	stall.host.SetStreamHandler(stall.host.ProtocolID(session.ProtoSession, session.ProtoVersion), func(s network.Stream) {
		msg, _, err := frame.NewReader(s, frame.Limits{}).ReadStream()
		if err != nil || msg.GetOpen() == nil {
			_ = s.Reset()
			return
		}
		o := msg.GetOpen()
		// Behave like a tail: open the ring to the head, accept.
		ring, err := stall.host.NewStream(context.Background(), head.P2P().ID(), stall.host.ProtocolID(session.ProtoRing, session.ProtoVersion))
		if err != nil {
			_ = s.Reset()
			return
		}
		defer ring.Close()
		_ = frame.NewWriter(ring, frame.Limits{}).WriteStream(&meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Open{Open: o}})
		_ = frame.NewWriter(s, frame.Limits{}).WriteStream(&meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Accept{Accept: &meshp2pb.SessionAccept{SessionId: o.GetSessionId(), Epoch: o.GetEpoch(), Ok: true}}})
		<-release // never read again
		_ = s.Reset()
	})
	var fp string
	var nl int
	for deadline := time.Now().Add(20 * time.Second); fp == ""; time.Sleep(50 * time.Millisecond) {
		fp, nl, _ = c.Table().Resolve("stories260K") // only the head: no full route
		if time.Now().After(deadline) {
			t.Fatal("head advert never arrived")
		}
	}
	rt := route.Route{Fingerprint: fp, NLayer: nl, Hops: []route.Hop{
		{Peer: head.P2P().ID(), Start: 0, End: 3, Addrs: head.P2P().Addrs()},
		{Peer: stall.P2P().ID(), Start: 3, End: 5, Addrs: stall.P2P().Addrs()},
	}}
	o := c.Origin(fixedPlanner{&rt})
	o.MaxReroutes = -1
	// 1500 rows × 64 floats × 4 bytes: far more than a stream window.
	prompt := make([]int32, 1500)
	for i := range prompt {
		prompt[i] = int32(1 + i%400)
	}
	_, err := o.Generate(context.Background(), session.GenerateRequest{Fingerprint: fp, NLayer: nl, Prompt: prompt, MaxTokens: 4})
	var re *frame.RemoteError
	if !errors.As(err, &re) || re.E.GetCode() != meshp2pb.ErrorCode_ERROR_CODE_NEXT_HOP_UNREACHABLE || peer.ID(re.E.GetFailedPeerId()) != stall.P2P().ID() {
		t.Fatalf("want NEXT_HOP_UNREACHABLE naming the stalled hop, got %v", err)
	}
	t.Logf("origin sees: %v", err)
	assertReleased(t, tn, head)
	done := make(chan struct{})
	go func() { head.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("node close hangs")
	}
}

// A re-routed session (same id, next epoch) reaching a hop that still holds
// the old epoch supersedes it: the old one is told STALE_EPOCH and freed,
// so its KV reservation does not refuse the new one.
func TestNewEpochSupersedesOld(t *testing.T) {
	model := testmodels.Path(t, "stories260K.gguf")
	tn := newTestNet(t)
	whole := tn.shardWith(model, nil, nil) // 512 KV cells
	c := tn.client()
	fp, nl := waitModel(t, c, "stories260K")
	sid := make([]byte, 16)
	_, _ = rand.Read(sid)
	open := func(epoch uint64) (network.Stream, *meshp2pb.StreamMessage) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s, err := c.host.NewStream(ctx, whole.P2P().ID(), c.host.ProtocolID(session.ProtoSession, session.ProtoVersion))
		if err != nil {
			t.Fatal(err)
		}
		o := &meshp2pb.SessionOpen{SessionId: sid, Epoch: epoch, ModelFingerprint: fp, NCtxNeeded: 400,
			Route: &meshp2pb.Route{ModelFingerprint: fp, NLayer: uint32(nl), Epoch: epoch, Hops: []*meshp2pb.RouteHop{{PeerId: []byte(whole.P2P().ID()), Start: 0, End: uint32(nl)}}}}
		signOpen(t, c, o)
		if err := frame.NewWriter(s, frame.Limits{}).WriteStream(&meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Open{Open: o}}); err != nil {
			t.Fatal(err)
		}
		_ = s.SetReadDeadline(time.Now().Add(10 * time.Second))
		msg, _, err := frame.NewReader(s, frame.Limits{}).ReadStream()
		if err != nil {
			t.Fatal(err)
		}
		return s, msg
	}
	s1, m1 := open(1)
	defer s1.Close()
	if !m1.GetAccept().GetOk() {
		t.Fatalf("epoch 1: %v", m1)
	}
	s2, m2 := open(2) // 400 + 400 cells would not fit next to epoch 1
	defer s2.Close()
	if !m2.GetAccept().GetOk() {
		t.Fatalf("epoch 2 refused while epoch 1 holds its cells: %v", m2)
	}
	msg, _, err := frame.NewReader(s1, frame.Limits{}).ReadStream()
	if err != nil || msg.GetError().GetCode() != meshp2pb.ErrorCode_ERROR_CODE_STALE_EPOCH {
		t.Fatalf("epoch 1 should be told STALE_EPOCH: %v %v", msg, err)
	}
	// The superseded epoch leaves the hop's table just after STALE_EPOCH is
	// written (the write is the last thing its goroutine does before release),
	// so wait a bounded time for it rather than reading the count at once.
	deadline := time.Now().Add(5 * time.Second)
	for whole.Hop().Sessions() != 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := whole.Hop().Sessions(); n != 1 {
		t.Fatalf("sessions on the hop 5 s after STALE_EPOCH: %d, want 1", n)
	}
}

// signOpen signs open as origin n (session.SignOpen with n's key).
func signOpen(t testing.TB, n *Node, open *meshp2pb.SessionOpen) {
	t.Helper()
	if err := session.SignOpen(open, n.host.Peerstore().PrivKey(n.P2P().ID()), time.Now()); err != nil {
		t.Fatal(err)
	}
}

// A session's admission and end re-publish the capacity at once: with
// the periodic check an hour apart, only they can make the client's table
// show the only slot taken, then free again (planners skip peers whose
// advert shows no room).
func TestSessionsRepublishCapacity(t *testing.T) {
	model := testmodels.Path(t, "stories260K.gguf")
	tn := newTestNet(t)
	n := tn.shardWith(model, nil, func(c *Config) { c.Engine.MaxSessions = 1; c.AdvertCheckInterval = time.Hour })
	c := tn.client()
	fp, nl := waitModel(t, c, "stories260K")
	free := func() int {
		for _, s := range c.Table().Shards(fp) {
			if s.Peer == n.P2P().ID() {
				return int(s.Capacity.GetFreeSessions())
			}
		}
		return -1
	}
	// waitFree waits for the client's table to show want free sessions
	// (the bound only ends a failing test).
	waitFree := func(want int) error {
		for deadline := time.Now().Add(30 * time.Second); free() != want; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				return fmt.Errorf("the client's table shows %d free sessions, want %d", free(), want)
			}
		}
		return nil
	}
	if err := waitFree(1); err != nil {
		t.Fatal(err)
	}
	var held error
	first := true
	_, err := c.Origin(nil).Generate(context.Background(), session.GenerateRequest{Fingerprint: fp, NLayer: nl, Prompt: []int32{1, 403, 407}, MaxTokens: 8,
		OnToken: func(int32) bool {
			if first { // the session holds the slot while this waits
				first, held = false, waitFree(0)
			}
			return false
		}})
	if err != nil {
		t.Fatal(err)
	}
	if held != nil {
		t.Fatalf("while the session ran: %v", held)
	}
	if err := waitFree(1); err != nil {
		t.Fatalf("after it ended: %v", err)
	}
}
