package vocab

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/internal/testmodels/synthmodel"
	"github.com/neuron-tai/meshp2p/p2p"
	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// testHost is a plain libp2p host on loopback as a session.Host.
type testHost struct{ host.Host }

func newTestHost(t testing.TB) testHost {
	t.Helper()
	h, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"), libp2p.DisableRelay(),
		libp2p.ResourceManager(&network.NullResourceManager{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	return testHost{h}
}

func (h testHost) ProtocolID(name, version string) protocol.ID {
	return protocol.ID("/meshp2p/test/" + name + "/" + version)
}
func (h testHost) Protect(p peer.ID, tag string)        { h.ConnManager().Protect(p, tag) }
func (h testHost) Unprotect(p peer.ID, tag string) bool { return h.ConnManager().Unprotect(p, tag) }
func (h testHost) SubscribeConn(ctx context.Context) <-chan p2p.ConnEvent {
	return make(chan p2p.ConnEvent)
}
func (h testHost) PathTo(peer.ID) p2p.Path { return p2p.PathDirect }

// knows makes h able to dial the others.
func (h testHost) knows(others ...testHost) testHost {
	for _, o := range others {
		h.Peerstore().AddAddrs(o.ID(), o.Addrs(), peerstore.PermanentAddrTTL)
	}
	return h
}

// testVocab writes the vocabulary file of a small synthetic model and
// returns its path and the model's fingerprint.
func testVocab(t testing.TB) (path, fp string) {
	t.Helper()
	model := synthmodel.Llama(t, "vocabtest", 1)
	path = filepath.Join(t.TempDir(), "vocab.gguf")
	if err := gguf.WriteVocab(context.Background(), model, path); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if fp, err = gguf.ReadVocabFingerprint(f.Metadata); err != nil {
		t.Fatal(err)
	}
	return path, fp
}

// server starts a host serving the vocabulary at path for fp.
func server(t testing.TB, fp, path string) (testHost, *Service) {
	t.Helper()
	h := newTestHost(t)
	v := NewService(h, frame.Limits{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := v.Add(fp, path); err != nil {
		t.Fatal(err)
	}
	return h, v
}

// request is the bytes of a vocabulary request for fp.
func request(t testing.TB, fp string) []byte {
	var b bytes.Buffer
	if err := frame.NewWriter(&b, frame.Limits{}).WriteMessage(&meshp2pb.VocabRequest{ModelFingerprint: fp}); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// open opens a vocabulary stream from h to srv and writes b on it (the
// handler runs once bytes arrive).
func open(ctx context.Context, t testing.TB, h, srv testHost, b []byte) network.Stream {
	t.Helper()
	s, err := h.knows(srv).NewStream(ctx, srv.ID(), h.ProtocolID(Proto, ProtoVersion))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Reset() })
	if _, err := s.Write(b); err != nil {
		t.Fatal(err)
	}
	return s
}

// Identities that open vocabulary streams and send nothing, or half a
// request, take no transfer slot: an honest client gets the vocabulary at
// once, and the idle streams are dropped after RequestTimeout.
func TestIdleStreamsHoldNoSlot(t *testing.T) {
	path, fp := testVocab(t)
	srv, _ := server(t, fp, path)
	ctx, cancel := context.WithTimeout(context.Background(), TransferTimeout)
	defer cancel()
	req := request(t, fp)
	var idle []network.Stream
	for range MaxTransfers + 2 {
		h := newTestHost(t)
		idle = append(idle, open(ctx, t, h, srv, []byte{0}), open(ctx, t, h, srv, req[:len(req)/2]))
	}
	time.Sleep(300 * time.Millisecond) // every handler is waiting for its request
	t0 := time.Now()
	got, err := Fetch(ctx, newTestHost(t).knows(srv), srv.ID(), fp, t.TempDir())
	if err != nil {
		t.Fatalf("honest client refused while %d identities hold idle vocabulary streams: %v", MaxTransfers+2, err)
	}
	took := time.Since(t0)
	t.Logf("honest fetch took %s with %d idle streams open", took, len(idle))
	if took >= RequestTimeout {
		t.Fatalf("honest fetch took %s: it waited for idle streams", took)
	}
	if err := gguf.CheckVocab(ctx, got, fp); err != nil {
		t.Fatal(err)
	}
	// A complete request that is not valid is answered without a slot.
	bad := open(ctx, t, newTestHost(t), srv, request(t, "not-a-fingerprint"))
	var resp meshp2pb.VocabResponse
	if err := frame.NewReader(bad, frame.Limits{}).ReadMessage(&resp); err != nil || resp.GetError().GetCode() != meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST {
		t.Fatalf("invalid request: %v, %v", resp.GetError(), err)
	}
	// The idle streams end once RequestTimeout has passed.
	for _, s := range idle {
		_ = s.SetReadDeadline(time.Now().Add(RequestTimeout + 5*time.Second))
		if _, err := io.ReadAll(s); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("idle stream not reset by the server: %v", err)
		}
	}
}

// A peer holds one transfer at a time, and a reader slower than MinRate
// loses its slot: MaxTransfers identities that request a large file and
// never read it block others only until they fall behind.
func TestSlowReaderLosesSlot(t *testing.T) {
	data := make([]byte, 8<<20) // well over a stream's flow-control window
	_, _ = rand.Read(data)
	path := filepath.Join(t.TempDir(), "big")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	fp := string(bytes.Repeat([]byte("ab"), 32))
	srv, svc := server(t, fp, path)
	svc.MinRate, svc.Grace = 1<<20, 300*time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), TransferTimeout)
	defer cancel()
	req := request(t, fp)
	var slow []network.Stream
	var hosts []testHost
	for range MaxTransfers {
		h := newTestHost(t)
		hosts = append(hosts, h)
		slow = append(slow, open(ctx, t, h, srv, req))
	}
	time.Sleep(100 * time.Millisecond) // every slot is taken
	refused := func(s network.Stream) bool {
		_ = s.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := s.Read(make([]byte, 1))
		return err != nil && !errors.Is(err, os.ErrDeadlineExceeded)
	}
	if !refused(open(ctx, t, hosts[0], srv, req)) {
		t.Fatal("a second concurrent transfer to the same peer was served")
	}
	late := newTestHost(t)
	if !refused(open(ctx, t, late, srv, req)) {
		t.Fatal("a transfer past MaxTransfers was served")
	}
	// Grace + the window at MinRate: the slow readers fall behind and are
	// reset; then the late peer is served in full.
	time.Sleep(2 * time.Second)
	s := open(ctx, t, late, srv, req)
	var resp meshp2pb.VocabResponse
	got, err := frame.NewReader(s, frame.Limits{MaxPayload: MaxBytes}).ReadBlob(&resp)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("slow readers still hold the slots: %v (%d bytes)", err, len(got))
	}
	for _, s := range slow {
		if _, err := io.ReadAll(s); err == nil {
			t.Fatal("a slow reader got the whole file")
		}
	}
}

