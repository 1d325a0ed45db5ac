package session

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"google.golang.org/protobuf/proto"

	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// What a hop keeps for audits (docs/trust.md): for each session that asks
// for transcripts, the activation frames it sent its next hop (the next
// hop's inputs), the inputs of the positions it adopted from its prefix
// cache (adopted.go), on the head also its own input frames (token ids), on
// the tail the tokens and window results it sent the head (the origin
// checks the head's relay against them, relaycheck.go), and the
// statements of the hop before it (the head: the tail's) it checked.
// Bounded per session by n_ctx_needed × n_embd × 4 bytes of payload (the
// session's committed rows in f32; rows of rejected speculative windows
// count too, and what goes over is not kept: AuditRecords.truncated), by
// DefaultAuditKeepBytes per hop, and in time by DefaultAuditHold after the
// session ends.

const (
	// DefaultAuditHold is how long a hop keeps a session's records after it
	// ended: the origin fetches them right after the generation.
	DefaultAuditHold = 2 * time.Minute
	// DefaultAuditKeepBytes bounds the records a hop keeps, all sessions
	// together; ended sessions' go first, then new frames are not kept.
	DefaultAuditKeepBytes = 256 << 20
	// auditEndWait bounds how long a fetch waits for its session to end
	// here (a clean close reaches the last hops a moment after the origin).
	auditEndWait = 3 * time.Second
	// auditTransferBase and auditMinRate (bytes/s) bound sending one
	// fetch's records: a reader slower than that is cut off.
	auditTransferBase = 30 * time.Second
	auditMinRate      = 64 << 10
)

// kept is one (session, epoch)'s records on this hop.
type kept struct {
	mu         sync.Mutex
	hop        int
	limit      int64        // payload bytes this session may keep
	bytes      atomic.Int64 // kept (read by drop under the store's lock only)
	sent       []*meshp2pb.RecordedFrame
	inputs     []*meshp2pb.RecordedFrame
	ring       []*meshp2pb.StreamMessage // the tail's: what it sent the head
	statements []*meshp2pb.SignedTranscript
	adopted    []*meshp2pb.RecordedFrame // the inputs of the positions adopted from the prefix cache (adopted.go)
	truncated  bool
	ended      chan struct{}
	endedAt    time.Time
}

// auditStore holds every session's kept records on one hop.
type auditStore struct {
	mu    sync.Mutex
	m     map[Key]*kept
	total int64 // payload bytes kept
	max   int64
	hold  time.Duration
	now   func() time.Time
}

func newAuditStore(max int64, hold time.Duration) *auditStore {
	return &auditStore{m: map[Key]*kept{}, max: max, hold: hold, now: time.Now}
}

// open starts keeping a session's records (limit: its payload bound).
func (s *auditStore) open(key Key, hop int, limit int64) *kept {
	k := &kept{hop: hop, limit: limit, ended: make(chan struct{})}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expire()
	if old := s.m[key]; old != nil {
		s.total -= old.bytes.Load()
	}
	s.m[key] = k
	return k
}

// record keeps one frame (sent, or the head's input) if the bounds allow.
func (s *auditStore) record(k *kept, input bool, a *meshp2pb.ActivationHeader, payload []byte, overhead int) {
	n := int64(len(payload) + overhead)
	s.keep(k, n, func() {
		rf := &meshp2pb.RecordedFrame{Header: recordHeader(a), Payload: payload}
		if input {
			k.inputs = append(k.inputs, rf)
		} else {
			k.sent = append(k.sent, rf)
		}
	})
}

// keep runs add under k.mu when a record of n bytes fits the session's
// bound and the store's; past either, the session's records stay
// truncated. Nothing is kept once the session ended (a frame the head's
// ring still brought during teardown).
func (s *auditStore) keep(k *kept, n int64, add func()) {
	select {
	case <-k.ended:
		return
	default:
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.truncated || k.bytes.Load()+n > k.limit || !s.reserve(n) {
		k.truncated = true
		return
	}
	k.bytes.Add(n)
	add()
}

// ringOverhead is what one kept ring message counts against the
// session's bound besides its tokens.
const ringOverhead = 64

// recordRing keeps a token or window result the tail sent the head, with
// the fields its output digest covers (digestRing), if the bounds allow.
func (s *auditStore) recordRing(k *kept, msg *meshp2pb.StreamMessage) {
	var c *meshp2pb.StreamMessage
	var n int64
	switch {
	case msg.GetToken() != nil:
		t := msg.GetToken()
		c = &meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Token{Token: &meshp2pb.TokenFrame{SessionId: t.GetSessionId(), Epoch: t.GetEpoch(),
			Step: t.GetStep(), Token: t.GetToken(), Position: t.GetPosition(), Eos: t.GetEos()}}}
		n = ringOverhead
	case msg.GetWindowResult() != nil:
		w := msg.GetWindowResult()
		c = &meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_WindowResult{WindowResult: &meshp2pb.WindowResult{SessionId: w.GetSessionId(),
			Epoch: w.GetEpoch(), Step: w.GetStep(), SpecGen: w.GetSpecGen(), Position: w.GetPosition(), Tokens: slices.Clone(w.GetTokens()), Eos: w.GetEos()}}}
		n = ringOverhead + 4*int64(len(w.GetTokens()))
	default:
		return
	}
	s.keep(k, n, func() { k.ring = append(k.ring, c) })
}

// recordHeader is the header an audit needs (no timings).
func recordHeader(a *meshp2pb.ActivationHeader) *meshp2pb.ActivationHeader {
	c := proto.Clone(a).(*meshp2pb.ActivationHeader)
	c.HopUs, c.HopTiming = nil, nil
	return c
}

