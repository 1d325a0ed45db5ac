package p2p

import (
	"bytes"
	"crypto/sha256"
	"encoding/base32"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/pnet"
	"github.com/multiformats/go-multiaddr"
)

// A join token (issue 41 item 3) is everything a new member needs to
// join a swarm, in one copy-paste-safe word: the swarm name, the swarm
// key and bootstrap peers. It is a SECRET: it holds the swarm key, so
// anyone who has it can join the swarm. Never log it.
//
// Format: "mp1_" then lowercase RFC 4648 base32 without padding (the
// letters a-z and digits 2-7: a terminal's double click selects all of
// it, and nothing in it is special to a shell) of
//
//	body     = uvarint len, network name
//	           uvarint len (0: a public swarm, or 32), swarm key (the PSK)
//	           uvarint peers, then per peer:
//	             uvarint len, peer id (binary)
//	             uvarint addrs, then per address: uvarint len, multiaddr (binary, no /p2p)
//	checksum = SHA-256("meshp2p join token v1\x00" || body)[:4]
//
// The checksum catches a truncated or mistyped paste before anything is
// dialled. The "1" in the prefix is the format version.
const JoinTokenPrefix = "mp1_"

// Bounds of a join token (a decoder never allocates more).
const (
	maxTokenChars   = 4096
	maxTokenPeers   = 16
	maxTokenAddrs   = 16
	maxTokenAddrLen = 256
	tokenSumLen     = 4
)

// ErrJoinToken marks a join token that cannot be used. Its messages never
// quote the token.
var ErrJoinToken = errors.New("bad join token")

// JoinToken is a decoded join token.
type JoinToken struct {
	Network string
	// SwarmKey is the private swarm's pre-shared key (32 bytes); nil for
	// a public swarm.
	SwarmKey  pnet.PSK
	Bootstrap []peer.AddrInfo
}

var tokenB32 = base32.StdEncoding.WithPadding(base32.NoPadding)

// SwarmKeyFile is the swarm key in the swarm.key file format
// (Config.SwarmKey); nil for a public swarm.
func (t JoinToken) SwarmKeyFile() []byte {
	if len(t.SwarmKey) == 0 {
		return nil
	}
	return []byte(swarmKeyHeader + hex.EncodeToString(t.SwarmKey) + "\n")
}

// Encode returns the token's text.
func (t JoinToken) Encode() (string, error) {
	if !networkNameRE.MatchString(t.Network) {
		return "", fmt.Errorf("%w: network name %q must be 1-64 of [A-Za-z0-9._-]", ErrJoinToken, t.Network)
	}
	if n := len(t.SwarmKey); n != 0 && n != 32 {
		return "", fmt.Errorf("%w: swarm key of %d bytes, want 32", ErrJoinToken, n)
	}
	if n := len(t.Bootstrap); n == 0 || n > maxTokenPeers {
		return "", fmt.Errorf("%w: %d bootstrap peers, want 1-%d", ErrJoinToken, n, maxTokenPeers)
	}
	var b []byte
	b = appendBytes(b, []byte(t.Network))
	b = appendBytes(b, t.SwarmKey)
	b = binary.AppendUvarint(b, uint64(len(t.Bootstrap)))
	for _, ai := range t.Bootstrap {
		if ai.ID == "" || len(ai.Addrs) == 0 || len(ai.Addrs) > maxTokenAddrs {
			return "", fmt.Errorf("%w: a bootstrap peer needs a peer id and 1-%d addresses", ErrJoinToken, maxTokenAddrs)
		}
		b = appendBytes(b, []byte(ai.ID))
		b = binary.AppendUvarint(b, uint64(len(ai.Addrs)))
		for _, a := range ai.Addrs {
			if a, _ = peer.SplitAddr(a); a == nil {
				return "", fmt.Errorf("%w: an empty address", ErrJoinToken)
			}
			b = appendBytes(b, a.Bytes())
		}
	}
	s := JoinTokenPrefix + strings.ToLower(tokenB32.EncodeToString(append(b, tokenSum(b)...)))
	if len(s) > maxTokenChars {
		return "", fmt.Errorf("%w: %d characters, at most %d (fewer addresses)", ErrJoinToken, len(s), maxTokenChars)
	}
	return s, nil
}

func appendBytes(b, v []byte) []byte {
	return append(binary.AppendUvarint(b, uint64(len(v))), v...)
}

func tokenSum(body []byte) []byte {
	h := sha256.New()
	h.Write([]byte("meshp2p join token v1\x00"))
	h.Write(body)
	return h.Sum(nil)[:tokenSumLen]
}

var otherTokenVersion = regexp.MustCompile(`^mp([0-9]+)_`)

