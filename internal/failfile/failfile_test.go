package failfile

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/internal/testbin"
	"github.com/neuron-tai/meshp2p/session"
)

func newPeer(t testing.TB) peer.ID {
	t.Helper()
	_, pub, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	id, err := peer.IDFromPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// logTo is a logger writing into a buffer (the warnings a test expects).
func logTo(b *bytes.Buffer) *slog.Logger { return slog.New(slog.NewTextHandler(b, nil)) }

func readFile(t *testing.T, path string) file {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var f file
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return f
}

// A blamed peer survives the run: saved, loaded by a fresh memory,
// avoided there until its original end, not from the load.
func TestSaveLoad(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", FileName)
	a, b := newPeer(t), newPeer(t)
	m := session.NewFailureMemory(0, 0)
	m.Blame(a)
	if err := Save(path, m, nil); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("file %v, %v: want mode 0600", st, err)
	}
	f := readFile(t, path)
	if f.Version != Version || len(f.Peers) != 1 || f.Peers[0].Peer != a.String() {
		t.Fatalf("saved %+v", f)
	}
	until := f.Peers[0].Until

	r := session.NewFailureMemory(0, 0)
	Load(path, r, nil)
	if !r.Avoided(a) || r.Avoided(b) || r.Len() != 1 {
		t.Fatalf("loaded memory: a avoided %v, b avoided %v, %d held", r.Avoided(a), r.Avoided(b), r.Len())
	}
	if s := r.Snapshot(); !s[0].Until.Equal(until) {
		t.Fatalf("loaded end %v, saved %v", s[0].Until, until)
	}

	// A memory that holds nobody writes nothing (no file for clean runs).
	empty := filepath.Join(t.TempDir(), FileName)
	if err := Save(empty, session.NewFailureMemory(0, 0), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(empty); !os.IsNotExist(err) {
		t.Fatalf("an empty memory wrote %s: %v", empty, err)
	}
	// A missing file loads nothing, quietly.
	var logs bytes.Buffer
	Load(filepath.Join(t.TempDir(), "none.json"), r, logTo(&logs))
	if logs.Len() != 0 {
		t.Fatalf("a missing file warned: %s", logs.String())
	}
}

// Hardening III, row 9: a conviction survives the run. A memory holding
// only a convicted peer writes the file, a fresh memory loads it as
// convicted (never routed through: no end), a later save by a run that
// convicted someone else keeps both, and an older file without the field
// still loads.
func TestSaveLoadConvictions(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	liar, other, blamed := newPeer(t), newPeer(t), newPeer(t)
	m := session.NewFailureMemory(0, 0)
	m.Convict(liar)
	if err := Save(path, m, nil); err != nil {
		t.Fatal(err)
	}
	if f := readFile(t, path); len(f.Convicted) != 1 || f.Convicted[0] != liar.String() || len(f.Peers) != 0 {
		t.Fatalf("saved %+v: want the conviction", f)
	}
	r := session.NewFailureMemory(0, 0)
	Load(path, r, nil)
	if !r.Convicted(liar) || r.Convicted(other) {
		t.Fatalf("loaded: liar convicted %v, other %v", r.Convicted(liar), r.Convicted(other))
	}
	second := session.NewFailureMemory(0, 0)
	second.Convict(other)
	second.Blame(blamed)
	if err := Save(path, second, nil); err != nil {
		t.Fatal(err)
	}
	if f := readFile(t, path); len(f.Convicted) != 2 || len(f.Peers) != 1 {
		t.Fatalf("after a second run's save: %+v: want both convictions and the blamed peer", f)
	}
	old := filepath.Join(t.TempDir(), FileName)
	seed, _ := json.Marshal(map[string]any{"version": Version, "peers": []map[string]any{{"peer": blamed.String(), "until": time.Now().Add(time.Minute)}}})
	if err := os.WriteFile(old, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	o := session.NewFailureMemory(0, 0)
	Load(old, o, nil)
	if !o.Avoided(blamed) || len(o.Convicts()) != 0 {
		t.Fatalf("a file without convictions: avoided %v, convicts %v", o.Avoided(blamed), o.Convicts())
	}
}

// Save merges with the file: a peer another run saved stays, the later end
// of a peer both hold wins, and ended entries are dropped.
func TestSaveMergesAndExpires(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	other, both, ended, mine := newPeer(t), newPeer(t), newPeer(t), newPeer(t)
	now := time.Now().UTC()
	later := now.Add(90 * time.Second).Truncate(time.Second) // within the TTL
	writeJSON(t, path, file{Version: Version, Peers: []entry{
		{Peer: other.String(), Until: later},
		{Peer: both.String(), Until: now.Add(time.Hour)}, // beyond the memory's TTL: cut to it
		{Peer: ended.String(), Until: now.Add(-time.Minute)},
		{Peer: "not a peer id", Until: later},
	}})
	m := session.NewFailureMemory(2*time.Minute, 0)
	m.Blame(both)
	m.Blame(mine)
	if err := Save(path, m, nil); err != nil {
		t.Fatal(err)
	}
	got := map[string]time.Time{}
	for _, e := range readFile(t, path).Peers {
		got[e.Peer] = e.Until
	}
	if len(got) != 3 || !got[other.String()].Equal(later) || got[mine.String()].IsZero() {
		t.Fatalf("saved %v: want other (its end kept), both and mine; not ended nor the invalid entry", got)
	}
	if end := got[both.String()]; end.After(now.Add(2*time.Minute+time.Second)) || end.Before(now.Add(time.Minute)) {
		t.Fatalf("both ends at %v: want the memory's TTL from now (%v)", end, now.Add(2*time.Minute))
	}
	if !m.Avoided(other) {
		t.Fatal("Save did not teach the memory what the file held")
	}
}

// The file holds at most MaxEntries peers, the latest-ending ones, and a
// file with more is read up to the bound.
func TestSaveBounded(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	now := time.Now().UTC()
	var f file
	f.Version = Version
	ids := make([]peer.ID, MaxEntries+10)
	for i := range ids {
		ids[i] = newPeer(t)
		f.Peers = append(f.Peers, entry{Peer: ids[i].String(), Until: now.Add(time.Minute + time.Duration(i)*time.Millisecond)})
	}
	writeJSON(t, path, f)
	m := session.NewFailureMemory(0, MaxEntries+100)
	Load(path, m, nil)
	if m.Len() != MaxEntries {
		t.Fatalf("loaded %d peers from a file of %d, want the bound %d", m.Len(), len(f.Peers), MaxEntries)
	}
	m.Restore([]session.FailureEntry{{Peer: newPeer(t), Until: now.Add(time.Hour)}})
	m.Restore([]session.FailureEntry{{Peer: ids[MaxEntries+5], Until: now.Add(time.Hour)}})
	if err := Save(path, m, nil); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(path); st.Size() > MaxBytes {
		t.Fatalf("file of %d bytes, over MaxBytes %d", st.Size(), MaxBytes)
	}
	saved := readFile(t, path).Peers
	if len(saved) != MaxEntries {
		t.Fatalf("saved %d peers, want %d", len(saved), MaxEntries)
	}
	if saved[0].Until.Before(saved[len(saved)-1].Until) {
		t.Fatal("saved earliest-ending first; the bound must keep the latest")
	}
}

// A corrupt, oversized or foreign-version file is ignored with a warning,
// never fatal, and the next Save replaces it with a valid one.
func TestCorruptFileIgnoredAndRewritten(t *testing.T) {
	p := newPeer(t)
	for name, body := range map[string][]byte{
		"garbage":   []byte("{not json"),
		"truncated": []byte(`{"version":1,"peers":[{"peer":"` + p.String()),
		"version":   []byte(`{"version":99,"peers":[]}`),
		"oversized": bytes.Repeat([]byte(" "), MaxBytes+1),
		"wrongtype": []byte(`[1,2,3]`),
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), FileName)
			if err := os.WriteFile(path, body, 0o600); err != nil {
				t.Fatal(err)
			}
			var logs bytes.Buffer
			m := session.NewFailureMemory(0, 0)
			Load(path, m, logTo(&logs))
			if m.Len() != 0 || !strings.Contains(logs.String(), "ignoring the failure memory file") {
				t.Fatalf("loaded %d peers, logged %q", m.Len(), logs.String())
			}
			m.Blame(p)
			if err := Save(path, m, logTo(&logs)); err != nil {
				t.Fatalf("save over a %s file: %v", name, err)
			}
			if f := readFile(t, path); f.Version != Version || len(f.Peers) != 1 || f.Peers[0].Peer != p.String() {
				t.Fatalf("rewritten as %+v", f)
			}
		})
	}
}

