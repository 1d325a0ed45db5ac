package route

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"fmt"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"google.golang.org/protobuf/proto"

	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// Audits a tracker assigns (docs/trust.md): the ticket every hop sees
// carries only a commitment to the assignment; the client alone gets the
// opening, so no hop learns whether its session is audited.

// Proof protocol: /meshp2p/<network>/proof/1.0.0, one ProofSubmission
// with the proof as its blob, one ProofVerdict.
const (
	ProtoProof        = "proof"
	ProtoProofVersion = "1.0.0"
	// MaxProofBytes bounds a proof a tracker reads (the recorded inputs of
	// one session of one hop).
	MaxProofBytes = 256 << 20
)

const auditDomain = "meshp2p/audit-assignment/v1\x00"

// NewAuditAssignment draws an assignment for a route of n hops: audited
// with probability rate (draw: uniform in [0, 1)), one hop uniformly.
func NewAuditAssignment(rate float64, n int, draw func() float64) (*meshp2pb.AuditAssignment, error) {
	salt := make([]byte, 16)
	if _, err := rand.Read(salt); err != nil {
		return nil, err
	}
	a := &meshp2pb.AuditAssignment{Audit: draw() < rate, Salt: salt}
	if n > 0 {
		a.Hop = uint32(min(int(draw()*float64(n)), n-1))
	}
	return a, nil
}

// AuditCommitment is what a ticket carries of assignment a.
func AuditCommitment(a *meshp2pb.AuditAssignment) []byte {
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(a)
	h := sha256.Sum256(append([]byte(auditDomain), b...))
	return h[:]
}

// CheckAuditAssignment checks that a opens the commitment of ticket t and
// fits its route.
func CheckAuditAssignment(t *meshp2pb.RouteTicket, a *meshp2pb.AuditAssignment) error {
	if len(t.GetAuditCommitment()) == 0 {
		return ticketErr(ErrTicketInvalid, "an audit assignment for a ticket without a commitment")
	}
	if len(a.GetSalt()) != 16 || int(a.GetHop()) >= len(t.GetRoute().GetHops()) {
		return ticketErr(ErrTicketInvalid, "audit assignment: salt of %d bytes, hop %d of %d", len(a.GetSalt()), a.GetHop(), len(t.GetRoute().GetHops()))
	}
	if !bytes.Equal(AuditCommitment(a), t.GetAuditCommitment()) {
		return ticketErr(ErrTicketInvalid, "the audit assignment does not open the ticket's commitment")
	}
	return nil
}

// StreamOpener opens streams (a libp2p host).
type StreamOpener interface {
	NewStream(ctx context.Context, p peer.ID, pids ...protocol.ID) (network.Stream, error)
}

// SubmitProof sends a fraud proof to tracker and returns its verdict: the
// tracker replays it before it believes it.
func SubmitProof(ctx context.Context, h StreamOpener, pid protocol.ID, tracker peer.ID, proof *meshp2pb.Proof, lim frame.Limits) (*meshp2pb.ProofVerdict, error) {
	b, err := proto.Marshal(proof)
	if err != nil {
		return nil, err
	}
	if len(b) > MaxProofBytes {
		return nil, fmt.Errorf("proof of %d bytes, over %d", len(b), MaxProofBytes)
	}
	s, err := h.NewStream(ctx, tracker, pid)
	if err != nil {
		return nil, fmt.Errorf("open proof stream to %s: %w", tracker, err)
	}
	defer s.Close()
	stop := context.AfterFunc(ctx, func() { _ = s.Reset() })
	defer stop()
	lim.MaxPayload = max(lim.MaxPayload, MaxProofBytes)
	werr := frame.NewWriter(s, lim).WriteBlob(&meshp2pb.ProofSubmission{Size: uint64(len(b))}, b)
	_ = s.CloseWrite()
	// A tracker that refuses the proof (it judges none, too many in
	// flight) answers before reading it and stops reading: its verdict is
	// the reason the write failed.
	var v meshp2pb.ProofVerdict
	if err := frame.ReadMessage(s, &v, lim); err != nil {
		if werr != nil {
			return nil, fmt.Errorf("send proof: %w", werr)
		}
		return nil, fmt.Errorf("read verdict: %w", err)
	}
	return &v, nil
}
