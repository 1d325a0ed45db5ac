package p2p

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/record"
	"github.com/multiformats/go-multiaddr"
	"golang.org/x/time/rate"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/neuron-tai/meshp2p/p2p/peerlimit"
)

// Advert validation errors. The gossip validator rejects (and scores down
// the forwarding peer for) every one except ErrAdvertReplayed, which it
// ignores: an older advert can arrive after a newer one through another mesh
// path without anyone misbehaving.
var (
	ErrAdvertUnsigned     = errors.New("advert: not signed")
	ErrAdvertBadSignature = errors.New("advert: bad signature")
	ErrAdvertMalformed    = errors.New("advert: malformed")
	ErrAdvertOversized    = errors.New("advert: too large")
	ErrAdvertStale        = errors.New("advert: stale")
	ErrAdvertReplayed     = errors.New("advert: replayed")
	ErrAdvertSigner       = errors.New("advert: signer is not the source")
	// ErrAdvertRateLimited: the author publishes faster than the per-author
	// limit; the advert is dropped without penalty.
	ErrAdvertRateLimited = errors.New("advert: author rate limited")
)

// advertCodec is the envelope payload type of an advert record.
var advertCodec = []byte("/meshp2p/advert-record")

// maxAdvertAddrs and maxAdvertAddrLen bound Advert.Addrs.
const (
	maxAdvertAddrs   = 32
	maxAdvertAddrLen = 256
)

// advertRecord is the signed payload. Wire format (protobuf, hand-encoded;
// unknown fields are skipped so fields can be added):
//
//	1 peer        bytes   peer id of the signer
//	2 seq         uint64  strictly increasing per peer (unix nanos at issue)
//	3 issued_ms   int64   unix milliseconds
//	4 expires_ms  int64   unix milliseconds
//	5 keys        repeated string
//	6 body        bytes   opaque to p2p
//	7 addrs       repeated bytes (binary multiaddrs)
//	8 withdrawn   bool    tombstone: the peer left
type advertRecord struct {
	domain    string // signature domain, "/meshp2p/<network>/advert"
	Peer      peer.ID
	Seq       uint64
	IssuedAt  time.Time
	ExpiresAt time.Time
	Keys      []string
	Body      []byte
	Addrs     []multiaddr.Multiaddr
	Withdrawn bool
}

func advertDomain(network string) string { return "/meshp2p/" + network + "/advert" }

func (r *advertRecord) Domain() string { return r.domain }
func (r *advertRecord) Codec() []byte  { return advertCodec }

func (r *advertRecord) MarshalRecord() ([]byte, error) {
	var b []byte
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendBytes(b, []byte(r.Peer))
	b = protowire.AppendTag(b, 2, protowire.VarintType)
	b = protowire.AppendVarint(b, r.Seq)
	b = protowire.AppendTag(b, 3, protowire.VarintType)
	b = protowire.AppendVarint(b, uint64(r.IssuedAt.UnixMilli()))
	b = protowire.AppendTag(b, 4, protowire.VarintType)
	b = protowire.AppendVarint(b, uint64(r.ExpiresAt.UnixMilli()))
	for _, k := range r.Keys {
		b = protowire.AppendTag(b, 5, protowire.BytesType)
		b = protowire.AppendString(b, k)
	}
	if len(r.Body) > 0 {
		b = protowire.AppendTag(b, 6, protowire.BytesType)
		b = protowire.AppendBytes(b, r.Body)
	}
	for _, a := range r.Addrs {
		b = protowire.AppendTag(b, 7, protowire.BytesType)
		b = protowire.AppendBytes(b, a.Bytes())
	}
	if r.Withdrawn {
		b = protowire.AppendTag(b, 8, protowire.VarintType)
		b = protowire.AppendVarint(b, 1)
	}
	return b, nil
}

func (r *advertRecord) UnmarshalRecord(b []byte) error {
	*r = advertRecord{domain: r.domain}
	var ts advertTimes
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		m, err := r.consumeField(num, typ, b[n:], &ts)
		if err != nil {
			return err
		}
		b = b[n+m:]
	}
	if r.Peer == "" || !ts.haveIssued || !ts.haveExpires || r.Seq == 0 {
		return errors.New("missing required field")
	}
	r.IssuedAt = time.UnixMilli(ts.issued)
	r.ExpiresAt = time.UnixMilli(ts.expires)
	return nil
}

// advertTimes are the record's timestamps (Unix ms) while it is decoded.
type advertTimes struct {
	issued, expires         int64
	haveIssued, haveExpires bool
}