// A client facing a peer that stalls and an honest one gets the
// vocabulary in seconds (HedgeDelay), not after the staller's
// TransferTimeout.
func TestFetchFirstStallingPeer(t *testing.T) {
	path, fp := testVocab(t)
	honest, _ := server(t, fp, path)
	staller := newTestHost(t)
	stalled := make(chan network.Stream, 1)
	staller.SetStreamHandler(staller.ProtocolID(Proto, ProtoVersion), func(s network.Stream) {
		stalled <- s // read nothing, answer nothing
	})
	cl := newTestHost(t).knows(honest, staller)
	ctx, cancel := context.WithTimeout(context.Background(), 2*TransferTimeout)
	defer cancel()
	dir := t.TempDir()
	var accepted []string
	t0 := time.Now()
	var blamed []peer.ID
	got, err := FetchFirst(ctx, cl, []peer.ID{staller.ID(), honest.ID()}, fp, dir, func(p string, _ int) error {
		accepted = append(accepted, p)
		return gguf.CheckVocab(ctx, p, fp)
	}, func(p peer.ID, _ error) { blamed = append(blamed, p) })
	took := time.Since(t0)
	t.Logf("fetch with a stalling first peer took %s", took)
	if err != nil {
		t.Fatal(err)
	}
	if took > TransferTimeout/4 {
		t.Fatalf("fetch took %s: the staller cost about a transfer timeout (%s)", took, TransferTimeout)
	}
	if got != filepath.Join(dir, FileName(fp)) || len(accepted) != 1 || accepted[0] != got {
		t.Fatalf("path %s, accepted %v", got, accepted)
	}
	if len(blamed) != 0 {
		t.Fatalf("a transfer cancelled because another won was reported as failed: %v", blamed)
	}
	// The staller's stream was given up when the honest copy won, and
	// no temporary file is left.
	s := <-stalled
	_ = s.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadAll(s); errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal("the losing transfer was not cancelled")
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("files left in the vocabulary directory: %v", ents)
	}
}

