package p2p

import (
	"errors"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
)

func TestLoadOrCreateIdentity(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	k1, created, err := LoadOrCreateIdentity(dir)
	if err != nil || !created {
		t.Fatalf("first call: created=%v err=%v", created, err)
	}
	st, err := os.Stat(filepath.Join(dir, IdentityFile))
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("identity file mode %v, want 0600", st.Mode().Perm())
	}
	k2, created, err := LoadOrCreateIdentity(dir)
	if err != nil || created {
		t.Fatalf("second call: created=%v err=%v", created, err)
	}
	id1, _ := peer.IDFromPrivateKey(k1)
	id2, _ := peer.IDFromPrivateKey(k2)
	if id1 != id2 {
		t.Fatalf("reloaded identity %s, want %s", id2, id1)
	}

	if err := os.Chmod(filepath.Join(dir, IdentityFile), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := LoadOrCreateIdentity(dir); err == nil {
		t.Fatal("a world-readable identity file was accepted")
	}
	if err := os.WriteFile(filepath.Join(dir, IdentityFile), []byte("junk"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := LoadOrCreateIdentity(dir); err == nil {
		t.Fatal("a corrupt identity file was accepted")
	}
}

var swarmKeyRE = regexp.MustCompile(`^/key/swarm/psk/1\.0\.0/\n/base16/\n[0-9a-f]{64}\n$`)

func TestSwarmKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "swarm.key")
	fp, err := WriteSwarmKey(path)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !swarmKeyRE.Match(raw) {
		t.Fatalf("swarm key has the wrong format: %q", raw)
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o600 {
		t.Fatalf("swarm key mode %v, want 0600", st.Mode().Perm())
	}
	psk, err := ReadSwarmKey(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(psk) != 32 || SwarmKeyFingerprint(psk) != fp {
		t.Fatalf("decoded key len %d, fingerprint %s (want %s)", len(psk), SwarmKeyFingerprint(psk), fp)
	}
	// A key others can read is refused with the fix in the message.
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadSwarmKey(path); !errors.Is(err, ErrSwarmKeyMode) || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("world-readable swarm key: %v, want ErrSwarmKeyMode", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := WriteSwarmKey(path); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("overwriting: err = %v, want fs.ErrExist", err)
	}
	if again, _ := os.ReadFile(path); string(again) != string(raw) {
		t.Fatal("existing swarm key was modified")
	}
	other, _ := GenerateSwarmKey()
	opsk, _ := DecodeSwarmKey(other)
	if SwarmKeyFingerprint(opsk) == fp {
		t.Fatal("two keys share a fingerprint")
	}
	for _, bad := range []string{"", "/key/swarm/psk/1.0.0/\n/base16/\nzz", "/key/other/\n/base16/\n" + string(raw[len(raw)-65:])} {
		if _, err := DecodeSwarmKey([]byte(bad)); err == nil {
			t.Fatalf("DecodeSwarmKey(%q) accepted", bad)
		}
	}
}

func TestTestModePublicCIDR(t *testing.T) {
	a := multiaddr.StringCast("/ip4/203.0.113.7/tcp/1")
	if manet.IsPublicAddr(a) {
		t.Skip("203.0.113.0/24 already public in this process")
	}
	applyTestOptions(TestOptions{PublicCIDRs: []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}})
	if !manet.IsPublicAddr(a) {
		t.Fatal("test CIDR still not public after applyTestOptions")
	}
	if manet.IsPublicAddr(multiaddr.StringCast("/ip4/198.51.100.1/tcp/1")) {
		t.Fatal("an unrelated documentation range became public")
	}
}
