package node

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/session"
)

// logBuf collects a node's log lines (safe for concurrent writes).
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// fetchedPlaced starts a node without the model file and without layers:
// it fetches the window placement chooses (by model name from peers, or
// from a URL) and moves it like a node with the whole file.
func (tn *testNet) fetchedPlaced(model string, budget int64, seed uint64, logs *logBuf) *Node {
	tn.t.Helper()
	cfg := tn.config(tn.t.TempDir())
	cfg.Fetch = &FetchConfig{Model: model, Wait: 20 * time.Second}
	cfg.Placement = &PlacementConfig{Memory: budget, Interval: testRebalance, Seed: seed}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	n, err := Start(context.Background(), cfg)
	if err != nil {
		tn.t.Fatalf("start fetching self-placing node: %v", err)
	}
	tn.t.Cleanup(func() { n.Close() })
	return n
}

// TestFetchedNodeMoves: a self-placing node that fetched its 3 layers from
// peers (no model file) moves when the swarm needs it elsewhere: a peer
// dies and the only route left needs a 3-layer window that only this node
// can take. It fetches that window's tensors from the peers that serve
// them, moves gracefully, and generation through it equals --local. Then
// the layers of every window it could move to are served by nobody: the
// fetch of a move fails and it stays on its window, still serving it.
func TestFetchedNodeMoves(t *testing.T) {
	model := synthModel(t, "fmove12", 12)
	fm := fetchedMove(t, model, "fmove12", "fmove12")
	if !strings.Contains(fm.logs.String(), "placement: fetching the new window's tensors from peers") {
		t.Fatalf("the move did not fetch from peers:\n%s", fm.logs)
	}
	// Kill R: the layers of R's window outside the survivor's are served by
	// nobody. The fetched node tries a window there (a partial fix of the
	// gap), cannot fetch it, and stays.
	fm.failedMove(t, func() { _ = fm.r.P2P().Host().Close() })
}

// TestURLFetchedNodeMoves: the same with the model fetched by HTTP range
// requests (the manifest from a peer): the move downloads the new
// window's tensors from the URL. Then the server sends other bytes under
// the same validator: the move's fetch fails the manifest check and the
// node stays on its window.
func TestURLFetchedNodeMoves(t *testing.T) {
	model := synthModel(t, "umove12", 12)
	good, err := os.ReadFile(model)
	if err != nil {
		t.Fatal(err)
	}
	var data atomic.Pointer[[]byte]
	data.Store(&good)
	mod := time.Now().Add(-time.Hour)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "umove12.gguf", mod, bytes.NewReader(*data.Load()))
	}))
	t.Cleanup(srv.Close)
	fm := fetchedMove(t, model, "umove12", srv.URL+"/umove12.gguf")
	if !strings.Contains(fm.logs.String(), "placement: downloading the new window's tensors by HTTP range requests") {
		t.Fatalf("the move did not download from the URL:\n%s", fm.logs)
	}
	gf, err := gguf.Open(model)
	if err != nil {
		t.Fatal(err)
	}
	dataOff := gf.DataOffset
	gf.Close()
	bad := bytes.Clone(good) // every tensor differs, the header does not
	for i := dataOff; i < int64(len(bad)); i += 16 {
		bad[i] ^= 0x5a
	}
	fm.failedMove(t, func() {
		data.Store(&bad)
		_ = fm.r.P2P().Host().Close()
	})
	if !strings.Contains(fm.logs.String(), "does not match the swarm's manifest") {
		t.Fatalf("the failed move does not say the data was bad:\n%s", fm.logs)
	}
}

// fetchedMoveRun is a fetched self-placing node after its first move.
type fetchedMoveRun struct {
	f, r *Node
	h    gguf.Range
	logs *logBuf
}

