package fetch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/neuron-tai/meshp2p/engine/gguf"
)

// fileServer serves one file by http.ServeContent (ranges, If-Range) at
// /m.gguf and a redirect to it at /redir, counting the body bytes sent.
type fileServer struct {
	*httptest.Server
	sent      atomic.Int64
	noRange   atomic.Bool
	cutOnce   atomic.Int64 // >0: cut the next ranged answer after this many bytes
	stallOnce atomic.Int64 // >0: stall the next ranged answer after this many bytes (until the client goes)
	throttle  atomic.Int64 // bytes per 10 ms, 0: none
	mtime     atomic.Int64 // unix seconds
	path      string
	afterSent atomic.Pointer[func(n int64)]
	active    atomic.Int64
	// run, when set, is the only ?run= value whose bytes count in sent:
	// a request the cancelled client sent just before its cancel can
	// reach a handler after quiesce saw nothing in flight (its connection
	// was idle for a moment between two requests), and must not count
	// toward the next measurement.
	run atomic.Pointer[string]
}

// quiesce waits until no answer is in flight (a cancelled client's handler
// may still be writing into its dead connection).
func (fs *fileServer) quiesce(t testing.TB) {
	for deadline := time.Now().Add(10 * time.Second); fs.active.Load() > 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("HTTP answers still in flight")
		}
	}
}

type countingWriter struct {
	http.ResponseWriter
	s     *fileServer
	limit int64 // cut after this many body bytes (0: never)
	stall int64 // stall after this many body bytes (0: never)
	ctx   context.Context
	n     int64
}

func (w *countingWriter) Write(b []byte) (int, error) {
	if w.stall > 0 && w.n+int64(len(b)) > w.stall {
		k, _ := w.ResponseWriter.Write(b[:w.stall-w.n])
		w.n += int64(k)
		w.s.sent.Add(int64(k))
		w.ResponseWriter.(http.Flusher).Flush()
		<-w.ctx.Done() // a live connection that sends nothing more
		return k, w.ctx.Err()
	}
	if w.limit > 0 && w.n+int64(len(b)) > w.limit {
		b = b[:w.limit-w.n]
		k, _ := w.ResponseWriter.Write(b)
		w.n += int64(k)
		w.s.sent.Add(int64(k))
		panic(http.ErrAbortHandler) // drop the connection mid-body
	}
	written := 0
	for len(b) > 0 {
		chunk := b
		if th := w.s.throttle.Load(); th > 0 {
			chunk = b[:min(int64(len(b)), th)]
			time.Sleep(10 * time.Millisecond)
		}
		k, err := w.ResponseWriter.Write(chunk)
		written += k
		w.n += int64(k)
		w.s.sent.Add(int64(k))
		if f := w.s.afterSent.Load(); f != nil {
			(*f)(w.s.sent.Load())
		}
		if err != nil {
			return written, err
		}
		b = b[k:]
	}
	return written, nil
}

