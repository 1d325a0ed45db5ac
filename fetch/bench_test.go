package fetch

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/neuron-tai/meshp2p/engine/gguf"
)

// BenchmarkUploadLimits: one server, two fetchers at once, with
// --upload-limit 5M (both share it) and --upload-limit-per-peer 5M (each
// gets it); the metric is the server's total upload rate.
func BenchmarkUploadLimits(b *testing.B) {
	md := synthModel(b, 384)
	rg := gguf.Range{Start: 4, End: 8}
	shard := md.split(b, rg)
	ts, _ := gguf.ShardSources(md.m.File, rg)
	need, _ := uniqueBytes(md.m, ts)
	for _, c := range []struct {
		name           string
		total, perPeer int64
	}{{"upload-limit 5M", 5 << 20, 0}, {"upload-limit-per-peer 5M", 0, 5 << 20}} {
		b.Run(c.name, func(b *testing.B) {
			srv := newHost(b)
			s := NewServerLimits(srv, c.total, c.perPeer, nil)
			if err := s.Add(md.fp, shard, nil); err != nil {
				b.Fatal(err)
			}
			fetchers := []testHost{newHost(b), newHost(b)}
			for _, f := range fetchers {
				connect(b, f, srv)
			}
			b.SetBytes(2 * need)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				errs := make(chan error, len(fetchers))
				for _, h := range fetchers {
					go func() {
						fe := &Fetcher{Host: h, Stage: &Stage{Dir: filepath.Join(b.TempDir(), "st")}}
						errs <- fe.Fetch(context.Background(), md.m, md.fp, ts, []Source{{srv.ID(), 4, 8}})
					}()
				}
				for range fetchers {
					if err := <-errs; err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}

// BenchmarkFetchFromPeers fetches layers 4-8 (about 36 MiB) of a 12-layer,
// 512-wide model over loopback libp2p from one peer, from two, and from two
// with an upload limit of 5 MiB/s each (the ratios compare in one run):
//
//	go test -run '^$' -bench FetchFromPeers -benchtime 2x ./fetch
func BenchmarkFetchFromPeers(b *testing.B) {
	md := synthModel(b, 512)
	rg := gguf.Range{Start: 4, End: 8}
	shard := md.split(b, rg)
	ts, err := gguf.ShardSources(md.m.File, rg)
	if err != nil {
		b.Fatal(err)
	}
	need, _ := uniqueBytes(md.m, ts)
	for _, c := range []struct {
		name  string
		peers int
		limit int64
	}{{"1 peer", 1, 0}, {"2 peers", 2, 0}, {"2 peers upload-limit 5M", 2, 5 << 20}} {
		b.Run(c.name, func(b *testing.B) {
			me := newHost(b)
			var srcs []Source
			for i := 0; i < c.peers; i++ {
				h := newHost(b)
				connect(b, me, h)
				s := NewServer(h, c.limit, nil)
				if err := s.Add(md.fp, shard, nil); err != nil {
					b.Fatal(err)
				}
				srcs = append(srcs, Source{Peer: h.ID(), Start: 4, End: 8})
			}
			b.SetBytes(need)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				fe := &Fetcher{Host: me, Stage: &Stage{Dir: filepath.Join(b.TempDir(), "st")}}
				if err := fe.Fetch(context.Background(), md.m, md.fp, ts, srcs); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