// consumeField decodes the value of field num (of wire type typ) at the
// start of b into r or ts, skipping unknown fields, and returns its length.
func (r *advertRecord) consumeField(num protowire.Number, typ protowire.Type, b []byte, ts *advertTimes) (int, error) {
	switch {
	case typ == protowire.VarintType && (num == 2 || num == 3 || num == 4 || num == 8):
		v, n := protowire.ConsumeVarint(b)
		if n < 0 {
			return 0, protowire.ParseError(n)
		}
		switch num {
		case 2:
			r.Seq = v
		case 3:
			ts.issued, ts.haveIssued = int64(v), true
		case 4:
			ts.expires, ts.haveExpires = int64(v), true
		case 8:
			r.Withdrawn = v != 0
		}
		return n, nil
	case typ == protowire.BytesType && (num == 1 || num == 5 || num == 6 || num == 7):
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return 0, protowire.ParseError(n)
		}
		return n, r.setBytesField(num, v)
	default:
		n := protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return 0, protowire.ParseError(n)
		}
		return n, nil
	}
}

// setBytesField sets the length-delimited field num (1, 5, 6 or 7) to v.
func (r *advertRecord) setBytesField(num protowire.Number, v []byte) error {
	switch num {
	case 1:
		id, err := peer.IDFromBytes(v)
		if err != nil {
			return fmt.Errorf("peer id: %w", err)
		}
		r.Peer = id
	case 5:
		r.Keys = append(r.Keys, string(v))
	case 6:
		r.Body = bytes.Clone(v)
	case 7:
		if len(v) > maxAdvertAddrLen {
			return fmt.Errorf("address of %d bytes", len(v))
		}
		a, err := multiaddr.NewMultiaddrBytes(v)
		if err != nil {
			return fmt.Errorf("address: %w", err)
		}
		r.Addrs = append(r.Addrs, a)
	}
	return nil
}

// sealAdvert signs rec with key and returns the marshalled envelope.
func sealAdvert(rec *advertRecord, key crypto.PrivKey) ([]byte, error) {
	env, err := record.Seal(rec, key)
	if err != nil {
		return nil, fmt.Errorf("signing advert: %w", err)
	}
	return env.Marshal()
}

// maxEnvelopeSize bounds a signed advert on the wire for cfg.
func maxEnvelopeSize(cfg DiscoveryConfig) int {
	return cfg.MaxBody + cfg.MaxKeys*(cfg.MaxKeyLen+3) + maxAdvertAddrs*(maxAdvertAddrLen+3) + 1024
}

// advertChecker validates signed adverts and remembers the highest sequence
// number accepted per peer (replay protection). Entries are dropped once
// older than MaxAge + ClockSkew: any replay of an advert that old is stale.
type advertChecker struct {
	domain  string
	cfg     DiscoveryConfig
	authors *peerlimit.Limiter // adverts per author

	mu      sync.Mutex
	lastSeq *peerlimit.Table[seqSeen] // least recently heard first
}

type seqSeen struct {
	seq uint64
	at  time.Time
}

func newAdvertChecker(network string, cfg DiscoveryConfig) *advertChecker {
	return &advertChecker{domain: advertDomain(network), cfg: cfg,
		authors: peerlimit.NewLimiter(rate.Every(authorRefill), authorBurst, maxSeqState),
		lastSeq: peerlimit.NewTable[seqSeen](maxSeqState)}
}

