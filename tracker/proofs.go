package tracker

import (
	"context"
	"crypto/sha256"
	"errors"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"google.golang.org/protobuf/proto"

	"github.com/neuron-tai/meshp2p/p2p"
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

// publish (re)sets the tracker's signed advert: its roles and the
// convictions that fit it, which nodes that trust it honour
// (route.Table.TrustConvictions). The advert body is bounded
// (p2p.DiscoveryConfig.MaxBody, 16 KiB by default: about 190
// convictions), so when they do not all fit, the rule is: convictions of
// peers that advertise shards now first (those are the ones routes could
// take), then the newest; at most route.MaxPublishedConvictions. Throwaway
// keys convicted by the hundred therefore never push out the conviction of
// a peer that serves: a real conviction is always published.
func (t *Tracker) publish() error {
	cs := t.Convicted()
	serving := map[peer.ID]bool{}
	for _, s := range t.table.Shards("") {
		serving[s.Peer] = true
	}
	slices.SortFunc(cs, func(a, b Conviction) int { // kept first
		if serving[a.Peer] != serving[b.Peer] {
			if serving[a.Peer] {
				return -1
			}
			return 1
		}
		return b.At.Compare(a.At)
	})
	cs = cs[:min(len(cs), route.MaxPublishedConvictions)]
	for {
		body, err := t.advertBody(cs)
		if err != nil {
			return err
		}
		err = t.p2p.Discovery().SetLocalAdvert([]string{Key}, body)
		if !errors.Is(err, p2p.ErrAdvertTooLarge) || len(cs) == 0 {
			return err
		}
		cs = cs[:len(cs)-max(1, len(cs)/16)] // the last kept go first
	}
}

// advertBody is the tracker's advert with convictions cs, newest last.
func (t *Tracker) advertBody(cs []Conviction) ([]byte, error) {
	ad := &meshp2pb.CapabilityAdvert{PeerId: []byte(t.p2p.ID()), Network: t.cfg.P2P.Network,
		Roles: []meshp2pb.Role{meshp2pb.Role_ROLE_TRACKER, meshp2pb.Role_ROLE_RELAY}, Version: t.cfg.P2P.Version,
		Reachability: meshp2pb.Reachability_REACHABILITY_PUBLIC}
	sorted := slices.Clone(cs)
	slices.SortFunc(sorted, func(a, b Conviction) int { return a.At.Compare(b.At) })
	for _, c := range sorted {
		ad.Convicted = append(ad.Convicted, &meshp2pb.Conviction{PeerId: []byte(c.Peer), ProofSha256: c.Proof, AtMs: c.At.UnixMilli()})
	}
	return proto.Marshal(ad)
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
// conviction is remembered (bounded) and routes avoid the peer. What a
// proof may cost is bounded by the proof gate (proofgate.go): a tracker
// that judges no proofs refuses before reading a byte. Every slot the
// proof held (in flight, memory, judging) is given back before the
// verdict is written: a client that submits its next proof as soon as it
// reads this verdict is not refused as "a proof of yours is in flight".
func (t *Tracker) handleProof(s network.Stream) {
	defer s.Close()
	v := t.readAndJudge(s)
	_ = s.SetWriteDeadline(time.Now().Add(ProofGrace))
	_ = frame.WriteMessage(s, v)
	_ = s.CloseWrite()
}

// readAndJudge admits, reads and judges the proof on s; what it holds is
// given back when it returns.
func (t *Tracker) readAndJudge(s network.Stream) *meshp2pb.ProofVerdict {
	refuse := func(code meshp2pb.ErrorCode, msg string) *meshp2pb.ProofVerdict {
		return &meshp2pb.ProofVerdict{Error: &meshp2pb.Error{Code: code, Message: msg}}
	}
	if t.cfg.Judge == nil {
		return refuse(meshp2pb.ErrorCode_ERROR_CODE_UNSUPPORTED_VERSION, "this tracker checks no proofs (start it with --audit-model)")
	}
	from := s.Conn().RemotePeer()
	done, err := t.proofs.admit(from, t.cfg.Now())
	if err != nil {
		return refuse(meshp2pb.ErrorCode_ERROR_CODE_NO_CAPACITY, err.Error())
	}
	defer done()
	rd := t.proofs.reader(s, time.Now())
	defer rd.release()
	lim := t.cfg.Limits
	lim.MaxPayload = route.MaxProofBytes
	var sub meshp2pb.ProofSubmission
	b, err := frame.NewReader(rd, lim).ChargeTo(rd).ReadBlob(&sub)
	if err != nil {
		t.log.Info("proof not read", "from", from, "err", err)
		if errors.Is(err, errProofBusy) {
			return refuse(meshp2pb.ErrorCode_ERROR_CODE_NO_CAPACITY, err.Error())
		}
		return &meshp2pb.ProofVerdict{Error: frame.ToProto(err)}
	}
	_ = s.SetReadDeadline(time.Time{})
	p := &meshp2pb.Proof{}
	if err := proto.Unmarshal(b, p); err != nil {
		return refuse(meshp2pb.ErrorCode_ERROR_CODE_MALFORMED, "not a proof: "+err.Error())
	}
	sum := sha256.Sum256(b)
	b = nil // decoded: its bytes can go (its charge stays until the verdict)
	jctx, jcancel := context.WithTimeout(t.bg, ProofTimeout)
	defer jcancel()
	release, err := t.proofs.judgeSlot(jctx)
	if err != nil {
		return refuse(meshp2pb.ErrorCode_ERROR_CODE_NO_CAPACITY, err.Error())
	}
	defer release()
	convicted, who, reason, err := t.cfg.Judge(jctx, p)
	if err != nil {
		t.log.Info("proof not verified", "from", from, "err", err)
		return refuse(meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, err.Error())
	}
	if !convicted {
		return &meshp2pb.ProofVerdict{Reason: "the replay agrees with what the hop signed"}
	}
	t.convict(who, reason, sum[:], from)
	return &meshp2pb.ProofVerdict{Convicted: true, PeerId: []byte(who), Reason: reason}
}

// convict remembers who (bounded) and publishes the conviction.
func (t *Tracker) convict(who peer.ID, reason string, proof []byte, from peer.ID) {
	t.mu.Lock()
	if _, ok := t.convicted[who]; !ok && len(t.convicted) >= MaxConvicted {
		for q := range t.convicted { // a memory bound, not a policy
			delete(t.convicted, q)
			break
		}
	}
	t.convicted[who] = Conviction{Peer: who, Reason: reason, At: t.cfg.Now(), Proof: proof}
	t.mu.Unlock()
	if err := t.publish(); err != nil {
		t.log.Warn("could not publish the conviction", "peer", who, "err", err)
	}
	t.log.Warn("fraud proof verified: no tickets through this peer from now on", "peer", who, "from", from, "reason", reason)
}
