package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/neuron-tai/meshp2p/internal/dirlock"
	"github.com/neuron-tai/meshp2p/p2p"
)

// Lock files in a data dir: a node's (start, tracker), held while it runs,
// and a client's (generate, serve), held by the run using client.key.
const (
	nodeLockFile   = "node.lock"
	clientLockFile = "client.lock"
)

// lockDataDir keeps a second node off dir: two nodes there would share
// one identity (identity.key) and overwrite each other's node.json. The
// lock is the kernel's (flock) and ends with the process, so a lock file
// left by a node that died is taken over. An empty dir is left to the
// flags' check.
func lockDataDir(dir string) (unlock func(), err error) {
	if dir == "" {
		return func() {}, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("--data-dir: %w", err)
	}
	l, err := dirlock.Acquire(filepath.Join(dir, nodeLockFile))
	var held *dirlock.HeldError
	switch {
	case errors.As(err, &held) && held.PID != 0:
		return nil, fmt.Errorf("--data-dir %s is in use by another meshp2p node (pid %d, lock file %s): two nodes in one data dir would share one peer id and overwrite each other's node.json; stop that one, or give this one its own --data-dir",
			dir, held.PID, held.Path)
	case errors.As(err, &held):
		return nil, fmt.Errorf("--data-dir %s is in use by another meshp2p node (lock file %s); stop that one, or give this one its own --data-dir", dir, held.Path)
	case err != nil:
		return nil, fmt.Errorf("--data-dir: %w", err)
	}
	return l.Release, nil
}

// clientIdentity gives a client (generate, serve) its lasting identity in
// its data dir: client.key, apart from the identity.key of a node using
// the same dir (two peers, two ids), so its peer id stays the same from
// run to run (what --trusted-client names). Clients do not exclude each
// other: a run that finds client.key in use by another one running now
// (client.lock held) gets a temporary identity for this run instead of
// sharing the peer id. release ends the run's hold (and removes a
// temporary identity).
func clientIdentity(pc *p2p.Config, log *slog.Logger) (release func(), err error) {
	if err := os.MkdirAll(pc.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("--data-dir: %w", err)
	}
	pc.IdentityFile = p2p.ClientIdentityFile
	l, err := dirlock.Acquire(filepath.Join(pc.DataDir, clientLockFile))
	if err == nil {
		return l.Release, nil
	}
	if !errors.Is(err, dirlock.ErrHeld) {
		return nil, fmt.Errorf("--data-dir: %w", err)
	}
	tmp, terr := os.MkdirTemp("", "meshp2p-client-")
	if terr != nil {
		return nil, terr
	}
	pc.IdentityFile = filepath.Join(tmp, p2p.ClientIdentityFile)
	log.Info("another client run uses this data dir's identity now; this run has a temporary one", "data_dir", pc.DataDir, "holder", err)
	return func() { os.RemoveAll(tmp) }, nil
}