func newFileServer(t testing.TB, path string) *fileServer {
	t.Helper()
	fs := &fileServer{path: path}
	fs.mtime.Store(time.Now().Add(-time.Hour).Unix())
	mux := http.NewServeMux()
	mux.HandleFunc("/redir", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/m.gguf", http.StatusFound) })
	mux.HandleFunc("/m.gguf", func(w http.ResponseWriter, r *http.Request) {
		fs.active.Add(1)
		defer fs.active.Add(-1)
		f, err := os.Open(fs.path)
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		defer f.Close()
		cw := &countingWriter{ResponseWriter: w, s: fs, ctx: r.Context()}
		if run := fs.run.Load(); run != nil && r.URL.Query().Get("run") != *run {
			cw.s = &fileServer{} // an earlier run's late request: counted apart
		}
		if fs.noRange.Load() {
			r.Header.Del("Range")
		} else if c := fs.cutOnce.Swap(0); c > 0 && r.Header.Get("Range") != "" {
			cw.limit = c
		} else if c := fs.stallOnce.Swap(0); c > 0 && r.Header.Get("Range") != "" {
			cw.stall = c
		}
		http.ServeContent(cw, r, "m.gguf", time.Unix(fs.mtime.Load(), 0), f)
	})
	fs.Server = httptest.NewServer(mux)
	t.Cleanup(fs.Close)
	return fs
}

// uniqueBytes is the bytes of ts with equal data counted once (staging is
// by hash: a second tensor with the same data is not downloaded again).
func uniqueBytes(m *gguf.Manifest, ts []*gguf.TensorInfo) (n int64, count int) {
	seen := map[gguf.Digest]bool{}
	for _, t := range ts {
		if h := m.DataHash(t); !seen[h] {
			seen[h] = true
			n += int64(t.Bytes)
		}
	}
	return n, len(seen)
}

func tensorBytes(ts []*gguf.TensorInfo) (n int64) {
	for _, t := range ts {
		n += int64(t.Bytes)
	}
	return n
}

// Layers 4-8 of a 12-layer model from a URL: the header by range (one
// 256 KiB read) and exactly the shard's tensor bytes, not the file; the
// shard equals shard split's. Through a redirect, and with a connection
// cut mid-tensor (retried, resumed).
func TestFetchFromURL(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	md := synthModel(t, 128)
	rg := gguf.Range{Start: 4, End: 8}
	want, _ := os.ReadFile(md.split(t, rg))
	st0, _ := os.Stat(md.path)
	srv := newFileServer(t, md.path)

	t.Run("with a manifest", func(t *testing.T) {
		srv.sent.Store(0)
		u := &URL{URL: srv.URL + "/redir"}
		f, hdr, err := u.Header(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(hdr, md.m.Header) || u.Size() != st0.Size() || f.HeaderSize != int64(len(hdr)) {
			t.Fatal("header read by range differs from the file's")
		}
		srv.quiesce(t)
		hdrSent := srv.sent.Load()
		ts, _ := gguf.ShardSources(md.m.File, rg)
		st := &Stage{Dir: t.TempDir()}
		p := NewProgress(tensorBytes(ts), nil)
		if err := u.FetchTensors(ctx, st, md.m, ts, p); err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(t.TempDir(), "s.gguf")
		if _, err := st.Assemble(ctx, md.m, rg, out); err != nil {
			t.Fatal(err)
		}
		got, _ := os.ReadFile(out)
		if !bytes.Equal(got, want) {
			t.Fatal("shard from the URL differs from shard split's")
		}
		ub, _ := uniqueBytes(md.m, ts)
		srv.quiesce(t)
		if hdrSent != headerChunk || srv.sent.Load() != headerChunk+ub {
			t.Fatalf("served %d bytes (header %d), want %d + %d tensor bytes", srv.sent.Load(), hdrSent, headerChunk, ub)
		}
		t.Logf("file %d bytes; downloaded %d header + %d tensor bytes (%d tensors, %d distinct; %.0f%% of the file)", st0.Size(), hdrSent, ub, len(ts), len(st.files(t)), 100*float64(srv.sent.Load())/float64(st0.Size()))
	})

	t.Run("cut and resumed", func(t *testing.T) {
		u := &URL{URL: srv.URL + "/m.gguf", Backoff: time.Millisecond, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
		if _, _, err := u.Header(ctx); err != nil {
			t.Fatal(err)
		}
		ts, _ := gguf.ShardSources(md.m.File, rg)
		st := &Stage{Dir: t.TempDir()}
		srv.cutOnce.Store(int64(ts[0].Bytes / 2))
		if err := u.FetchTensors(ctx, st, md.m, ts, nil); err != nil {
			t.Fatal(err)
		}
		for _, ti := range ts {
			if !st.Have(md.m.DataHash(ti), int64(ti.Bytes)) {
				t.Fatalf("%s not staged", ti.Name)
			}
		}
	})

	t.Run("server stalls mid-tensor", func(t *testing.T) {
		// The connection stays up but no byte comes: the idle watchdog
		// cuts the request and the retry resumes where it stopped.
		logs := &logBuf{}
		u := &URL{URL: srv.URL + "/m.gguf", Backoff: time.Millisecond, Idle: 300 * time.Millisecond, Log: slog.New(slog.NewTextHandler(logs, nil))}
		if _, _, err := u.Header(ctx); err != nil {
			t.Fatal(err)
		}
		ts, _ := gguf.ShardSources(md.m.File, rg)
		st := &Stage{Dir: t.TempDir()}
		srv.stallOnce.Store(int64(ts[0].Bytes / 2))
		sctx, cancel := context.WithTimeout(ctx, 20*time.Second) // without the watchdog this would hang
		defer cancel()
		if err := u.FetchTensors(sctx, st, md.m, ts, nil); err != nil {
			t.Fatal(err)
		}
		for _, ti := range ts {
			if !st.Have(md.m.DataHash(ti), int64(ti.Bytes)) {
				t.Fatalf("%s not staged", ti.Name)
			}
		}
		if !strings.Contains(logs.String(), "server stalled: nothing for 300ms") {
			t.Fatalf("the stall was not retried and logged:\n%s", logs)
		}
	})

	t.Run("stopped after a tensor's last byte", func(t *testing.T) {
		// A process killed between a tensor's last byte and its rename
		// leaves a complete "<hash>.part": the next fetch must finish it
		// without asking the server for zero bytes (HTTP 416).
		ts, _ := gguf.ShardSources(md.m.File, rg)
		st := &Stage{Dir: t.TempDir()}
		whole, err := os.ReadFile(md.path)
		if err != nil {
			t.Fatal(err)
		}
		first := ts[0]
		at := md.m.File.DataOffset + int64(first.Offset)
		h := md.m.DataHash(first)
		if err := os.WriteFile(st.path(h)+".part", whole[at:at+int64(first.Bytes)], 0o644); err != nil {
			t.Fatal(err)
		}
		u := &URL{URL: srv.URL + "/m.gguf"}
		if _, _, err := u.Header(ctx); err != nil {
			t.Fatal(err)
		}
		srv.quiesce(t)
		srv.sent.Store(0)
		if err := u.FetchTensors(ctx, st, md.m, ts, nil); err != nil {
			t.Fatalf("fetch after a complete partial tensor: %v", err)
		}
		for _, ti := range ts {
			if !st.Have(md.m.DataHash(ti), int64(ti.Bytes)) {
				t.Fatalf("%s not staged", ti.Name)
			}
		}
		need, _ := uniqueBytes(md.m, ts)
		srv.quiesce(t)
		if got := srv.sent.Load(); got != need-int64(first.Bytes) {
			t.Fatalf("served %d tensor bytes, want %d (all but the staged tensor's %d)", got, need-int64(first.Bytes), first.Bytes)
		}
	})

	t.Run("cancelled and resumed", func(t *testing.T) {
		// A fetch stopped halfway keeps what it verified and the partial
		// tensor; the next one downloads only the missing bytes.
		ts, _ := gguf.ShardSources(md.m.File, rg)
		need, _ := uniqueBytes(md.m, ts)
		st := &Stage{Dir: t.TempDir()}
		cctx, ccancel := context.WithCancel(ctx)
		srv.sent.Store(0)
		stopAt := func(n int64) {
			if n > headerChunk+need/2 {
				ccancel()
			}
		}
		srv.afterSent.Store(&stopAt)
		srv.throttle.Store(32 << 10)
		u := &URL{URL: srv.URL + "/m.gguf"}
		_, _, err := u.Header(cctx)
		if err == nil {
			err = u.FetchTensors(cctx, st, md.m, ts, nil)
		}
		srv.afterSent.Store(nil)
		srv.throttle.Store(0)
		srv.quiesce(t)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled fetch: %v", err)
		}
		var have int64
		seen := map[gguf.Digest]bool{}
		for _, ti := range ts {
			h := md.m.DataHash(ti)
			if seen[h] {
				continue
			}
			seen[h] = true
			if st.Have(h, int64(ti.Bytes)) {
				have += int64(ti.Bytes)
			} else {
				have += st.Partial(h)
			}
		}
		if have == 0 || have >= need {
			t.Fatalf("after the cancel %d of %d bytes staged", have, need)
		}
		resumed := "resume"
		srv.run.Store(&resumed)
		defer srv.run.Store(nil)
		srv.sent.Store(0)
		u = &URL{URL: srv.URL + "/m.gguf?run=" + resumed}
		if _, _, err := u.Header(ctx); err != nil {
			t.Fatal(err)
		}
		if err := u.FetchTensors(ctx, st, md.m, ts, nil); err != nil {
			t.Fatal(err)
		}
		srv.quiesce(t)
		if got := srv.sent.Load(); got != headerChunk+need-have {
			t.Fatalf("resume downloaded %d bytes, want header %d + missing %d", got, headerChunk, need-have)
		}
		t.Logf("resumed: %d of %d tensor bytes were staged, downloaded %d more", have, need, need-have)
	})

	t.Run("first node of the model", func(t *testing.T) {
		u := &URL{URL: srv.URL + "/m.gguf"}
		f, hdr, err := u.Header(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ts, _ := gguf.ShardSources(f, rg)
		keep := map[string]bool{}
		for _, ti := range ts {
			keep[ti.Name] = true
		}
		st := &Stage{Dir: t.TempDir()}
		m, err := u.StreamAll(ctx, st, f, hdr, func(ti *gguf.TensorInfo) bool { return keep[ti.Name] }, nil)
		if err != nil {
			t.Fatal(err)
		}
		if m.Fingerprint() != md.fp {
			t.Fatalf("streamed fingerprint %s, want %s", m.Fingerprint(), md.fp)
		}
		if _, n := uniqueBytes(md.m, ts); len(st.files(t)) != n {
			t.Fatalf("%d files staged, want only the %d kept tensors", len(st.files(t)), n)
		}
		out := filepath.Join(t.TempDir(), "s.gguf")
		if _, err := st.Assemble(ctx, m, rg, out); err != nil {
			t.Fatal(err)
		}
		got, _ := os.ReadFile(out)
		if !bytes.Equal(got, want) {
			t.Fatal("first-node shard differs from shard split's")
		}
	})

	t.Run("first node's pass killed and resumed", func(t *testing.T) {
		// The streaming pass stopped halfway: the next pass starts at the
		// first tensor the journal lacks, not at the start of the file,
		// and still yields the model's fingerprint and a correct shard.
		st := &Stage{Dir: t.TempDir()}
		cctx, ccancel := context.WithCancel(ctx)
		defer ccancel()
		var f *gguf.File
		var hdr []byte
		var data int64
		srv.sent.Store(0)
		stopAt := func(n int64) {
			if data > 0 && n > headerChunk+data/2 {
				ccancel()
			}
		}
		srv.afterSent.Store(&stopAt)
		srv.throttle.Store(64 << 10)
		u := &URL{URL: srv.URL + "/m.gguf"}
		f, hdr, err := u.Header(cctx)
		if err != nil {
			t.Fatal(err)
		}
		last := f.Tensors[len(f.Tensors)-1]
		data = int64(last.Offset + last.Bytes)
		ts, _ := gguf.ShardSources(f, rg)
		keep := map[string]bool{}
		for _, ti := range ts {
			keep[ti.Name] = true
		}
		keepFn := func(ti *gguf.TensorInfo) bool { return keep[ti.Name] }
		_, err = u.StreamAll(cctx, st, f, hdr, keepFn, nil)
		srv.afterSent.Store(nil)
		srv.throttle.Store(0)
		srv.quiesce(t)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("killed pass: %v", err)
		}
		first := srv.sent.Load() - headerChunk

		srv.sent.Store(0)
		logs := &logBuf{}
		u = &URL{URL: srv.URL + "/m.gguf", Log: slog.New(slog.NewTextHandler(logs, nil))}
		f, hdr, err = u.Header(ctx)
		if err != nil {
			t.Fatal(err)
		}
		m, err := u.StreamAll(ctx, st, f, hdr, keepFn, nil)
		if err != nil {
			t.Fatal(err)
		}
		srv.quiesce(t)
		second := srv.sent.Load() - headerChunk
		if m.Fingerprint() != md.fp {
			t.Fatalf("resumed pass: fingerprint %s, want %s", m.Fingerprint(), md.fp)
		}
		if second >= data || first+second < data || !strings.Contains(logs.String(), "resuming the streaming pass") {
			t.Fatalf("data section %d bytes: the killed pass read %d, the resumed one %d (want less than all, none skipped)\n%s", data, first, second, logs)
		}
		out := filepath.Join(t.TempDir(), "s.gguf")
		if _, err := st.Assemble(ctx, m, rg, out); err != nil {
			t.Fatal(err)
		}
		if got, _ := os.ReadFile(out); !bytes.Equal(got, want) {
			t.Fatal("resumed first-node shard differs from shard split's")
		}
		if _, err := os.Stat(filepath.Join(st.Dir, journalName)); !os.IsNotExist(err) {
			t.Fatalf("journal left after a finished pass: %v", err)
		}
		t.Logf("data section %d bytes: killed pass read %d, resumed pass %d (%.0f%% of it)", data, first, second, 100*float64(second)/float64(data))
	})

	t.Run("server ignores Range", func(t *testing.T) {
		srv.noRange.Store(true)
		defer srv.noRange.Store(false)
		u := &URL{URL: srv.URL + "/m.gguf"}
		_, _, err := u.Header(ctx)
		if !errors.Is(err, ErrNoRange) || !strings.Contains(err.Error(), "ignores HTTP range requests") {
			t.Fatalf("got %v", err)
		}
	})

	t.Run("file changed", func(t *testing.T) {
		u := &URL{URL: srv.URL + "/m.gguf"}
		if _, _, err := u.Header(ctx); err != nil {
			t.Fatal(err)
		}
		old := srv.mtime.Load()
		srv.mtime.Store(old + 60)
		defer srv.mtime.Store(old)
		ts, _ := gguf.ShardSources(md.m.File, rg)
		err := u.FetchTensors(ctx, &Stage{Dir: t.TempDir()}, md.m, ts, nil)
		if !errors.Is(err, ErrChanged) {
			t.Fatalf("got %v", err)
		}
	})
}

func TestParseContentRange(t *testing.T) {
	for _, c := range []struct {
		in      string
		a, b, n int64
		ok      bool
	}{
		{"bytes 0-99/1000", 0, 99, 1000, true},
		{"bytes 5-5/6", 5, 5, 6, true},
		{"bytes 0-9/*", 0, 9, -1, true},
		{"bytes 9-0/10", 0, 0, 0, false},
		{"bytes 0-10/10", 0, 0, 0, false},
		{"bytes -1-5/10", 0, 0, 0, false},
		{"bytes 0-5", 0, 0, 0, false},
		{"bits 0-5/10", 0, 0, 0, false},
		{"bytes 0-99999999999999999999/1", 0, 0, 0, false},
		{"bytes +1-5/10", 0, 0, 0, false},
	} {
		a, b, n, err := ParseContentRange(c.in)
		if (err == nil) != c.ok || (c.ok && (a != c.a || b != c.b || n != c.n)) {
			t.Errorf("%q: %d %d %d %v", c.in, a, b, n, err)
		}
	}
}

func FuzzParseContentRange(f *testing.F) {
	f.Add("bytes 0-99/1000")
	f.Add("bytes 0-9/*")
	f.Fuzz(func(t *testing.T, s string) {
		a, b, n, err := ParseContentRange(s)
		if err != nil {
			return
		}
		if a < 0 || b < a || (n != -1 && b >= n) {
			t.Fatalf("%q: %d-%d/%d", s, a, b, n)
		}
	})
}

func (s *Stage) files(t testing.TB) []string {
	ents, err := os.ReadDir(s.Dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// The journal is trusted only for the file it names and only up to its
// first line that is torn, out of order, or names a kept tensor no longer
// staged.
func TestStreamJournalLoad(t *testing.T) {
	md := synthModel(t, 64)
	f := md.m.File
	st := &Stage{Dir: t.TempDir()}
	line := func(i int) string { return fmt.Sprintf("%d %s\n", i, md.m.DataHash(&f.Tensors[i]).String()) }
	const ident = "meshp2p-stream 1 100 \"etag\""
	none := func(*gguf.TensorInfo) bool { return false }
	for _, tc := range []struct {
		name string
		body string
		keep func(*gguf.TensorInfo) bool
		want int
	}{
		{"three tensors", ident + "\n" + line(0) + line(1) + line(2), none, 3},
		{"torn last line", ident + "\n" + line(0) + line(1) + line(2)[:10], none, 2},
		{"another file", "meshp2p-stream 1 100 \"other\"\n" + line(0), none, 0},
		{"index gap", ident + "\n" + line(0) + line(2), none, 1},
		{"kept tensor not staged", ident + "\n" + line(0) + line(1), func(ti *gguf.TensorInfo) bool { return ti.Name == f.Tensors[1].Name }, 1},
		{"empty", "", none, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), journalName)
			if err := os.WriteFile(p, []byte(tc.body), 0o644); err != nil {
				t.Fatal(err)
			}
			j := &journal{path: p, ident: ident}
			hashes := make([]gguf.Digest, len(f.Tensors))
			if got := j.load(f, st, tc.keep, hashes); got != tc.want {
				t.Fatalf("load = %d tensors, want %d", got, tc.want)
			}
		})
	}
}