// Concurrent savers, goroutines of one process, keep every entry: each
// merges with what the others wrote under the lock.
func TestConcurrentSaves(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	const writers = 8
	ids := make([]peer.ID, writers)
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for i := range ids {
		ids[i] = newPeer(t)
		m := session.NewFailureMemory(0, 0)
		m.Blame(ids[i])
		wg.Go(func() { errs <- Save(path, m, nil) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	checkHolds(t, path, ids)
}

func checkHolds(t *testing.T, path string, ids []peer.ID) {
	t.Helper()
	m := session.NewFailureMemory(0, 0)
	var logs bytes.Buffer
	Load(path, m, logTo(&logs))
	for i, p := range ids {
		if !m.Avoided(p) {
			t.Fatalf("writer %d's peer was lost (%d of %d held; %s)", i, m.Len(), len(ids), logs.String())
		}
	}
	matches, _ := filepath.Glob(filepath.Join(filepath.Dir(path), "*.tmp"))
	if len(matches) != 0 {
		t.Fatalf("temporary files left: %v", matches)
	}
}

// Concurrent savers in separate processes (this test binary run again)
// keep every entry too.
func TestConcurrentSavesProcesses(t *testing.T) {
	if path := os.Getenv("FAILFILE_TEST_SAVE"); path != "" {
		p, err := peer.Decode(os.Getenv("FAILFILE_TEST_PEER"))
		if err != nil {
			t.Fatal(err)
		}
		m := session.NewFailureMemory(0, 0)
		m.Blame(p)
		if err := Save(path, m, nil); err != nil {
			t.Fatal(err)
		}
		return
	}
	// Not t.TempDir: Wine 8 cannot os.RemoveAll, and make test-platforms
	// runs this under wine (the save lock is LockFileEx there).
	dir, err := os.MkdirTemp("", "failfile-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, FileName)
	const procs = 4
	ids := make([]peer.ID, procs)
	cmds := make([]*exec.Cmd, procs)
	for i := range cmds {
		ids[i] = newPeer(t)
		cmds[i] = testbin.Self("-test.run=^TestConcurrentSavesProcesses$", "-test.count=1")
		cmds[i].Env = append(os.Environ(), "FAILFILE_TEST_SAVE="+path, "FAILFILE_TEST_PEER="+ids[i].String())
	}
	for _, c := range cmds {
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
	}
	for i, c := range cmds {
		if err := c.Wait(); err != nil {
			t.Fatalf("process %d: %v", i, err)
		}
	}
	checkHolds(t, path, ids)
}

func TestCachePath(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("XDG_CACHE_HOME", dir)
	t.Setenv("HOME", dir)
	got, err := CachePath("meshp2p-test")
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := os.UserCacheDir(); got != filepath.Join(want, "meshp2p", "meshp2p-test", FileName) {
		t.Fatalf("CachePath = %s", got)
	}
	for _, bad := range []string{"", ".", "..", "a/b", strings.Repeat("x", 65)} {
		if p, err := CachePath(bad); err == nil {
			t.Fatalf("CachePath(%q) = %s, want an error", bad, p)
		}
	}
}

func writeJSON(t *testing.T, path string, f file) {
	t.Helper()
	b, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
