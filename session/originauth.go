package session

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"google.golang.org/protobuf/proto"

	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// Origin authentication. The origin signs every epoch's SessionOpen with its
// libp2p key; each hop checks the signature against origin_peer_id before it
// reserves anything, so the origin a hop charges quotas and silence to is
// the peer that asked for the session at every position of the route, not
// only at the head (where the stream's sender is the origin). The same
// signature authorizes a newer epoch to end an older one: only the origin
// that opened a session can re-open it, whichever hops carry the new epoch.

// ErrOriginAuth: a SessionOpen that is unsigned, signed by another key than
// its origin's, too old, replayed, or (on the head) sent by another peer
// than its origin.
var ErrOriginAuth = errors.New("session open not authorized by its origin")

// originDomain separates these signatures from any other use of the key.
const originDomain = "meshp2p/session-open/v1\x00"

// originPayload is the byte string the origin signs: every field that
// decides what a session may hold and where it runs. Length-prefixed, so no
// two opens share one.
func originPayload(open *meshp2pb.SessionOpen) []byte {
	b := []byte(originDomain)
	field := func(v []byte) []byte {
		b = binary.AppendUvarint(b, uint64(len(v)))
		return append(b, v...)
	}
	b = field(open.GetOriginPeerId())
	b = field(open.GetSessionId())
	b = binary.AppendUvarint(b, open.GetEpoch())
	b = field([]byte(open.GetModelFingerprint()))
	rt := open.GetRoute()
	b = binary.AppendUvarint(b, uint64(rt.GetNLayer()))
	b = binary.AppendUvarint(b, rt.GetEpoch())
	b = binary.AppendUvarint(b, uint64(len(rt.GetHops())))
	for _, h := range rt.GetHops() {
		b = field(h.GetPeerId())
		b = binary.AppendUvarint(b, uint64(h.GetStart()))
		b = binary.AppendUvarint(b, uint64(h.GetEnd()))
	}
	b = binary.AppendUvarint(b, uint64(open.GetNCtxNeeded()))
	b = binary.AppendUvarint(b, uint64(open.GetMaxTokens()))
	b = binary.AppendVarint(b, open.GetIssuedAtMs())
	// What the tail samples with and whether hops keep transcripts: a hop
	// that relays the open must not change them (an audit replays the
	// tail with the origin's sampling).
	tail, _ := proto.MarshalOptions{Deterministic: true}.Marshal(&meshp2pb.SessionOpen{Sampling: open.GetSampling(),
		Generated: open.GetGenerated(), Speculation: open.GetSpeculation(), WireDtype: open.GetWireDtype(), Transcripts: open.GetTranscripts(), Standby: open.GetStandby(), Follows: open.GetFollows()})
	return field(tail)
}

// OpenDigest is the SHA-256 of what the origin signs of open: a hop's
// transcripts name the open they ran under (audit.go).
func OpenDigest(open *meshp2pb.SessionOpen) []byte {
	d := sha256.Sum256(originPayload(open))
	return d[:]
}

// SignOpen makes open the origin's: it sets origin_peer_id to key's peer,
// issued_at_ms to now and signs the open (origin_public_key too when the
// peer id does not embed the key). Sign after every change to the signed
// fields; hop_index, sampling and the rest may change freely.
func SignOpen(open *meshp2pb.SessionOpen, key crypto.PrivKey, now time.Time) error {
	if key == nil {
		return fmt.Errorf("%w: no origin key to sign with", ErrOriginAuth)
	}
	id, err := peer.IDFromPrivateKey(key)
	if err != nil {
		return fmt.Errorf("sign session open: %w", err)
	}
	open.OriginPeerId, open.IssuedAtMs, open.OriginPublicKey = []byte(id), now.UnixMilli(), nil
	if _, err := id.ExtractPublicKey(); err != nil {
		if open.OriginPublicKey, err = crypto.MarshalPublicKey(key.GetPublic()); err != nil {
			return fmt.Errorf("sign session open: %w", err)
		}
	}
	if open.OriginSignature, err = key.Sign(originPayload(open)); err != nil {
		return fmt.Errorf("sign session open: %w", err)
	}
	return nil
}

