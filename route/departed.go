package route

import (
	"sort"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// Departed shards: discovery drops a peer's advert about a second after
// the peer dies (p2p's liveness check, ReasonUnreachable), which takes
// it out of routing at once. Status pages still show what went away:
// the table keeps a dead peer's last shards for DepartedFor, or until the
// peer advertises again, and lists them apart from the live ones
// (Departed). They never count toward coverage or routes.
const (
	// DepartedFor is how long a dead peer's shards stay listed.
	DepartedFor = 10 * time.Minute
	// MaxDeparted bounds the dead peers remembered (the oldest goes first).
	MaxDeparted = 64
)

type departure struct {
	shards []Shard
	at     time.Time
}

// markDeparted moves p's shards to the departed list (Follow calls it
// when p's advert is dropped because p is unreachable).
func (t *Table) markDeparted(p peer.ID, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ss := t.byPeer[p]
	if len(ss) == 0 {
		return
	}
	if t.departed == nil {
		t.departed = map[peer.ID]departure{}
	}
	t.pruneDepartedLocked(now)
	if _, ok := t.departed[p]; !ok && len(t.departed) >= MaxDeparted {
		var oldest peer.ID
		var at time.Time
		for q, d := range t.departed {
			if oldest == "" || d.at.Before(at) {
				oldest, at = q, d.at
			}
		}
		delete(t.departed, oldest)
	}
	t.departed[p] = departure{shards: ss, at: now}
}

// pruneDepartedLocked forgets departures older than DepartedFor.
func (t *Table) pruneDepartedLocked(now time.Time) {
	for p, d := range t.departed {
		if now.Sub(d.at) > DepartedFor {
			delete(t.departed, p)
		}
	}
}

// Departed lists the last shards of peers that died within DepartedFor
// and have not advertised since, ordered by start layer then peer, each
// with when its peer was found dead.
func (t *Table) Departed() []DepartedShard {
	now := time.Now()
	t.mu.RLock()
	defer t.mu.RUnlock()
	var out []DepartedShard
	for p, d := range t.departed {
		if now.Sub(d.at) > DepartedFor || len(t.byPeer[p]) > 0 {
			continue
		}
		for _, s := range d.shards {
			out = append(out, DepartedShard{Shard: s, At: d.at})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Start != out[j].Start {
			return out[i].Start < out[j].Start
		}
		return out[i].Peer < out[j].Peer
	})
	return out
}

// DepartedShard is a dead peer's last advertised shard.
type DepartedShard struct {
	Shard
	At time.Time // when discovery found its peer unreachable
}
