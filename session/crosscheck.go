package session

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/route"
)

// The cross-check of a hop's adopted rows (docs/trust.md, "Prefix cache":
// a poisoned entry). The replay rebuilds a hop's adopted cells from the
// rows the hop itself kept; a hop after the head that kept other rows
// than it received would pass it. So an audit also looks for the
// origin's earlier session whose close left that entry (the same model,
// wire dtype and hops up to the audited one, the same first tokens; an
// entry kept by another session of the same tokens holds bitwise the
// same rows, batch invariance, so which one left it does not matter),
// and, unless a hop before the audited one is not batch-invariant,
// fetches from the hop before
// the audited one the frames it sent in that session and from the
// statements' holder the audited hop's statements of it, and compares
// the rows the hop signed it received there with those it signed it
// adopted here. A difference makes the audit inconclusive, not a
// conviction: the entry may have been left by another session of the same
// tokens (a later session that keeps blocks an entry already holds only
// touches it), whose rows differ from this one's when a hop before the
// audited one cheated in either: an honest hop must not answer for that. Positions that session itself adopted are not
// covered (a chain of earlier sessions), nor is anything once the records
// expired (DefaultAuditHold): then nothing is compared.

// maxRecentGens bounds the generations an auditor remembers for the
// cross-check.
const maxRecentGens = 8

// recentGen is a finished generation with transcripts: its final epoch's
// open and every token it knew (prompt and generated).
type recentGen struct {
	open  *meshp2pb.SessionOpen
	known []int32
	at    time.Time
}

// remember keeps a finished generation for the cross-check of later
// audits (the last maxRecentGens within DefaultAuditHold).
func (a *Auditor) remember(open *meshp2pb.SessionOpen, known []int32) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now()
	a.recent = slices.DeleteFunc(a.recent, func(g recentGen) bool { return now.Sub(g.at) > DefaultAuditHold })
	if len(a.recent) >= maxRecentGens {
		a.recent = a.recent[1:]
	}
	a.recent = append(a.recent, recentGen{open: open, known: known, at: now})
}

// source is the latest remembered generation other than open's epoch
// whose hops up to hop are open's and whose tokens start with known's
// first n: the session whose close may have left hop's entry.
func (a *Auditor) source(open *meshp2pb.SessionOpen, hop, n int, known []int32) *recentGen {
	a.mu.Lock()
	defer a.mu.Unlock()
	hops := open.GetRoute().GetHops()
	for i := len(a.recent) - 1; i >= 0; i-- {
		g := a.recent[i]
		gh := g.open.GetRoute().GetHops()
		// Rows of the same tokens are bitwise the same only through the
		// same computation: model, wire dtype, and the hops' peers,
		// ranges and kernel classes up to this one (the entry's scope).
		same := len(gh) > hop && g.open.GetModelFingerprint() == open.GetModelFingerprint() && g.open.GetWireDtype() == open.GetWireDtype() &&
			slices.EqualFunc(gh[:hop+1], hops[:hop+1], func(x, y *meshp2pb.RouteHop) bool {
				return string(x.GetPeerId()) == string(y.GetPeerId()) && x.GetStart() == y.GetStart() && x.GetEnd() == y.GetEnd() &&
					x.GetKernelClass() == y.GetKernelClass()
			})
		if same && (string(g.open.GetSessionId()) != string(open.GetSessionId()) || g.open.GetEpoch() != open.GetEpoch()) &&
			len(g.known) >= n && len(known) >= n && slices.Equal(g.known[:n], known[:n]) {
			return &g
		}
	}
	return nil
}

// crossCheck compares hop's adopted rows (adopted, checked against its
// signed digest) with the rows it signed it received in the session that
// left them (see above): the positions compared, and why the audit is
// inconclusive ("": no difference found, or nothing to compare).
func (o *Origin) crossCheck(ctx context.Context, open *meshp2pb.SessionOpen, hop int, known []int32, adopted []*meshp2pb.RecordedFrame) (int, string) {
	n := positions(adopted)
	if hop == 0 || n == 0 {
		return 0, ""
	}
	for _, h := range open.GetRoute().GetHops()[:hop] {
		if !route.InvariantClass(h.GetKernelClass()) {
			return 0, "" // the hop before computes rows that depend on their batch: two sessions' differ
		}
	}
	g := o.Audit.source(open, hop, n, known)
	if g == nil {
		return 0, ""
	}
	received, err := o.receivedIn(ctx, g.open, hop)
	if err != nil {
		o.logger().Debug("audit: no cross-check of the adopted rows", "hop", hop, "err", err)
		return 0, ""
	}
	mine := rowsByPosition(adopted)
	checked := 0
	for pos := range n {
		row, ok := received[pos]
		if !ok {
			continue // that session adopted it too
		}
		checked++
		if !slices.Equal(mine[pos], row) {
			return checked, fmt.Sprintf("hop %d signed it adopted cells computed from other rows at position %d than it signed it received there in session %x epoch %d "+
				"(a poisoned cache entry, or one another session left whose hops before this one sent other rows)", hop, pos, g.open.GetSessionId()[:4], g.open.GetEpoch())
		}
	}
	return checked, ""
}

// receivedIn is what hop signed it received in the epoch of open, by
// position (the last frame covering a position wins, as in the hop's KV):
// the frames the hop before it sent, whose digests hop's statements of
// that epoch name.
func (o *Origin) receivedIn(ctx context.Context, open *meshp2pb.SessionOpen, hop int) (map[int][]float32, error) {
	hops := open.GetRoute().GetHops()
	holder := hop + 1
	if hop == len(hops)-1 {
		holder = 0
	}
	recs, _, err := o.fetch(ctx, peer.ID(hops[holder].GetPeerId()), open, meshp2pb.AuditPart_AUDIT_PART_STATEMENTS)
	if err != nil {
		return nil, err
	}
	_, sent, err := o.fetch(ctx, peer.ID(hops[hop-1].GetPeerId()), open, meshp2pb.AuditPart_AUDIT_PART_SENT)
	if err != nil {
		return nil, err
	}
	p := &meshp2pb.Proof{Version: 1, Open: open, HopIndex: uint32(hop), NEmbd: uint32(nEmbd(sent)), Statements: recs.GetStatements(), Inputs: sent}
	sts, err := checkProofShape(p)
	if err != nil {
		return nil, err
	}
	windows, _, err := replayableWindows(p, sts)
	if err != nil {
		return nil, err
	}
	var covered uint32
	for _, w := range windows {
		covered += w
	}
	return rowsByPosition(sent[:covered]), nil
}

// rowsByPosition decodes frames' rows to f32 by position (later frames
// replace earlier ones: a speculative window sent again).
func rowsByPosition(frames []*meshp2pb.RecordedFrame) map[int][]float32 {
	out := map[int][]float32{}
	for _, f := range frames {
		a := f.GetHeader()
		rows := int(a.GetNRows())
		if len(a.GetTensors()) != 1 || rows == 0 {
			continue
		}
		v, err := frame.ToF32(a.GetTensors()[0].GetDtype(), f.GetPayload(), nil)
		if err != nil || len(v)%rows != 0 {
			continue
		}
		w := len(v) / rows
		for r := range rows {
			out[int(a.GetPosStart())+r] = v[r*w : (r+1)*w]
		}
	}
	return out
}
