package tracker

import (
	"context"
	"crypto/sha256"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"google.golang.org/protobuf/proto"

	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/route"
)

// Verified hops at the tracker (docs/trust.md): it assigns audits through
// its tickets (a commitment every hop sees; the opening only to the
// client), and it takes fraud proofs: one it has replayed and found to
// convict a peer makes it refuse tickets through that peer.

// Judge checks a fraud proof by replaying it (session.Judge over the
// layers the tracker holds): the peer it convicts, and why; convicted
// false when the replay agrees with the hop; an error when it could not
// check (no model to replay with, a malformed proof).
type Judge func(ctx context.Context, p *meshp2pb.Proof) (convicted bool, who peer.ID, reason string, err error)

const (
	// MaxConvicted bounds the convicted peers a tracker remembers.
	MaxConvicted = 4096
	// ProofTimeout bounds reading and judging one proof.
	ProofTimeout = 5 * time.Minute
)

// Conviction is a peer a verified proof convicted.
type Conviction struct {
	Peer   peer.ID   `json:"peer"`
	Reason string    `json:"reason"`
	At     time.Time `json:"at"`
	Proof  []byte    `json:"proof_sha256"` // SHA-256 of the proof's bytes
}

// publish (re)sets the tracker's signed advert: its roles and the newest
// convictions (route.MaxPublishedConvictions), which nodes that trust it
// honour (route.Table.TrustConvictions).
func (t *Tracker) publish() error {
	cs := t.Convicted()
	slices.SortFunc(cs, func(a, b Conviction) int { return a.At.Compare(b.At) })
	cs = cs[max(0, len(cs)-route.MaxPublishedConvictions):]
	ad := &meshp2pb.CapabilityAdvert{PeerId: []byte(t.p2p.ID()), Network: t.cfg.P2P.Network,
		Roles: []meshp2pb.Role{meshp2pb.Role_ROLE_TRACKER, meshp2pb.Role_ROLE_RELAY}, Version: t.cfg.P2P.Version,
		Reachability: meshp2pb.Reachability_REACHABILITY_PUBLIC}
	for _, c := range cs {
		ad.Convicted = append(ad.Convicted, &meshp2pb.Conviction{PeerId: []byte(c.Peer), ProofSha256: c.Proof, AtMs: c.At.UnixMilli()})
	}
	body, err := proto.Marshal(ad)
	if err != nil {
		return err
	}
	return t.p2p.Discovery().SetLocalAdvert([]string{Key}, body)
}

// Convicted lists the peers this tracker refuses tickets through.
func (t *Tracker) Convicted() []Conviction {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]Conviction, 0, len(t.convicted))
	for _, c := range t.convicted {
		out = append(out, c)
	}
	return out
}

// assignAudit draws the audit of one ticket (nil when the tracker assigns
// none) and commits to it in tk.
func (t *Tracker) assignAudit(tk *meshp2pb.RouteTicket) (*meshp2pb.AuditAssignment, error) {
	if t.cfg.AuditRate <= 0 {
		return nil, nil
	}
	a, err := route.NewAuditAssignment(t.cfg.AuditRate, len(tk.GetRoute().GetHops()), rand.Float64)
	if err != nil {
		return nil, err
	}
	tk.AuditCommitment = route.AuditCommitment(a)
	return a, nil
}

// handleProof reads one proof, judges it and answers the verdict; a
// conviction is remembered (bounded) and routes avoid the peer.
func (t *Tracker) handleProof(s network.Stream) {
	defer s.Close()
	_ = s.SetDeadline(time.Now().Add(ProofTimeout))
	lim := t.cfg.Limits
	lim.MaxPayload = route.MaxProofBytes
	answer := func(v *meshp2pb.ProofVerdict) { _ = frame.WriteMessage(s, v) }
	var sub meshp2pb.ProofSubmission
	b, err := frame.NewReader(s, lim).ReadBlob(&sub)
	if err != nil {
		answer(&meshp2pb.ProofVerdict{Error: frame.ToProto(err)})
		return
	}
	if t.cfg.Judge == nil {
		answer(&meshp2pb.ProofVerdict{Error: &meshp2pb.Error{Code: meshp2pb.ErrorCode_ERROR_CODE_UNSUPPORTED_VERSION, Message: "this tracker checks no proofs (start it with --audit-model)"}})
		return
	}
	p := &meshp2pb.Proof{}
	if err := proto.Unmarshal(b, p); err != nil {
		answer(&meshp2pb.ProofVerdict{Error: &meshp2pb.Error{Code: meshp2pb.ErrorCode_ERROR_CODE_MALFORMED, Message: "not a proof: " + err.Error()}})
		return
	}
	ctx, cancel := context.WithTimeout(t.bg, ProofTimeout)
	defer cancel()
	convicted, who, reason, err := t.cfg.Judge(ctx, p)
	if err != nil {
		t.log.Info("proof not verified", "from", s.Conn().RemotePeer(), "err", err)
		answer(&meshp2pb.ProofVerdict{Error: &meshp2pb.Error{Code: meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, Message: err.Error()}})
		return
	}
	if !convicted {
		answer(&meshp2pb.ProofVerdict{Reason: "the replay agrees with what the hop signed"})
		return
	}
	t.mu.Lock()
	if _, ok := t.convicted[who]; !ok && len(t.convicted) >= MaxConvicted {
		for q := range t.convicted { // a memory bound, not a policy
			delete(t.convicted, q)
			break
		}
	}
	sum := sha256.Sum256(b)
	t.convicted[who] = Conviction{Peer: who, Reason: reason, At: t.cfg.Now(), Proof: sum[:]}
	t.mu.Unlock()
	if err := t.publish(); err != nil {
		t.log.Warn("could not publish the conviction", "peer", who, "err", err)
	}
	t.log.Warn("fraud proof verified: no tickets through this peer from now on", "peer", who, "from", s.Conn().RemotePeer(), "reason", reason)
	answer(&meshp2pb.ProofVerdict{Convicted: true, PeerId: []byte(who), Reason: reason})
}

// String is for logs.
func (c Conviction) String() string { return fmt.Sprintf("%s (%s)", c.Peer, c.Reason) }
