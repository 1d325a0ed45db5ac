package fetch

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// testHost is a real libp2p host on loopback.
type testHost struct{ host.Host }

func (h testHost) ProtocolID(name, v string) protocol.ID {
	return protocol.ID("/meshp2p/fetchtest/" + name + "/" + v)
}

func newHost(t testing.TB) testHost {
	t.Helper()
	h, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"), libp2p.DisableRelay(),
		libp2p.ResourceManager(&network.NullResourceManager{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	return testHost{h}
}

func connect(t testing.TB, a, b testHost) {
	t.Helper()
	if err := a.Connect(context.Background(), peer.AddrInfo{ID: b.ID(), Addrs: b.Addrs()}); err != nil {
		t.Fatal(err)
	}
}

// model is a synthesized 12-layer model with its manifest.
type model struct {
	path string
	m    *gguf.Manifest
	raw  []byte
	fp   string
}

func synthModel(t testing.TB, embd int) *model {
	t.Helper()
	s := gguf.DefaultSpec("llama")
	s.Layers, s.Embd, s.FF, s.Name = 12, embd, 2*embd, "synth12"
	p := filepath.Join(t.TempDir(), "synth12.gguf")
	if err := gguf.Synth(context.Background(), s, p); err != nil {
		t.Fatal(err)
	}
	m, err := gguf.BuildManifest(context.Background(), p, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &model{path: p, m: m, raw: m.Marshal(), fp: m.Fingerprint()}
}

func (md *model) split(t testing.TB, r gguf.Range) string {
	t.Helper()
	res, err := gguf.Split(context.Background(), md.path, []gguf.Range{r}, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return res[0].Path
}

// logBuf collects log lines.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) { l.mu.Lock(); defer l.mu.Unlock(); return l.b.Write(p) }
func (l *logBuf) String() string              { l.mu.Lock(); defer l.mu.Unlock(); return l.b.String() }

// Layers 4-8 of a 12-layer model from two peers, one of which serves
// flipped bytes: the manifest checks against the fingerprint, the bad
// peer's tensors are rejected, the peer dropped and logged, every tensor
// comes from the honest peer, and the shard equals shard split's.
func TestFetchFromPeersRejectsCorruptPeer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	md := synthModel(t, 64)
	rg := gguf.Range{Start: 4, End: 8}
	want, err := os.ReadFile(md.split(t, rg))
	if err != nil {
		t.Fatal(err)
	}
	good, bad, me := newHost(t), newHost(t), newHost(t)
	connect(t, me, good)
	connect(t, me, bad)
	var goodBytes, badBytes atomic.Int64
	sg := NewServer(good, 0, nil)
	sg.Served = func(n int64) { goodBytes.Add(n) }
	if err := sg.Add(md.fp, md.split(t, gguf.Range{Start: 0, End: 8}), md.raw); err != nil {
		t.Fatal(err)
	}
	// The bad peer holds 4-12 with one byte flipped in every tensor's data.
	badShard := md.split(t, gguf.Range{Start: 4, End: 12})
	sb := NewServer(bad, 0, nil)
	sb.Served = func(n int64) { badBytes.Add(n) }
	if err := sb.Add(md.fp, badShard, md.raw); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Open(badShard)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(badShard)
	for _, ti := range f.Tensors {
		raw[f.DataOffset+int64(ti.Offset)+int64(ti.Bytes)/2] ^= 0x55
	}
	f.Close()
	if err := os.WriteFile(badShard, raw, 0o644); err != nil {
		t.Fatal(err)
	}

	// A manifest that does not prove the fingerprint is refused.
	if _, _, err := FetchManifest(ctx, me, []peer.ID{good.ID()}, "00"+md.fp[2:], nil, nil); err == nil {
		t.Fatal("manifest accepted for another fingerprint")
	}
	m, _, err := FetchManifest(ctx, me, []peer.ID{bad.ID(), good.ID()}, md.fp, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ts, err := gguf.ShardSources(m.File, rg)
	if err != nil {
		t.Fatal(err)
	}
	need, _ := uniqueBytes(m, ts)
	logs := &logBuf{}
	st := &Stage{Dir: filepath.Join(t.TempDir(), "staging")}
	fe := &Fetcher{Host: me, Stage: st, Log: slog.New(slog.NewTextHandler(logs, nil)), Progress: NewProgress(need, nil)}
	// The bad peer is listed first, so it is asked first.
	srcs := []Source{{bad.ID(), 4, 12}, {good.ID(), 0, 8}}
	if err := fe.Fetch(ctx, m, md.fp, ts, srcs); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "shard.gguf")
	if _, err := st.Assemble(ctx, m, rg, out); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(out)
	if !bytes.Equal(got, want) {
		t.Fatal("fetched shard differs from shard split's")
	}
	if n := strings.Count(logs.String(), "dropping it for this fetch"); n < 1 || !strings.Contains(logs.String(), bad.ID().String()) {
		t.Fatalf("bad peer not dropped/logged:\n%s", logs)
	}
	if badBytes.Load() == 0 {
		t.Fatal("the bad peer was never asked")
	}
	// Exactly the tensors' bytes were downloaded from the good peer.
	if goodBytes.Load() != need {
		t.Fatalf("good peer sent %d bytes, the shard needs %d", goodBytes.Load(), need)
	}
	t.Logf("%d tensors, %d bytes from the good peer, %d rejected bytes from the bad one", len(ts), goodBytes.Load(), badBytes.Load())

	// A second fetch into the same stage downloads nothing.
	before := goodBytes.Load()
	if err := fe.Fetch(ctx, m, md.fp, ts, srcs[1:]); err != nil {
		t.Fatal(err)
	}
	if goodBytes.Load() != before {
		t.Fatal("staged tensors fetched again")
	}
	// With only the bad peer the fetch fails clearly.
	fe2 := &Fetcher{Host: me, Stage: &Stage{Dir: t.TempDir()}, Log: slog.New(slog.NewTextHandler(logs, nil))}
	if err := fe2.Fetch(ctx, m, md.fp, ts, srcs[:1]); err == nil || !strings.Contains(err.Error(), "no peer could send") {
		t.Fatalf("only a bad peer: %v", err)
	}
}

// A source that sends slower than the minimum rate is given up for that
// tensor (its bytes stay staged) and the tensor comes from another; a
// peer that sends a byte just inside the idle timeout cannot hold a
// fetch for ever.
func TestFetchLeavesASlowPeer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	md := synthModel(t, 64)
	rg := gguf.Range{Start: 4, End: 8}
	slow, good, me := newHost(t), newHost(t), newHost(t)
	connect(t, me, slow)
	connect(t, me, good)
	whole := md.split(t, gguf.Range{Start: 0, End: 12})
	// 512 bytes/s: a 32 KiB tensor would take a minute from it.
	if err := NewServer(slow, 512, nil).Add(md.fp, whole, md.raw); err != nil {
		t.Fatal(err)
	}
	if err := NewServer(good, 0, nil).Add(md.fp, whole, md.raw); err != nil {
		t.Fatal(err)
	}
	ts, err := gguf.ShardSources(md.m.File, rg)
	if err != nil {
		t.Fatal(err)
	}
	logs := &logBuf{}
	st := &Stage{Dir: filepath.Join(t.TempDir(), "staging")}
	fe := &Fetcher{Host: me, Stage: st, Log: slog.New(slog.NewTextHandler(logs, nil)), MinRate: 64 << 10, Grace: 200 * time.Millisecond}
	if err := fe.Fetch(ctx, md.m, md.fp, ts, []Source{{slow.ID(), 0, 12}, {good.ID(), 0, 12}}); err != nil {
		t.Fatalf("%v\n%s", err, logs)
	}
	for _, ti := range ts {
		if !st.Have(md.m.DataHash(ti), int64(ti.Bytes)) {
			t.Fatalf("%s not staged", ti.Name)
		}
	}
	if !strings.Contains(logs.String(), "peer sends too slowly") {
		t.Fatalf("the slow peer was never given up:\n%s", logs)
	}
}

// A fetcher that stops reading is reset by the server once its budget at
// the minimum rate is spent, so it frees its transfer slots (time the
// server waits in its own upload limit does not count against it).
func TestServerResetsASlowReader(t *testing.T) {
	md := synthModel(t, 512) // tensors of 1 MiB and more: over the stream's window
	srvHost, me := newHost(t), newHost(t)
	connect(t, me, srvHost)
	sv := NewServer(srvHost, 0, nil)
	sv.MinRate, sv.Grace = 1<<20, 200*time.Millisecond
	if err := sv.Add(md.fp, md.split(t, gguf.Range{Start: 0, End: 12}), md.raw); err != nil {
		t.Fatal(err)
	}
	var big *gguf.TensorInfo
	for i, ti := range md.m.File.Tensors {
		if big == nil || ti.Bytes > big.Bytes {
			big = &md.m.File.Tensors[i]
		}
	}
	ctx := context.Background()
	request := func() (network.Stream, *meshp2pb.TensorResponse) {
		t.Helper()
		s, err := me.NewStream(ctx, srvHost.ID(), me.ProtocolID(ProtoTensor, ProtoVersion))
		if err != nil {
			t.Fatal(err)
		}
		lim := frame.Limits{MaxHeader: headerLimit}
		if err := frame.NewWriter(s, lim).WriteMessage(&meshp2pb.TensorRequest{ModelFingerprint: md.fp, Name: big.Name, Length: big.Bytes}); err != nil {
			t.Fatal(err)
		}
		var resp meshp2pb.TensorResponse
		if err := frame.NewReader(s, lim).ReadMessage(&resp); err != nil {
			t.Fatal(err)
		}
		return s, &resp
	}
	// Two transfers that never read hold both of this peer's slots.
	for range MaxTransfersPerPeer {
		s, resp := request()
		if resp.GetError() != nil {
			t.Fatalf("refused: %v", resp.GetError())
		}
		defer s.Reset()
	}
	// Within its budget (0.2 s + size at 1 MiB/s) plus slack, the server
	// resets them and serves this peer again.
	deadline := time.Now().Add(10 * time.Second) // IdleTimeout alone would take 30 s
	for {
		s, resp := request()
		_ = s.Reset()
		if resp.GetError() == nil {
			break
		}
		if frame.Code(frame.FromProto(resp.GetError())) != meshp2pb.ErrorCode_ERROR_CODE_NO_CAPACITY {
			t.Fatalf("unexpected refusal: %v", resp.GetError())
		}
		if time.Now().After(deadline) {
			t.Fatal("the stalled transfers still hold the slots")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A model removed from a server (no longer served by the node) is refused
// like any unknown model: its manifest is not handed out.
func TestServerRemove(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	md := synthModel(t, 64)
	srv, me := newHost(t), newHost(t)
	connect(t, me, srv)
	s := NewServer(srv, 0, nil)
	if err := s.Add(md.fp, "", md.raw); err != nil {
		t.Fatal(err)
	}
	if _, _, err := FetchManifest(ctx, me, []peer.ID{srv.ID()}, md.fp, nil, nil); err != nil {
		t.Fatalf("before Remove: %v", err)
	}
	s.Remove(md.fp)
	if _, _, err := FetchManifest(ctx, me, []peer.ID{srv.ID()}, md.fp, nil, nil); err == nil {
		t.Fatal("a removed model's manifest was still served")
	}
}
