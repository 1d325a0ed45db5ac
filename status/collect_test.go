package status

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/multiformats/go-multiaddr"

	"github.com/neuron-tai/meshp2p/p2p"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/route"
)

func newHost(t *testing.T) *p2p.Node {
	t.Helper()
	n, err := p2p.New(context.Background(), p2p.Config{Network: "statusprobe", DataDir: t.TempDir(),
		ListenAddrs: []string{"/ip4/127.0.0.1/tcp/0"}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// The probe: a peer that is not connected but answers is dialled, pinged
// and counted; one whose address refuses is dead and not counted; many
// concurrent documents share one probe round.
func TestCollectorProbesPeers(t *testing.T) {
	self, alive, gone := newHost(t), newHost(t), newHost(t)
	goneID, goneAddrs := gone.ID(), gone.Host().Addrs()
	gone.Close() // its address now refuses
	tab := route.NewTable()
	shard := func(p peer.ID, addrs []multiaddr.Multiaddr, start, end int, class string) route.Shard {
		return route.Shard{Peer: p, Fingerprint: "fp", ModelName: "m", NLayer: 4, Start: start, End: end, Addrs: addrs, KernelClass: class,
			Capacity: &meshp2pb.ShardCapacity{FreeSessions: 1, MaxSessions: 2}, ExpiresAt: time.Now().Add(time.Minute)}
	}
	tab.Set(alive.ID(), []route.Shard{shard(alive.ID(), alive.Host().Addrs(), 0, 2, "vulkan/llvmpipe (LLVM 15.0.6, 256 bits)/llama.cpp@ec98e2002/fa")})
	tab.Set(goneID, []route.Shard{shard(goneID, goneAddrs, 2, 4, "cpu/amd64/sse3+avx2/llama.cpp@ec98e2002/fa")})
	c := &Collector{P2P: self, Table: tab, Recorder: &Recorder{}}
	var wg sync.WaitGroup
	docs := make([]*Document, 4)
	for i := range docs {
		wg.Add(1)
		go func() { defer wg.Done(); docs[i] = c.Document(context.Background()) }()
	}
	wg.Wait()
	for _, d := range docs {
		if len(d.Models) != 1 {
			t.Fatalf("models %+v", d.Models)
		}
		m := d.Models[0]
		if m.Routable || len(m.Gaps) != 1 || m.Gaps[0] != (Run{Start: 2, End: 4}) || m.Replicas[0] != 1 || len(m.Shards) != 2 {
			t.Fatalf("model %+v", m)
		}
		for _, s := range m.Shards {
			if want := s.Peer == alive.ID().String(); s.Live != want {
				t.Fatalf("shard %s live %v", s.Peer, s.Live)
			}
			if s.Live && (s.Path != "direct" || s.RTTMs <= 0 || s.Load != 0.5) {
				t.Fatalf("live shard %+v", s)
			}
			// Backend and device come from the advert's kernel class.
			want := [2]string{"cpu", ""}
			if s.Live {
				want = [2]string{"vulkan", "llvmpipe (LLVM 15.0.6, 256 bits)"}
			}
			if got := [2]string{s.Backend, s.Device}; got != want {
				t.Fatalf("shard %s: backend, device %q, want %q", s.Peer, got, want)
			}
		}
	}
	if self.ConnStatus(alive.ID()).Path != p2p.PathDirect {
		t.Fatal("the probe did not connect to the live peer")
	}
}

// A request whose context ends while another request's probe round runs
// stops waiting for it (docs/locks.md: the round was a mutex held across
// up to 64 dials) and answers from what needs no probe: cached results,
// else whether the peer is connected.
func TestCollectorWaitBoundedByContext(t *testing.T) {
	self, alive := newHost(t), newHost(t)
	tab := route.NewTable()
	tab.Set(alive.ID(), []route.Shard{{Peer: alive.ID(), Fingerprint: "fp", ModelName: "m", NLayer: 4, Start: 0, End: 4,
		Addrs: alive.Host().Addrs(), ExpiresAt: time.Now().Add(time.Minute)}})
	c := &Collector{P2P: self, Table: tab}
	c.probeAll(context.Background(), nil) // makes the round
	c.round <- struct{}{}                 // another request's round, never ending
	defer func() { <-c.round }()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	done := make(chan map[peer.ID]probe, 1)
	go func() { done <- c.probeAll(ctx, tab.Shards("")) }()
	select {
	case got := <-done:
		if pr, ok := got[alive.ID()]; !ok || pr.live {
			t.Fatalf("answer without probing: %+v (the peer is not connected)", got)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a request whose context ended still waits for another's probe round")
	}
}
