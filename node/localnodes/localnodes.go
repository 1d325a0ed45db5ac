// Package localnodes is the registry of the meshp2p processes serving on
// this machine for this user, which `meshp2p ps` lists: each `start` and
// `serve` keeps a small JSON file named by its pid in Dir,
// rewritten every few seconds with its peers and sessions, and removed
// when it stops. A file whose process is gone (killed, crashed) is
// skipped and removed by List.
package localnodes

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Entry is one process's record.
type Entry struct {
	PID     int       `json:"pid"`
	Role    string    `json:"role"` // start or serve
	Started time.Time `json:"started"`
	Updated time.Time `json:"updated"`
	DataDir string    `json:"data_dir,omitempty"`
	Network string    `json:"network,omitempty"`
	PeerID  string    `json:"peer_id,omitempty"`
	Model   string    `json:"model,omitempty"`
	// Layers is the served window, half-open "A-B" ("" : none).
	Layers   string `json:"layers,omitempty"`
	API      string `json:"api,omitempty"`
	Peers    int    `json:"peers"`
	Sessions int    `json:"sessions"`
}

// Dir is the registry: one per user, in the temporary directory.
func Dir() string { return filepath.Join(UserDir(), "nodes") }

// UserDir is this user's meshp2p directory in the temporary directory:
// meshp2p-<uid>, or meshp2p where there are no uids (Windows, whose
// temporary directory is the user's own).
func UserDir() string {
	if uid := os.Getuid(); uid >= 0 {
		return filepath.Join(os.TempDir(), fmt.Sprintf("meshp2p-%d", uid))
	}
	return filepath.Join(os.TempDir(), "meshp2p")
}

// maxEntryBytes bounds a registry file List reads.
const maxEntryBytes = 64 << 10

// Registration is this process's file in the registry.
type Registration struct {
	file string
	e    Entry
}

// Register writes e (PID and Started filled in) to dir.
func Register(dir string, e Entry) (*Registration, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("localnodes: %w", err)
	}
	e.PID = os.Getpid()
	if e.Started.IsZero() {
		e.Started = time.Now()
	}
	r := &Registration{file: filepath.Join(dir, strconv.Itoa(e.PID)+".json"), e: e}
	return r, r.Update(func(*Entry) {})
}

// Update changes the record with f and rewrites it (atomically: a reader
// sees the old file or the new one).
func (r *Registration) Update(f func(*Entry)) error {
	f(&r.e)
	r.e.Updated = time.Now()
	b, err := json.Marshal(r.e)
	if err != nil {
		return err
	}
	tmp := r.file + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("localnodes: %w", err)
	}
	if err := os.Rename(tmp, r.file); err != nil {
		return fmt.Errorf("localnodes: %w", err)
	}
	return nil
}

// Remove takes the record out of the registry.
func (r *Registration) Remove() { _ = os.Remove(r.file) }

// List reads the live records in dir, oldest first; records of processes
// that are gone are removed.
func List(dir string) ([]Entry, error) {
	ents, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("localnodes: %w", err)
	}
	var out []Entry
	for _, de := range ents {
		name, ok := strings.CutSuffix(de.Name(), ".json")
		pid, err := strconv.Atoi(name)
		if !ok || err != nil {
			continue
		}
		path := filepath.Join(dir, de.Name())
		if !Alive(pid) {
			_ = os.Remove(path)
			continue
		}
		if info, err := de.Info(); err != nil || info.Size() > maxEntryBytes {
			continue
		}
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		var e Entry
		if json.Unmarshal(b, &e) != nil || e.PID != pid {
			continue
		}
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b Entry) int { return a.Started.Compare(b.Started) })
	return out, nil
}