// fetchedMove starts nodes on 0-6 and 6-12 (with the model file) and a
// fetched self-placing node with room for 3 layers (--model
// fetchModel), then a node on a window R and kills one of the first two so
// that exactly the 3 layers h are off every route, where the fetched node
// is not: only it can close the gap (the peers still serve h's tensors).
// It waits for the move and checks generation through it.
func fetchedMove(t *testing.T, model, name, fetchModel string) *fetchedMoveRun {
	t.Helper()
	tn := newTestNet(t)
	sz, err := ModelSizing(model, tn.config("").Engine)
	if err != nil {
		t.Fatal(err)
	}
	b3 := budgetFor(sz, 3)
	p := tn.shard(model, gguf.Range{Start: 0, End: 6})
	q := tn.shard(model, gguf.Range{Start: 6, End: 12})
	c := tn.client()
	fp, nl := waitModel(t, c, name)
	waitShards(t, c.Table(), fp, 2)
	prompt := thinClientPrompt(t, c, fp, "Once upon a time")

	logs := &logBuf{}
	f := tn.fetchedPlaced(fetchModel, b3, 1, logs)
	w := gguf.Range{Start: f.Info().Start, End: f.Info().End}
	if st := f.Placement(); !st.Auto || st.Budget != b3 || st.Current != w {
		t.Fatalf("placement status of the fetched node %+v", st)
	}
	if f.RebalanceInterval() != testRebalance {
		t.Fatalf("rebalance interval %v", f.RebalanceInterval())
	}
	t.Logf("fetched node chose %s (budget for 3 layers %d B)", w, b3)

	var h, r gguf.Range
	var victim, survivor *Node
	if w != (gguf.Range{Start: 0, End: 3}) {
		h, r, victim, survivor = gguf.Range{Start: 0, End: 3}, gguf.Range{Start: 3, End: 12}, q, p
	} else {
		h, r, victim, survivor = gguf.Range{Start: 9, End: 12}, gguf.Range{Start: 0, End: 9}, p, q
	}
	// R bootstraps from both (the victim may be the first node), and the
	// fetched node sees R's window before the victim dies.
	tn.boot = []peer.AddrInfo{p.P2P().AddrInfo(), q.P2P().AddrInfo()}
	rn := tn.shard(model, r)
	deadline := time.Now().Add(20 * time.Second)
	for !advertised(f, fp, []*Node{rn}) {
		if time.Now().After(deadline) {
			t.Fatalf("the fetched node never saw the window %s", r)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("started %s; killing %d-%d: only a window on %s closes the route", r, victim.Info().Start, victim.Info().End, h)
	_ = victim.P2P().Host().Close()

	nodes := []*Node{f, survivor, rn}
	deadline = time.Now().Add(30 * time.Second)
	for f.Placement().Current != h || f.Placement().Moving != nil || !advertised(c, fp, nodes) {
		if time.Now().After(deadline) {
			t.Fatalf("the fetched node did not move to %s: placement %+v, windows %v\n%s", h, f.Placement(), windows(nodes), logs)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if st := f.Placement(); st.Moves != 1 || st.Loading != nil {
		t.Fatalf("placement status after the move %+v", st)
	}
	if rg := f.Hop().Ranges(); len(rg) != 1 || rg[0] != (session.ServedRange{Start: h.Start, End: h.End, Admitting: true}) {
		t.Fatalf("hop ranges %+v", rg)
	}
	if l := logs.String(); !strings.Contains(l, fmt.Sprintf("L%d-%d.gguf", h.Start, h.End)) {
		t.Fatalf("no shard of %s written in the log:\n%s", h, l)
	}
	logLines(t, logs, "the new window's tensors")
	// h holds the tokenizer (a head or a tail): the node serves the
	// vocabulary now, also if its first window was a middle one.
	deadline = time.Now().Add(10 * time.Second)
	for !advertsVocab(c, fp, f) {
		if time.Now().After(deadline) {
			t.Fatalf("after moving to %s (from %s) the node does not advertise the vocabulary", h, w)
		}
		time.Sleep(50 * time.Millisecond)
	}
	res := generateEqualsLocal(t, c, model, fp, nl, prompt, 24)
	if !onRoute(res, f.P2P().ID()) {
		t.Fatalf("the route %+v does not use the moved node", res.Route.Hops)
	}
	return &fetchedMoveRun{f: f, r: rn, h: h, logs: logs}
}

// failedMove runs breakFetch (which leaves the fetched node a reason to
// move but no way to fetch the window), waits for a move to fail, and
// checks the node still serves its window.
func (fm *fetchedMoveRun) failedMove(t *testing.T, breakFetch func()) {
	t.Helper()
	const failed = "placement: move failed; staying"
	// Shards of windows the node left would serve a move back without a
	// fetch: remove them, so that every move must fetch.
	cur := fm.f.set.now().path
	old, _ := filepath.Glob(filepath.Join(fm.f.cfg.P2P.DataDir, "shards", "*", "*.L*.gguf"))
	for _, p := range old {
		if p != cur {
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
		}
	}
	before := strings.Count(fm.logs.String(), failed)
	breakFetch()
	deadline := time.Now().Add(30 * time.Second)
	for strings.Count(fm.logs.String(), failed) == before {
		if time.Now().After(deadline) {
			t.Fatalf("no failed move: placement %+v\n%s", fm.f.Placement(), fm.logs)
		}
		time.Sleep(50 * time.Millisecond)
	}
	h := fm.h
	if st := fm.f.Placement(); st.Current != h || st.Moves != 1 || st.Loading != nil || st.Moving != nil {
		t.Fatalf("after a failed fetch: placement %+v", st)
	}
	if rg := fm.f.Hop().Ranges(); len(rg) != 1 || rg[0] != (session.ServedRange{Start: h.Start, End: h.End, Admitting: true}) {
		t.Fatalf("hop ranges after a failed fetch %+v", rg)
	}
	logLines(t, fm.logs, "move failed")
}

// logLines logs the first line of logs that contains s.
func logLines(t *testing.T, logs *logBuf, s string) {
	t.Helper()
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, s) {
			t.Log(l)
			return
		}
	}
}

func advertsVocab(c *Node, fp string, n *Node) bool {
	for _, s := range c.Table().Shards(fp) {
		if s.Peer == n.P2P().ID() && s.HasVocab && s.Capacity.GetMaxSessions() > 0 {
			return true
		}
	}
	return false
}

func onRoute(res session.Result, p peer.ID) bool {
	for _, h := range res.Route.Hops {
		if h.Peer == p {
			return true
		}
	}
	return false
}

// A self-placing node that fetches its window announces it (a planned
// window, no session slot) before the fetch, as a node with the file
// does before it cuts: nodes starting meanwhile see the choice and
// spread, instead of all fetching the same layers.
func TestFetchedNodeAnnouncesItsWindow(t *testing.T) {
	model := synthModel(t, "fannounce12", 12)
	tn := newTestNet(t)
	sz, err := ModelSizing(model, tn.config("").Engine)
	if err != nil {
		t.Fatal(err)
	}
	// The only source sends 256 KiB/s: the fetch takes seconds.
	src := tn.shardWith(model, &gguf.Range{Start: 0, End: 12}, func(c *Config) { c.UploadLimit = 256 << 10 })
	c := tn.client()
	fp, _ := waitModel(t, c, "fannounce12")
	type started struct {
		n   *Node
		err error
	}
	done := make(chan started, 1)
	go func() {
		cfg := tn.config(t.TempDir())
		cfg.Fetch = &FetchConfig{Model: "fannounce12", Wait: 20 * time.Second}
		cfg.Placement = &PlacementConfig{Memory: budgetFor(sz, 6), Interval: time.Hour, Seed: 7}
		n, err := Start(context.Background(), cfg)
		done <- started{n, err}
	}()
	var planned peer.ID
	var st started
	for st.n == nil && st.err == nil {
		for _, s := range c.Table().Shards(fp) {
			if s.Peer != src.P2P().ID() && s.Capacity.GetMaxSessions() == 0 && planned == "" {
				planned = s.Peer
				t.Logf("planned window %d-%d advertised while fetching", s.Start, s.End)
			}
		}
		select {
		case st = <-done:
		case <-time.After(10 * time.Millisecond):
		}
	}
	if st.err != nil {
		t.Fatal(st.err)
	}
	t.Cleanup(func() { st.n.Close() })
	if planned != st.n.P2P().ID() {
		t.Fatalf("no planned window of the fetching node was advertised before it loaded (saw %q)", planned)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !advertised(c, fp, []*Node{st.n}) {
		if time.Now().After(deadline) {
			t.Fatal("the loaded window was never advertised")
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, s := range c.Table().Shards(fp) {
		if s.Peer == st.n.P2P().ID() && s.Capacity.GetMaxSessions() == 0 {
			t.Fatalf("the planned window is still advertised after the load: %+v", s)
		}
	}
}
