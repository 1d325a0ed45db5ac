package session

import (
	"bytes"
	"slices"
	"sync"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/route"
)

// Cache affinity. A hop's cached prefix serves a later session only if
// that session runs through the same hop and the same peers, ranges and
// kernel classes before it (prefix.go). With replicas of a range, the
// planner would pick among them by load and chance, and an agent's next
// turn would land on a cold replica about half the time (and re-prefill
// its whole conversation). So the origin remembers, for its last
// MaxWarmRoutes sessions, the chain of block hashes the hops kept and
// the route that kept it; a new session whose chain shares at least one
// block with one of them asks the planner to prefer that route's hops
// (route.Request.Warm). It is a preference: a full, gone or excluded hop
// is planned around as before. A re-route prefers the failed epoch's
// surviving hops for the same reason (they adopt the epoch's cells).

// MaxWarmRoutes bounds the routes an origin remembers (each with at most
// MaxPrefixBlocks hashes: 16 KiB).
const MaxWarmRoutes = 64

type warmRoute struct {
	hashes  []byte // the chain the hops kept (prefixHashLen bytes per block)
	hops    []route.Hop
	standby []route.Hop // the session's standby, which kept the covered hop's blocks (none: empty)
	session [16]byte    // the session that kept it
}

// warmRoutes is an origin's memory of recent sessions' routes, least
// recently used first. The zero value is empty and ready.
type warmRoutes struct {
	mu sync.Mutex
	rs []warmRoute
}

// remember records that session's hops (and its standby, if any) keep
// the prefix named by hashes.
func (w *warmRoutes) remember(hashes []byte, hops, standby []route.Hop, session [16]byte) {
	if len(hashes) < prefixHashLen || len(hops) == 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	// An entry whose chain this one extends (the same conversation's
	// earlier turn) is replaced.
	w.rs = slices.DeleteFunc(w.rs, func(r warmRoute) bool { return bytes.HasPrefix(hashes, r.hashes) })
	if len(w.rs) >= MaxWarmRoutes {
		w.rs = slices.Delete(w.rs, 0, 1)
	}
	w.rs = append(w.rs, warmRoute{hashes: slices.Clone(hashes), hops: slices.Clone(hops), standby: slices.Clone(standby), session: session})
}

// lookup is the route, the standby and the id of the remembered session
// sharing the most whole blocks with hashes (at least one); nil when none
// does.
func (w *warmRoutes) lookup(hashes []byte) ([]route.Hop, []route.Hop, []byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	best, bestN := -1, 0
	for i, r := range w.rs {
		if n := commonBlocks(r.hashes, hashes); n > bestN {
			best, bestN = i, n
		}
	}
	if best < 0 {
		return nil, nil, nil
	}
	r := w.rs[best]
	w.rs = append(slices.Delete(w.rs, best, best+1), r) // most recently used
	return slices.Clone(r.hops), slices.Clone(r.standby), r.session[:]
}

// commonBlocks is how many leading block hashes a and b share (a chain's
// hash covers every block before it, so the first difference ends it).
func commonBlocks(a, b []byte) int {
	n := 0
	for i := 0; i+prefixHashLen <= len(a) && i+prefixHashLen <= len(b); i += prefixHashLen {
		if !bytes.Equal(a[i:i+prefixHashLen], b[i:i+prefixHashLen]) {
			break
		}
		n++
	}
	return n
}

// warmHops are the hops this epoch of req should prefer: after a failure
// the last route's (its survivors adopt the epoch's cells), else those of
// the remembered session sharing the most of req's prompt, which the
// epochs' opens then name as the session they follow (res.follows), and
// whose standby is the one to prefer as this session's
// (res.warmStandby: a mirror can only follow a standby from what it
// holds; not a route hop, or the hops after it would miss their blocks,
// which are keyed on the peers before them).
func (o *Origin) warmHops(req GenerateRequest, res *Result) []route.Hop {
	if o.NoPrefixCache {
		return nil
	}
	if res.Route != nil {
		return res.Route.Hops
	}
	hops, sb, follows := o.warm.lookup(prefixOf(PrefixSeed(o.Key, req.CacheNamespace), req.Prompt).GetHashes())
	res.follows, res.warmStandby = follows, sb
	return hops
}

// standbyHops is the standby sb as a warm hop (nil for none, or when it
// was lost): it keeps the covered hop's blocks when the session ends.
func standbyHops(sb *meshp2pb.Standby, lost bool) []route.Hop {
	if sb == nil || lost {
		return nil
	}
	h := sb.GetHop()
	return []route.Hop{{Peer: peer.ID(h.GetPeerId()), Start: int(h.GetStart()), End: int(h.GetEnd())}}
}
