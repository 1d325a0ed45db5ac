package p2p

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/libp2p/go-libp2p/core/pnet"
)

// swarmKeyHeader is the libp2p swarm.key v1 header, base16 encoding.
const swarmKeyHeader = "/key/swarm/psk/1.0.0/\n/base16/\n"

// maxSwarmKeyFile bounds what is read from a swarm key file.
const maxSwarmKeyFile = 1 << 10

// GenerateSwarmKey returns a new random swarm.key in the libp2p v1 format
// (header, /base16/, 64 hex digits, newline).
func GenerateSwarmKey() ([]byte, error) {
	var k [32]byte
	if _, err := rand.Read(k[:]); err != nil {
		return nil, fmt.Errorf("generating swarm key: %w", err)
	}
	return []byte(swarmKeyHeader + hex.EncodeToString(k[:]) + "\n"), nil
}

// WriteSwarmKey writes a new swarm key to path with mode 0600 and returns its
// fingerprint. It never overwrites: an existing file gives an error wrapping
// fs.ErrExist.
func WriteSwarmKey(path string) (fingerprint string, err error) {
	key, err := GenerateSwarmKey()
	if err != nil {
		return "", err
	}
	psk, err := DecodeSwarmKey(key)
	if err != nil {
		return "", err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", fmt.Errorf("creating swarm key file: %w", err)
	}
	if _, err := f.Write(key); err != nil {
		f.Close()
		os.Remove(path)
		return "", fmt.Errorf("writing swarm key file: %w", err)
	}
	if err := f.Close(); err != nil {
		os.Remove(path)
		return "", fmt.Errorf("writing swarm key file: %w", err)
	}
	return SwarmKeyFingerprint(psk), nil
}

// DecodeSwarmKey parses a libp2p swarm.key (v1; base16, base64 or bin).
func DecodeSwarmKey(b []byte) (pnet.PSK, error) {
	if len(b) > maxSwarmKeyFile {
		return nil, fmt.Errorf("swarm key: %d bytes is too large", len(b))
	}
	psk, err := pnet.DecodeV1PSK(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("swarm key: %w", err)
	}
	return psk, nil
}

// ReadSwarmKey reads and parses a swarm key file.
func ReadSwarmKey(path string) (pnet.PSK, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("opening swarm key: %w", err)
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("%w: %s has mode %04o: anyone who can read it can join the swarm; run chmod 600 %s",
			ErrSwarmKeyMode, path, st.Mode().Perm(), path)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxSwarmKeyFile+1))
	if err != nil {
		return nil, fmt.Errorf("reading swarm key: %w", err)
	}
	return DecodeSwarmKey(b)
}

// ErrSwarmKeyMode: the swarm key file is readable by group or others.
var ErrSwarmKeyMode = errors.New("swarm key file permissions too open")

// SwarmKeyFingerprint is a short, one-way identifier for a swarm key that
// operators can compare in logs: the first 8 bytes of
// SHA-256("meshp2p swarm key fingerprint v1\x00" || key), in hex. It reveals
// nothing useful about the key.
func SwarmKeyFingerprint(psk pnet.PSK) string {
	h := sha256.New()
	h.Write([]byte("meshp2p swarm key fingerprint v1\x00"))
	h.Write(psk)
	return hex.EncodeToString(h.Sum(nil)[:8])
}