// VerifyOpenOrigin returns the origin that signed open, or an error wrapping
// ErrOriginAuth. It checks the signature only; freshness and replay are the
// hop's (originGuard).
func VerifyOpenOrigin(open *meshp2pb.SessionOpen) (peer.ID, error) {
	id, err := peer.IDFromBytes(open.GetOriginPeerId())
	if err != nil {
		return "", fmt.Errorf("%w: origin_peer_id: %v", ErrOriginAuth, err)
	}
	if len(open.GetOriginSignature()) == 0 {
		return "", fmt.Errorf("%w: open is not signed (origin %s)", ErrOriginAuth, id)
	}
	pub, err := id.ExtractPublicKey()
	if err != nil {
		if pub, err = crypto.UnmarshalPublicKey(open.GetOriginPublicKey()); err != nil {
			return "", fmt.Errorf("%w: origin %s: no usable public key: %v", ErrOriginAuth, id, err)
		}
		if !id.MatchesPublicKey(pub) {
			return "", fmt.Errorf("%w: origin_public_key is not %s's key", ErrOriginAuth, id)
		}
	}
	ok, err := pub.Verify(originPayload(open), open.GetOriginSignature())
	if err != nil || !ok {
		return "", fmt.Errorf("%w: bad signature for origin %s", ErrOriginAuth, id)
	}
	return id, nil
}

// originGuard is a hop's check of who opens sessions: the signature, that
// the open is fresh (OpenMaxAge plus clock skew), and that each signed
// (origin, session, epoch) is admitted once while fresh. Only admitted
// opens are remembered, and at most perOrigin fresh ones per origin, so
// one identity cannot fill the memory; when it is full of live entries it
// refuses new opens (NO_CAPACITY, retryable) rather than forget one, which
// would let it be replayed.
type originGuard struct {
	maxAge, skew   time.Duration
	max, perOrigin int
	now            func() time.Time

	mu     sync.Mutex
	seen   map[Key]time.Time // admitted opens, until they are too old to replay
	counts map[peer.ID]int   // entries of seen per origin
}

// errOpenMemoryFull: the hop remembers DefaultMaxOpenMemory fresh opens, or
// the origin DefaultMaxOpensPerOrigin.
var errOpenMemoryFull = errors.New("too many fresh session opens remembered")

func newOriginGuard(maxAge, skew time.Duration, max, perOrigin int, now func() time.Time) *originGuard {
	if now == nil {
		now = time.Now
	}
	return &originGuard{maxAge: maxAge, skew: skew, max: max, perOrigin: perOrigin, now: now, seen: map[Key]time.Time{}, counts: map[peer.ID]int{}}
}

// check verifies open's origin and freshness, and that this hop has not
// admitted it before; from is the stream's sender and idx this hop's
// position (the head admits only its origin).
func (g *originGuard) check(open *meshp2pb.SessionOpen, idx int, from peer.ID) (peer.ID, error) {
	origin, err := VerifyOpenOrigin(open)
	if err != nil {
		return "", err
	}
	if idx == 0 && from != origin {
		return "", fmt.Errorf("%w: the head admits a session only from its origin %s, not %s", ErrOriginAuth, origin, from)
	}
	issued, now := time.UnixMilli(open.GetIssuedAtMs()), g.now()
	switch {
	case issued.After(now.Add(g.skew)):
		return "", fmt.Errorf("%w: open issued %s in the future (check the origin's clock)", ErrOriginAuth, issued.Sub(now).Round(time.Second))
	case now.Sub(issued) > g.maxAge+g.skew:
		return "", fmt.Errorf("%w: open issued %s ago, more than %s (a replay, or the origin's clock is off)", ErrOriginAuth, now.Sub(issued).Round(time.Second), g.maxAge+g.skew)
	}
	key := keyOf(open)
	g.mu.Lock()
	until, ok := g.seen[key]
	g.mu.Unlock()
	if ok && now.Before(until) {
		return "", fmt.Errorf("%w: session %s was already opened here (replayed open)", ErrOriginAuth, key)
	}
	return origin, nil
}

// use records that key's open (issued at issued) was admitted: a second
// admission of the same key while the open is fresh is a replay. capped
// says whether the per-origin bound applies (not to trusted origins).
func (g *originGuard) use(key Key, issued time.Time, capped bool) error {
	now := g.now()
	g.mu.Lock()
	defer g.mu.Unlock()
	if until, ok := g.seen[key]; ok && now.Before(until) {
		return fmt.Errorf("%w: session %s was already opened here (replayed open)", ErrOriginAuth, key)
	}
	full := func() bool { return len(g.seen) >= g.max || (capped && g.counts[key.Origin] >= g.perOrigin) }
	if full() {
		for k, until := range g.seen {
			if !now.Before(until) {
				g.forget(k)
			}
		}
		if full() {
			return errOpenMemoryFull
		}
	}
	if _, ok := g.seen[key]; !ok {
		g.counts[key.Origin]++
	}
	g.seen[key] = issued.Add(g.maxAge + 2*g.skew)
	return nil
}

// forget drops k (g.mu held).
func (g *originGuard) forget(k Key) {
	delete(g.seen, k)
	if g.counts[k.Origin]--; g.counts[k.Origin] <= 0 {
		delete(g.counts, k.Origin)
	}
}