// DecodeJoinToken parses a join token. White space anywhere in s (a paste
// broken over lines) is ignored, and upper case is read as lower case.
// Errors wrap ErrJoinToken and never quote s.
func DecodeJoinToken(s string) (JoinToken, error) {
	s = strings.Join(strings.Fields(s), "")
	if len(s) > maxTokenChars {
		return JoinToken{}, fmt.Errorf("%w: %d characters, at most %d", ErrJoinToken, len(s), maxTokenChars)
	}
	low := strings.ToLower(s)
	rest, ok := strings.CutPrefix(low, JoinTokenPrefix)
	if !ok {
		if m := otherTokenVersion.FindStringSubmatch(low); m != nil {
			return JoinToken{}, fmt.Errorf("%w: a version %s token; this meshp2p reads version 1 (%s…): is one side older?", ErrJoinToken, m[1], JoinTokenPrefix)
		}
		return JoinToken{}, fmt.Errorf("%w: a join token begins with %q (meshp2p invite prints one)", ErrJoinToken, JoinTokenPrefix)
	}
	raw, err := tokenB32.DecodeString(strings.ToUpper(rest))
	if err != nil {
		return JoinToken{}, fmt.Errorf("%w: not base32 after %q (a character mistyped or lost in the paste?)", ErrJoinToken, JoinTokenPrefix)
	}
	if len(raw) < tokenSumLen+1 {
		return JoinToken{}, fmt.Errorf("%w: too short (a truncated paste?)", ErrJoinToken)
	}
	body, sum := raw[:len(raw)-tokenSumLen], raw[len(raw)-tokenSumLen:]
	if !bytes.Equal(sum, tokenSum(body)) {
		return JoinToken{}, fmt.Errorf("%w: checksum mismatch: the token was truncated or changed in the paste (copy the whole line meshp2p invite printed)", ErrJoinToken)
	}
	t, err := parseTokenBody(body)
	if err != nil {
		return JoinToken{}, fmt.Errorf("%w: %v", ErrJoinToken, err)
	}
	return t, nil
}

// tokenReader reads a token body's fields.
type tokenReader struct {
	b   []byte
	err error
}

func (r *tokenReader) uvarint(limit uint64, what string) int {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	switch {
	case n <= 0:
		r.err = fmt.Errorf("%s: bad length", what)
	case v > limit:
		r.err = fmt.Errorf("%s: %d, at most %d", what, v, limit)
	default:
		r.b = r.b[n:]
		return int(v)
	}
	return 0
}

func (r *tokenReader) bytes(limit uint64, what string) []byte {
	n := r.uvarint(limit, what)
	if r.err != nil {
		return nil
	}
	if n > len(r.b) {
		r.err = fmt.Errorf("%s: ends early", what)
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}

func parseTokenBody(body []byte) (JoinToken, error) {
	r := &tokenReader{b: body}
	var t JoinToken
	t.Network = string(r.bytes(64, "network name"))
	if key := r.bytes(32, "swarm key"); len(key) > 0 {
		t.SwarmKey = pnet.PSK(bytes.Clone(key))
	}
	npeers := r.uvarint(maxTokenPeers, "bootstrap peers")
	for i := 0; i < npeers && r.err == nil; i++ {
		id, err := peer.IDFromBytes(r.bytes(maxTokenAddrLen, "peer id"))
		if err != nil && r.err == nil {
			r.err = fmt.Errorf("peer id: %v", err)
		}
		ai := peer.AddrInfo{ID: id}
		naddrs := r.uvarint(maxTokenAddrs, "addresses")
		for j := 0; j < naddrs && r.err == nil; j++ {
			ab := r.bytes(maxTokenAddrLen, "address")
			if r.err != nil {
				break
			}
			a, err := multiaddr.NewMultiaddrBytes(ab)
			if err != nil || len(ab) == 0 {
				r.err = fmt.Errorf("address: not a multiaddr")
				break
			}
			ai.Addrs = append(ai.Addrs, a)
		}
		t.Bootstrap = append(t.Bootstrap, ai)
	}
	switch {
	case r.err != nil:
		return JoinToken{}, r.err
	case len(r.b) > 0:
		return JoinToken{}, fmt.Errorf("%d bytes after the last field", len(r.b))
	case !networkNameRE.MatchString(t.Network):
		return JoinToken{}, fmt.Errorf("network name %q must be 1-64 of [A-Za-z0-9._-]", t.Network)
	case len(t.SwarmKey) != 0 && len(t.SwarmKey) != 32:
		return JoinToken{}, fmt.Errorf("swarm key of %d bytes, want 32", len(t.SwarmKey))
	case npeers == 0 || peerWithoutAddr(t.Bootstrap):
		return JoinToken{}, fmt.Errorf("no bootstrap peer with an address")
	}
	return t, nil
}

// peerWithoutAddr reports whether some peer has no address.
func peerWithoutAddr(ais []peer.AddrInfo) bool {
	for _, ai := range ais {
		if len(ai.Addrs) == 0 {
			return true
		}
	}
	return false
}
