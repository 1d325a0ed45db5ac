// Package failfile keeps a session.FailureMemory between runs of a
// short-lived client (`meshp2p generate`): a small JSON file of the peers
// blamed for failed generations and when their avoidance ends, so a peer
// that made one run wait out a timeout is not waited on again by the next,
// and of the peers an audit convicted, which no later run routes through.
//
// The file is bounded (MaxEntries peers, MaxBytes read), its entries
// expire (absolute end times; session.FailureMemory.Restore drops the
// ended ones and cuts any beyond its TTL), and concurrent runs keep each
// other's entries: Save loads what is on disk, merges (the later end per
// peer wins), and replaces the file atomically (a temporary file renamed
// over it) under an advisory lock. A file that cannot be read or parsed is
// ignored with a warning and rewritten by the next Save: never fatal.
//
// It lives outside package session, which does no file I/O, and outside
// node, whose nodes live as long as their process and need no file: only
// the CLI's client peer uses it.
package failfile

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/session"
)

const (
	// FileName is the file's name in its directory.
	FileName = "failures.json"
	// Version is the format's version; a file of another is ignored.
	Version = 1
	// MaxEntries bounds the peers a file holds (the latest-ending ones):
	// the memory's own default bound.
	MaxEntries = session.DefaultFailurePeers
	// MaxConvicts bounds the convicted peers a file holds: the memory's
	// own bound.
	MaxConvicts = session.DefaultMaxConvicts
	// MaxBytes bounds what Load reads: a larger file is ignored. MaxEntries
	// entries of the longest peer IDs take about half of it.
	MaxBytes = 1 << 20
	// LockWait bounds how long Save waits for another run's save; past it
	// Save goes on without the lock (a lost entry costs one timeout, a
	// stuck run costs more).
	LockWait = 2 * time.Second
)

// file is the format on disk. Convicted was added after version 1 shipped:
// an older file has none, an older reader ignores it.
type file struct {
	Version   int      `json:"version"`
	Peers     []entry  `json:"peers"`
	Convicted []string `json:"convicted,omitempty"`
}

type entry struct {
	Peer  string    `json:"peer"`
	Until time.Time `json:"until"`
}

// networkRE is p2p's network name rule (1-64 of [A-Za-z0-9._-]).
var networkRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// CachePath is the file of a client of network without a data dir of its
// own: <os.UserCacheDir()>/meshp2p/<network>/failures.json.
func CachePath(network string) (string, error) {
	if !networkRE.MatchString(network) || network == "." || network == ".." {
		return "", fmt.Errorf("failfile: network name %q is not a directory name", network)
	}
	dir, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "meshp2p", network, FileName), nil
}

// Load merges the entries of the file at path into m. A missing file adds
// nothing; one that cannot be read, is larger than MaxBytes, or does not
// parse is ignored with a warning on log (Save then rewrites it).
// Entries naming no valid peer are skipped.
func Load(path string, m *session.FailureMemory, log *slog.Logger) {
	entries, convicts, err := read(path)
	if err != nil {
		logger(log).Warn("ignoring the failure memory file; it is rewritten at the next save", "file", path, "err", err)
	}
	m.Restore(entries)
	for _, p := range convicts {
		m.Convict(p)
	}
}

// Save merges m with the file at path and writes the result back: the
// file's entries are first restored into m (so m learns what other runs
// saved), then m's snapshot, bounded to MaxEntries, replaces the file
// atomically. Concurrent Saves to one path (goroutines or processes)
// serialize on path+".lock" and keep each other's entries. A memory that
// holds nobody writes nothing.
func Save(path string, m *session.FailureMemory, log *slog.Logger) error {
	if m.Len() == 0 {
		return nil
	}
	log = logger(log)
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	unlock, err := lock(path+".lock", LockWait)
	if err != nil {
		log.Warn("saving the failure memory without its lock", "file", path, "err", err)
	} else {
		defer unlock()
	}
	Load(path, m, log)
	snap := m.Snapshot()
	if len(snap) > MaxEntries {
		snap = snap[:MaxEntries]
	}
	f := file{Version: Version, Peers: make([]entry, 0, len(snap))}
	for _, e := range snap {
		f.Peers = append(f.Peers, entry{Peer: e.Peer.String(), Until: e.Until.UTC()})
	}
	for _, p := range m.Convicts() {
		f.Convicted = append(f.Convicted, p.String())
	}
	b, err := json.Marshal(f)
	if err != nil {
		return err
	}
	for len(b) > MaxBytes && len(f.Peers)+len(f.Convicted) > 1 { // only with peer IDs far longer than libp2p's
		f.Peers, f.Convicted = f.Peers[:len(f.Peers)/2], f.Convicted[:len(f.Convicted)/2]
		if b, err = json.Marshal(f); err != nil {
			return err
		}
	}
	return writeAtomic(path, append(b, '\n'))
}

// read returns the entries and convictions of the file at path (none if
// it does not exist).
func read(path string) ([]session.FailureEntry, []peer.ID, error) {
	fh, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	defer fh.Close()
	b, err := io.ReadAll(io.LimitReader(fh, MaxBytes+1))
	if err != nil {
		return nil, nil, err
	}
	if len(b) > MaxBytes {
		return nil, nil, fmt.Errorf("larger than %d bytes", MaxBytes)
	}
	var f file
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, nil, err
	}
	if f.Version != Version {
		return nil, nil, fmt.Errorf("format version %d, want %d", f.Version, Version)
	}
	if len(f.Peers) > MaxEntries {
		f.Peers = f.Peers[:MaxEntries]
	}
	if len(f.Convicted) > MaxConvicts {
		f.Convicted = f.Convicted[:MaxConvicts]
	}
	out := make([]session.FailureEntry, 0, len(f.Peers))
	for _, e := range f.Peers {
		p, err := peer.Decode(e.Peer)
		if err != nil {
			continue
		}
		out = append(out, session.FailureEntry{Peer: p, Until: e.Until})
	}
	var convicts []peer.ID
	for _, s := range f.Convicted {
		if p, err := peer.Decode(s); err == nil {
			convicts = append(convicts, p)
		}
	}
	return out, convicts, nil
}

// writeAtomic replaces path with b: a temporary file in the same
// directory, renamed over it, so a reader sees the old file or the new
// one, never half of one.
func writeAtomic(path string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+FileName+".*.tmp")
	if err != nil {
		return err
	}
	name := tmp.Name()
	_, err = tmp.Write(b)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(name, path)
	}
	if err != nil {
		os.Remove(name)
	}
	return err
}

func logger(log *slog.Logger) *slog.Logger {
	if log == nil {
		return slog.Default()
	}
	return log
}