// A verified file the caller cannot load is not the end: the next peer's
// copy is tried.
func TestFetchFirstAcceptRejects(t *testing.T) {
	path, fp := testVocab(t)
	a, _ := server(t, fp, path)
	b, _ := server(t, fp, path)
	cl := newTestHost(t).knows(a, b)
	ctx, cancel := context.WithTimeout(context.Background(), TransferTimeout)
	defer cancel()
	calls := 0
	_, err := FetchFirst(ctx, cl, []peer.ID{a.ID(), b.ID()}, fp, t.TempDir(), func(string, int) error {
		calls++
		if calls == 1 {
			return errors.New("cannot load")
		}
		return nil
	}, func(p peer.ID, err error) {
		t.Errorf("%s reported as failed for the caller's own load error: %v", p, err)
	})
	if err != nil || calls != 2 {
		t.Fatalf("err %v after %d loads", err, calls)
	}
	// Every peer failing is an error naming each.
	_, err = FetchFirst(ctx, cl, []peer.ID{a.ID(), b.ID()}, fp, t.TempDir(), func(string, int) error { return errors.New("cannot load") }, nil)
	if err == nil || !bytes.Contains([]byte(err.Error()), []byte(a.ID().String())) || !bytes.Contains([]byte(err.Error()), []byte(b.ID().String())) {
		t.Fatalf("err %v", err)
	}
}

// A peer whose own transfer fails (here: it resets the stream) is
// reported to the caller, which remembers it; the peer that gave the file
// is not.
func TestFetchFirstReportsFailedPeers(t *testing.T) {
	path, fp := testVocab(t)
	honest, _ := server(t, fp, path)
	refuser := newTestHost(t)
	refuser.SetStreamHandler(refuser.ProtocolID(Proto, ProtoVersion), func(s network.Stream) { _ = s.Reset() })
	cl := newTestHost(t).knows(honest, refuser)
	ctx, cancel := context.WithTimeout(context.Background(), TransferTimeout)
	defer cancel()
	var blamed []peer.ID
	if _, err := FetchFirst(ctx, cl, []peer.ID{refuser.ID(), honest.ID()}, fp, t.TempDir(), nil, func(p peer.ID, err error) {
		blamed = append(blamed, p)
		t.Logf("reported %s: %v", p, err)
	}); err != nil {
		t.Fatal(err)
	}
	if len(blamed) != 1 || blamed[0] != refuser.ID() {
		t.Fatalf("reported %v, want only the refuser %s", blamed, refuser.ID())
	}
}

// A vocabulary removed (its model no longer served here) is refused like
// any unknown model's.
func TestRemovedVocabNotServed(t *testing.T) {
	path, fp := testVocab(t)
	srv, v := server(t, fp, path)
	c := newTestHost(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := Fetch(ctx, c.knows(srv), srv.ID(), fp, t.TempDir()); err != nil {
		t.Fatalf("before Remove: %v", err)
	}
	v.Remove(fp)
	if _, err := Fetch(ctx, c, srv.ID(), fp, t.TempDir()); err == nil {
		t.Fatal("a removed vocabulary was still served")
	}
}