// open verifies the envelope and the record's fields, without the replay
// check. source is the peer the advert claims to come from (the gossip
// message author, or the peer a Lookup asked).
func (c *advertChecker) open(source peer.ID, data []byte, now time.Time) (*advertRecord, error) {
	if len(data) > maxEnvelopeSize(c.cfg) {
		return nil, fmt.Errorf("%w: %d bytes", ErrAdvertOversized, len(data))
	}
	env, err := record.UnmarshalEnvelope(data)
	if err != nil || env.PublicKey == nil {
		return nil, fmt.Errorf("%w: not a signed envelope", ErrAdvertUnsigned)
	}
	if !bytes.Equal(env.PayloadType, advertCodec) {
		return nil, fmt.Errorf("%w: payload type %q", ErrAdvertMalformed, env.PayloadType)
	}
	rec := &advertRecord{domain: c.domain}
	if _, err := record.ConsumeTypedEnvelope(data, rec); err != nil {
		if errors.Is(err, record.ErrInvalidSignature) {
			return nil, fmt.Errorf("%w: %v", ErrAdvertBadSignature, err)
		}
		return nil, fmt.Errorf("%w: %v", ErrAdvertMalformed, err)
	}
	signer, err := peer.IDFromPublicKey(env.PublicKey)
	if err != nil {
		return nil, fmt.Errorf("%w: signer key: %v", ErrAdvertMalformed, err)
	}
	if rec.Peer != signer {
		return nil, fmt.Errorf("%w: advert for %s signed by %s", ErrAdvertSigner, rec.Peer, signer)
	}
	if source != signer {
		return nil, fmt.Errorf("%w: from %s, signed by %s", ErrAdvertSigner, source, signer)
	}
	if len(rec.Body) > c.cfg.MaxBody {
		return nil, fmt.Errorf("%w: body of %d bytes", ErrAdvertOversized, len(rec.Body))
	}
	if len(rec.Keys) > c.cfg.MaxKeys {
		return nil, fmt.Errorf("%w: %d keys", ErrAdvertOversized, len(rec.Keys))
	}
	for _, k := range rec.Keys {
		if len(k) > c.cfg.MaxKeyLen {
			return nil, fmt.Errorf("%w: key of %d bytes", ErrAdvertOversized, len(k))
		}
		if k == "" {
			return nil, fmt.Errorf("%w: empty key", ErrAdvertMalformed)
		}
	}
	if len(rec.Addrs) > maxAdvertAddrs {
		return nil, fmt.Errorf("%w: %d addresses", ErrAdvertOversized, len(rec.Addrs))
	}
	if rec.ExpiresAt.Before(rec.IssuedAt) {
		return nil, fmt.Errorf("%w: expires before it was issued", ErrAdvertMalformed)
	}
	if rec.IssuedAt.After(now.Add(c.cfg.ClockSkew)) {
		return nil, fmt.Errorf("%w: issued %v in the future", ErrAdvertStale, rec.IssuedAt.Sub(now))
	}
	if now.Sub(rec.IssuedAt) > c.cfg.MaxAge {
		return nil, fmt.Errorf("%w: issued %v ago", ErrAdvertStale, now.Sub(rec.IssuedAt).Round(time.Millisecond))
	}
	if !rec.ExpiresAt.After(now) {
		return nil, fmt.Errorf("%w: expired %v ago", ErrAdvertStale, now.Sub(rec.ExpiresAt).Round(time.Millisecond))
	}
	return rec, nil
}

// accept runs open and the replay check, and on success records rec.Seq as
// the highest seen from its peer. Check and update are atomic, so two copies
// of one advert validated concurrently are accepted once.
func (c *advertChecker) accept(source peer.ID, data []byte, now time.Time) (*advertRecord, error) {
	rec, err := c.open(source, data, now)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if last, ok := c.lastSeq.Peek(rec.Peer); ok && rec.Seq <= last.seq {
		return nil, fmt.Errorf("%w: seq %d, already saw %d", ErrAdvertReplayed, rec.Seq, last.seq)
	}
	// Per-author rate limit: a burst, then one advert per authorRefill.
	// Withdrawals always pass (they end the author's presence) and take a
	// token if there is one.
	if !c.authors.Allow(rec.Peer, now) && !rec.Withdrawn {
		return nil, fmt.Errorf("%w: %s publishes faster than one advert per %v", ErrAdvertRateLimited, rec.Peer, authorRefill)
	}
	c.lastSeq.Put(rec.Peer, seqSeen{seq: rec.Seq, at: now})
	return rec, nil
}

// Gossip bounds per author and for the replay state.
const (
	// authorBurst adverts at once, then one per authorRefill: honest nodes
	// re-publish every RepublishInterval and when capacity changes, paced
	// to publishBurst and authorRefill (publishLoop).
	authorBurst  = 10
	authorRefill = 2 * time.Second
	// publishBurst is this node's own burst (publishLoop): half of what
	// receivers allow, so gossip delays that bunch its adverts up stay
	// within their limit.
	publishBurst = authorBurst / 2
	// maxSeqState bounds the replay state and the per-author buckets
	// (peers remembered); past it the least recently heard peer is
	// forgotten.
	maxSeqState = 2 * maxTableSize
)

// lastSeen is the highest seq gossip has accepted from p (adverts and
// tombstones), if any is remembered.
func (c *advertChecker) lastSeen(p peer.ID) (uint64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.lastSeq.Peek(p)
	return s.seq, ok
}

// envelopeSigner returns the peer whose key signed the envelope (not yet
// verified: open does that).
func envelopeSigner(data []byte) (peer.ID, error) {
	env, err := record.UnmarshalEnvelope(data)
	if err != nil || env.PublicKey == nil {
		return "", fmt.Errorf("%w: not a signed envelope", ErrAdvertUnsigned)
	}
	id, err := peer.IDFromPublicKey(env.PublicKey)
	if err != nil {
		return "", fmt.Errorf("%w: signer key: %v", ErrAdvertMalformed, err)
	}
	return id, nil
}

// prune drops replay state older than MaxAge + ClockSkew.
func (c *advertChecker) prune(now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	horizon := c.cfg.MaxAge + c.cfg.ClockSkew
	c.lastSeq.DeleteFunc(func(_ peer.ID, s seqSeen) bool { return now.Sub(s.at) > horizon })
}
