package p2p

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/libp2p/go-libp2p/core/crypto"
)

// IdentityFile is the node key's file name inside the data directory. It
// holds a libp2p-marshalled Ed25519 private key (crypto.MarshalPrivateKey).
const IdentityFile = "identity.key"

// ClientIdentityFile is a client's key file (generate, serve) in the same
// directory: a node and a client sharing a data dir have two identities.
const ClientIdentityFile = "client.key"

// maxIdentityFile bounds what LoadOrCreateIdentity reads.
const maxIdentityFile = 4 << 10

// LoadOrCreateIdentity reads DataDir/identity.key, creating the directory
// (0700) and a new Ed25519 key (0600) if the file does not exist. created
// reports whether a new key was written. A key file readable by group or
// others is refused.
func LoadOrCreateIdentity(dataDir string) (key crypto.PrivKey, created bool, err error) {
	if dataDir == "" {
		return nil, false, fmt.Errorf("%w: empty data dir", ErrConfig)
	}
	return loadOrCreateIdentityFile(filepath.Join(dataDir, IdentityFile))
}

// identityPath is the key file cfg names: IdentityFile (inside DataDir
// unless absolute), else DataDir/identity.key.
func (c Config) identityPath() string {
	switch {
	case c.IdentityFile == "":
		return filepath.Join(c.DataDir, IdentityFile)
	case filepath.IsAbs(c.IdentityFile):
		return c.IdentityFile
	}
	return filepath.Join(c.DataDir, c.IdentityFile)
}

// loadOrCreateIdentityFile is LoadOrCreateIdentity for the key file at
// path (its directory created 0700 if missing).
func loadOrCreateIdentityFile(path string) (key crypto.PrivKey, created bool, err error) {
	key, err = readIdentity(path)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return key, false, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, false, fmt.Errorf("creating data dir: %w", err)
	}
	priv, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		return nil, false, fmt.Errorf("generating identity: %w", err)
	}
	raw, err := crypto.MarshalPrivateKey(priv)
	if err != nil {
		return nil, false, fmt.Errorf("encoding identity: %w", err)
	}
	// O_EXCL: two processes starting at once must not overwrite each other;
	// the loser reads the winner's key.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		key, err = readIdentity(path)
		return key, false, err
	}
	if err != nil {
		return nil, false, fmt.Errorf("creating identity file: %w", err)
	}
	if _, err := f.Write(raw); err != nil {
		f.Close()
		os.Remove(path)
		return nil, false, fmt.Errorf("writing identity file: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		os.Remove(path)
		return nil, false, fmt.Errorf("writing identity file: %w", err)
	}
	if err := f.Close(); err != nil {
		os.Remove(path)
		return nil, false, fmt.Errorf("writing identity file: %w", err)
	}
	return priv, true, nil
}

func readIdentity(path string) (crypto.PrivKey, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("identity file %s has mode %v; want 0600 (chmod 600 it)", path, st.Mode().Perm())
	}
	if st.Size() > maxIdentityFile {
		return nil, fmt.Errorf("identity file %s is too large (%d bytes)", path, st.Size())
	}
	raw := make([]byte, st.Size())
	if _, err := f.ReadAt(raw, 0); err != nil {
		return nil, fmt.Errorf("reading identity file: %w", err)
	}
	key, err := crypto.UnmarshalPrivateKey(raw)
	if err != nil {
		return nil, fmt.Errorf("decoding identity file %s: %w", path, err)
	}
	if key.Type() != crypto.Ed25519 {
		return nil, fmt.Errorf("identity file %s holds a %v key; want Ed25519", path, key.Type())
	}
	return key, nil
}