// reserve takes n bytes of the hop's budget, dropping ended sessions'
// records (oldest first) to make room.
func (s *auditStore) reserve(n int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.total+n > s.max {
		var oldest Key
		var at time.Time
		for key, k := range s.m {
			if !k.endedAt.IsZero() && (at.IsZero() || k.endedAt.Before(at)) {
				oldest, at = key, k.endedAt
			}
		}
		if at.IsZero() {
			return false
		}
		s.drop(oldest)
	}
	s.total += n
	return true
}

func (k *kept) keep(st *meshp2pb.SignedTranscript) {
	k.mu.Lock()
	k.statements = append(k.statements, st)
	k.mu.Unlock()
}

// end marks a session's records complete; they expire after hold.
func (s *auditStore) end(k *kept) {
	s.mu.Lock()
	k.endedAt = s.now()
	s.mu.Unlock()
	close(k.ended)
}

func (s *auditStore) drop(key Key) {
	if k := s.m[key]; k != nil {
		s.total -= k.bytes.Load()
		delete(s.m, key)
	}
}

// expire drops records held longer than hold (s.mu held).
func (s *auditStore) expire() {
	now := s.now()
	for key, k := range s.m {
		if !k.endedAt.IsZero() && now.Sub(k.endedAt) > s.hold {
			s.drop(key)
		}
	}
}

func (s *auditStore) get(key Key) *kept {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expire()
	return s.m[key]
}

// handleAudit answers an AuditFetch: only the session's origin may read
// its records.
func (h *HopService) handleAudit(st network.Stream) {
	defer st.Close()
	lim := h.cfg.Limits
	_ = st.SetDeadline(time.Now().Add(h.cfg.OpenTimeout + auditEndWait))
	w := frame.NewWriter(st, lim)
	msg, err := readFirst(st, lim) // a request is small: nothing large is read from a stranger
	req := msg.GetAuditFetch()
	refuse := func(code meshp2pb.ErrorCode, what string) {
		e := &meshp2pb.Error{Code: code, Message: what, PeerId: []byte(h.host.ID())}
		_ = w.WriteStream(&meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_AuditRecords{AuditRecords: &meshp2pb.AuditRecords{Error: e}}})
	}
	switch {
	case err != nil:
		refuse(frame.Code(err), err.Error())
		return
	case req == nil || len(req.GetSessionId()) != 16:
		refuse(meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "expected an audit fetch with a 16-byte session id")
		return
	}
	key := Key{Origin: st.Conn().RemotePeer(), Epoch: req.GetEpoch()}
	copy(key.ID[:], req.GetSessionId())
	k := h.audits.get(key) // keyed by origin: nobody else finds it
	if k == nil {
		refuse(meshp2pb.ErrorCode_ERROR_CODE_SESSION_UNKNOWN, "no records of this session here (never kept, expired, or not your session)")
		return
	}
	select {
	case <-k.ended:
	case <-time.After(auditEndWait):
		refuse(meshp2pb.ErrorCode_ERROR_CODE_TIMEOUT, "the session has not ended here")
		return
	}
	rec, frames, msgs, ok := k.part(req.GetPart())
	if !ok {
		refuse(meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "unknown audit part")
		return
	}
	// The transfer may take its bytes at auditMinRate, not the request's
	// short deadline: records of a long session are many megabytes.
	var size int64
	for _, f := range frames {
		size += int64(len(f.GetPayload()) + recordOverhead)
	}
	_ = st.SetDeadline(time.Now().Add(auditTransferBase + time.Duration(size/auditMinRate)*time.Second))
	if w.WriteStream(&meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_AuditRecords{AuditRecords: rec}}) != nil {
		return
	}
	for _, m := range msgs { // one per message: a long session's do not fit one header
		if w.WriteStream(m) != nil {
			return
		}
	}
	for _, f := range frames {
		var payload [][]byte
		if len(f.GetHeader().GetTensors()) > 0 {
			payload = [][]byte{f.GetPayload()}
		}
		hdr := proto.Clone(f.GetHeader()).(*meshp2pb.ActivationHeader) // the writer sets lengths and checksums
		if w.WriteStream(&meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Activation{Activation: hdr}}, payload...) != nil {
			return
		}
	}
}

// part is what k holds of part: the answer's header, and the frames or
// the messages (statements, ring messages) that follow it; ok false for
// an unknown part.
func (k *kept) part(part meshp2pb.AuditPart) (rec *meshp2pb.AuditRecords, frames []*meshp2pb.RecordedFrame, msgs []*meshp2pb.StreamMessage, ok bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	rec = &meshp2pb.AuditRecords{HopIndex: uint32(k.hop), Truncated: k.truncated}
	switch part {
	case meshp2pb.AuditPart_AUDIT_PART_SENT:
		frames = k.sent
	case meshp2pb.AuditPart_AUDIT_PART_INPUTS:
		frames = k.inputs
	case meshp2pb.AuditPart_AUDIT_PART_ADOPTED:
		frames = k.adopted
	case meshp2pb.AuditPart_AUDIT_PART_STATEMENTS:
		for _, st := range k.statements {
			msgs = append(msgs, &meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Transcript{Transcript: st}})
		}
	case meshp2pb.AuditPart_AUDIT_PART_RING:
		msgs = slices.Clone(k.ring)
	default:
		return nil, nil, nil, false
	}
	rec.Frames = uint32(len(frames) + len(msgs))
	return rec, frames, msgs, true
}
