package p2p

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/multiformats/go-multiaddr"
)

func testPeerID(t testing.TB) peer.ID {
	t.Helper()
	priv, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	id, err := peer.IDFromPrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func testToken(t testing.TB, key bool, addrs ...string) JoinToken {
	t.Helper()
	tok := JoinToken{Network: "mynet"}
	if key {
		tok.SwarmKey = bytes.Repeat([]byte{7}, 32)
	}
	ai := peer.AddrInfo{ID: testPeerID(t)}
	for _, a := range addrs {
		ai.Addrs = append(ai.Addrs, multiaddr.StringCast(a))
	}
	tok.Bootstrap = []peer.AddrInfo{ai}
	return tok
}

func sameToken(a, b JoinToken) bool {
	if a.Network != b.Network || !bytes.Equal(a.SwarmKey, b.SwarmKey) || len(a.Bootstrap) != len(b.Bootstrap) {
		return false
	}
	for i := range a.Bootstrap {
		x, y := a.Bootstrap[i], b.Bootstrap[i]
		if x.ID != y.ID || len(x.Addrs) != len(y.Addrs) {
			return false
		}
		for j := range x.Addrs {
			if !x.Addrs[j].Equal(y.Addrs[j]) {
				return false
			}
		}
	}
	return true
}

// A token decodes to what was encoded: private and public swarms, one
// or several addresses and peers; white space and upper case in a paste
// are forgiven.
func TestJoinTokenRoundTrip(t *testing.T) {
	two := testToken(t, true, "/ip4/192.0.2.7/tcp/4001")
	two.Bootstrap = append(two.Bootstrap, testToken(t, true, "/ip6/::1/tcp/4001", "/dns/example.org/tcp/4001").Bootstrap...)
	for name, tok := range map[string]JoinToken{
		"private, one address": testToken(t, true, "/ip4/127.0.0.1/tcp/14001"),
		"public swarm":         testToken(t, false, "/ip4/192.0.2.7/tcp/4001", "/ip4/192.0.2.7/udp/4001/quic-v1"),
		"two peers":            two,
	} {
		t.Run(name, func(t *testing.T) {
			s, err := tok.Encode()
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(s, JoinTokenPrefix) || strings.Trim(s[len(JoinTokenPrefix):], "abcdefghijklmnopqrstuvwxyz234567") != "" {
				t.Fatalf("token %q is not mp1_ and lowercase base32", s)
			}
			t.Logf("%d characters", len(s))
			for _, paste := range []string{s, strings.ToUpper(s), "  " + s[:20] + "\n  " + s[20:] + "\n"} {
				got, err := DecodeJoinToken(paste)
				if err != nil {
					t.Fatal(err)
				}
				if !sameToken(got, tok) {
					t.Fatalf("decoded %+v, want %+v", got, tok)
				}
			}
			if tok.SwarmKey != nil {
				psk, err := DecodeSwarmKey(tok.SwarmKeyFile())
				if err != nil || !bytes.Equal(psk, tok.SwarmKey) {
					t.Fatalf("SwarmKeyFile: %v", err)
				}
			}
		})
	}
}

// Damaged tokens are refused with a reason and without quoting the
// token: a truncated paste, one changed character, another prefix or
// version, nothing after the prefix.
func TestJoinTokenCorrupt(t *testing.T) {
	s, err := testToken(t, true, "/ip4/127.0.0.1/tcp/14001").Encode()
	if err != nil {
		t.Fatal(err)
	}
	flip := []byte(s)
	if flip[30] == 'a' {
		flip[30] = 'b'
	} else {
		flip[30] = 'a'
	}
	for _, c := range []struct{ name, in, want string }{
		{"empty", "", "begins with"},
		{"another prefix", "xy1_" + s[4:], "begins with"},
		{"a later version", "mp2_" + s[4:], "a version 2 token"},
		{"prefix only", JoinTokenPrefix, "too short"},
		{"truncated by one", s[:len(s)-1], "checksum"},
		{"truncated by half", s[:len(s)/2], "checksum"},
		{"one character changed", string(flip), "checksum"},
		{"not base32", s[:20] + "!" + s[21:], "not base32"},
		{"too long", JoinTokenPrefix + strings.Repeat("a", maxTokenChars), "at most"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := DecodeJoinToken(c.in)
			if !errors.Is(err, ErrJoinToken) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err %v, want one with %q", err, c.want)
			}
			if len(c.in) > 12 && strings.Contains(err.Error(), c.in[4:12]) {
				t.Fatalf("the error quotes the token: %v", err)
			}
		})
	}
	// Encode refuses what could not be joined with.
	for name, tok := range map[string]JoinToken{
		"no peers":     {Network: "n", SwarmKey: bytes.Repeat([]byte{1}, 32)},
		"bad network":  testToken(t, true, "/ip4/127.0.0.1/tcp/1"),
		"short key":    testToken(t, true, "/ip4/127.0.0.1/tcp/1"),
		"no addresses": testToken(t, true),
	} {
		switch name {
		case "bad network":
			tok.Network = "a b"
		case "short key":
			tok.SwarmKey = tok.SwarmKey[:16]
		}
		if _, err := tok.Encode(); !errors.Is(err, ErrJoinToken) {
			t.Errorf("%s: Encode err %v", name, err)
		}
	}
}

// FuzzDecodeJoinToken: the decoder never panics, and what it accepts
// encodes back to a token that decodes to the same.
func FuzzDecodeJoinToken(f *testing.F) {
	s, err := testToken(f, true, "/ip4/127.0.0.1/tcp/14001", "/dns/example.org/tcp/4001").Encode()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(s)
	f.Add(s[:len(s)-3])
	f.Add("mp1_")
	f.Add("mp1_aaaa")
	f.Fuzz(func(t *testing.T, in string) {
		tok, err := DecodeJoinToken(in)
		if err != nil {
			if !errors.Is(err, ErrJoinToken) {
				t.Fatalf("error %v does not wrap ErrJoinToken", err)
			}
			return
		}
		again, err := tok.Encode()
		if err != nil {
			t.Fatalf("decoded token does not encode: %v", err)
		}
		back, err := DecodeJoinToken(again)
		if err != nil || !sameToken(back, tok) {
			t.Fatalf("re-encoded token: %v", err)
		}
	})
}

// A host:port under a swarm key yields the listener's peer id; another
// key, or none, does not.
func TestProbePeerID(t *testing.T) {
	k1, _ := GenerateSwarmKey()
	k2, _ := GenerateSwarmKey()
	n := newTestNode(t, func(c *Config) { c.SwarmKey = k1; c.ListenAddrs = []string{"/ip4/127.0.0.1/tcp/0"} })
	var hostport string
	for _, a := range n.Addrs() {
		ip, _ := a.ValueForProtocol(multiaddr.P_IP4)
		port, err := a.ValueForProtocol(multiaddr.P_TCP)
		if err == nil && ip != "" {
			hostport = ip + ":" + port
		}
	}
	if hostport == "" {
		t.Fatalf("no TCP address in %v", n.Addrs())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	id, err := ProbePeerID(ctx, hostport, mustPSK(t, k1))
	if err != nil || id != n.ID() {
		t.Fatalf("ProbePeerID = %s, %v; want %s", id, err, n.ID())
	}
	t.Logf("learnt %s from %s in %v", id, hostport, time.Since(start))
	// Another key: the listener reads noise and may wait for more of it;
	// the probe gives up when its context ends (2 s here, 10 s at most).
	wrong, cancelWrong := context.WithTimeout(ctx, 2*time.Second)
	defer cancelWrong()
	if _, err := ProbePeerID(wrong, hostport, mustPSK(t, k2)); err == nil {
		t.Fatal("a probe with another swarm key learnt a peer id")
	}
	if _, err := ProbePeerID(ctx, hostport, nil); !errors.Is(err, ErrProbeNeedsKey) {
		t.Fatalf("a probe without a key: %v", err)
	}
	// The node still works after the probes: a member connects.
	m := newTestNode(t, func(c *Config) {
		c.SwarmKey = k1
		c.ListenAddrs = []string{"/ip4/127.0.0.1/tcp/0"}
		c.Bootstrap = []peer.AddrInfo{{ID: id, Addrs: []multiaddr.Multiaddr{multiaddr.StringCast("/ip4/" + strings.Replace(hostport, ":", "/tcp/", 1))}}}
	})
	waitFor(ctx, t, "the member to connect", func() bool { return m.PeerCount() > 0 })
}
