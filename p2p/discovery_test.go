package p2p

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// cluster starts a bootstrap node and n members bootstrapping from it.
func cluster(t *testing.T, n int, mod func(*Config)) (*Node, []*Node) {
	t.Helper()
	b := bootstrapNode(t, mod)
	var members []*Node
	for range n {
		members = append(members, newTestNode(t, func(c *Config) {
			withBootstrap(b)(c)
			if mod != nil {
				mod(c)
			}
		}))
	}
	return b, members
}

func hasAdvert(n *Node, p peer.ID, body string) bool {
	ad, ok := n.Discovery().Advert(p)
	return ok && string(ad.Body) == body
}

func TestGossipDiscovery(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	b, members := cluster(t, 3, nil)
	events := members[0].Discovery().Subscribe(ctx)
	for i, m := range members {
		if err := m.Discovery().SetLocalAdvert([]string{fmt.Sprintf("model-%d", i)}, []byte(fmt.Sprintf("body-%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	for i, m := range members {
		for j, o := range members {
			if i == j {
				continue
			}
			waitFor(ctx, t, fmt.Sprintf("node %d to see node %d's advert", i, j), func() bool {
				return hasAdvert(m, o.ID(), fmt.Sprintf("body-%d", j))
			})
		}
		waitFor(ctx, t, fmt.Sprintf("bootstrap to see node %d", i), func() bool {
			return hasAdvert(b, m.ID(), fmt.Sprintf("body-%d", i))
		})
	}
	ads := members[0].Discovery().Adverts()
	if len(ads) != 2 {
		t.Fatalf("node 0 has %d adverts, want 2 (its own is not listed)", len(ads))
	}
	for _, ad := range ads {
		j := slices.IndexFunc(members, func(m *Node) bool { return m.ID() == ad.Peer })
		if j < 1 {
			t.Fatalf("advert from unexpected peer %s", ad.Peer)
		}
		if want := fmt.Sprintf("model-%d", j); !slices.Equal(ad.Keys, []string{want}) {
			t.Fatalf("advert keys %v, want [%s]", ad.Keys, want)
		}
		if ad.Seq == 0 || !ad.ExpiresAt.After(time.Now()) || len(ad.Addrs) == 0 {
			t.Fatalf("advert missing seq, expiry or addresses: %+v", ad)
		}
	}
	seen := map[peer.ID]bool{}
	for len(seen) < 2 {
		select {
		case ev := <-events:
			if ev.Kind == AdvertAdded {
				seen[ev.Advert.Peer] = true
			}
		case <-ctx.Done():
			t.Fatalf("got Added events for %d peers, want 2", len(seen))
		}
	}

	// Content changes are pushed as updates.
	if err := members[1].Discovery().SetLocalAdvert([]string{"model-1"}, []byte("body-1b")); err != nil {
		t.Fatal(err)
	}
	for {
		select {
		case ev := <-events:
			if ev.Kind == AdvertUpdated && ev.Advert.Peer == members[1].ID() && string(ev.Advert.Body) == "body-1b" {
				return
			}
		case <-ctx.Done():
			t.Fatal("no Updated event for a changed body")
		}
	}
}

func TestAdvertWithdrawnAndExpired(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	_, members := cluster(t, 3, func(c *Config) {
		c.Discovery = DiscoveryConfig{RepublishInterval: 200 * time.Millisecond, AdvertTTL: 1500 * time.Millisecond}
	})
	watcher, leaver, crasher := members[0], members[1], members[2]
	events := watcher.Discovery().Subscribe(ctx)
	for _, m := range members {
		if err := m.Discovery().SetLocalAdvert([]string{"k"}, []byte(m.ID().String())); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range []*Node{leaver, crasher} {
		waitFor(ctx, t, "watcher to see adverts", func() bool { return hasAdvert(watcher, m.ID(), m.ID().String()) })
	}

	// A clean Close publishes a tombstone.
	leaver.Close()
	waitRemoved(ctx, t, events, leaver.ID(), ReasonWithdrawn)
	if _, ok := watcher.Discovery().Advert(leaver.ID()); ok {
		t.Fatal("withdrawn advert still listed")
	}

	// A node that dies without withdrawing expires after its TTL.
	crasher.disc.cancel() // stop re-publishing, as if the process froze
	crasher.closeHost()
	waitRemoved(ctx, t, events, crasher.ID(), ReasonExpired)
	if len(watcher.Discovery().Adverts()) != 0 {
		t.Fatalf("adverts left after both peers left: %+v", watcher.Discovery().Adverts())
	}
}

func waitRemoved(ctx context.Context, t *testing.T, events <-chan AdvertEvent, p peer.ID, reason string) {
	t.Helper()
	for {
		select {
		case ev := <-events:
			if ev.Kind == AdvertRemoved && ev.Advert.Peer == p {
				if ev.Reason != reason {
					t.Fatalf("advert of %s removed as %q, want %q", p, ev.Reason, reason)
				}
				return
			}
		case <-ctx.Done():
			t.Fatalf("advert of %s not removed (%s)", p, reason)
		}
	}
}

func TestLateJoinerLookup(t *testing.T) {
	ctx := testCtx(t, 40*time.Second)
	// No re-publish during the test: the late joiner can only learn the
	// holder's advert through the DHT and the advert protocol.
	slow := func(c *Config) {
		c.Discovery = DiscoveryConfig{RepublishInterval: time.Hour}
	}
	b, members := cluster(t, 1, slow)
	holder := members[0]
	if err := holder.Discovery().SetLocalAdvert([]string{"fp-abc", "fp-other"}, []byte("shard 0-15")); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, "bootstrap to receive the holder's only gossip", func() bool { return hasAdvert(b, holder.ID(), "shard 0-15") })
	// Nor by pulling on connect: nobody serves pulls.
	b.Host().RemoveStreamHandler(b.Discovery().syncPID)
	holder.Host().RemoveStreamHandler(holder.Discovery().syncPID)

	late := newTestNode(t, func(c *Config) { withBootstrap(b)(c); slow(c) })
	waitFor(ctx, t, "late joiner to reach bootstrap", func() bool { return late.ConnStatus(b.ID()).Path == PathDirect })
	waitFor(ctx, t, "identify of bootstrap", func() bool {
		ok, _ := late.Host().Peerstore().SupportsProtocols(b.ID(), "/meshp2p/test/kad/1.0.0")
		return len(ok) == 1
	})
	if _, ok := late.Discovery().Advert(holder.ID()); ok {
		t.Fatal("late joiner already has the advert before Lookup; the test proves nothing")
	}
	var found []Advert
	waitFor(ctx, t, "Lookup to find the holder", func() bool {
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		ads, err := late.Discovery().Lookup(lctx, "fp-abc")
		if err != nil {
			t.Logf("lookup: %v", err)
		}
		found = ads
		return len(ads) > 0
	})
	if len(found) != 1 || found[0].Peer != holder.ID() || string(found[0].Body) != "shard 0-15" {
		t.Fatalf("Lookup = %+v, want the holder's advert", found)
	}
	if found[0].Reach != PathDirect {
		t.Fatalf("Lookup reach = %v, want direct (it fetched the advert directly)", found[0].Reach)
	}
	if !hasAdvert(late, holder.ID(), "shard 0-15") {
		t.Fatal("looked-up advert did not enter the table")
	}
	if ads, err := late.Discovery().Lookup(ctx, "fp-nobody"); err != nil || len(ads) != 0 {
		t.Fatalf("Lookup of an unknown key = %v, %v; want none", ads, err)
	}
}

// A full table evicts the advert closest to expiry instead of silently
// ignoring newcomers (Sybil fill can push honest adverts out, but an
// honest newcomer always gets in).
func TestFullTableEvicts(t *testing.T) {
	n := newTestNode(t, shippedDiscovery)
	d := n.Discovery()
	events := d.Subscribe(testCtx(t, 10*time.Second))
	now := time.Now()
	for i := range maxTableSize {
		d.ingest(&advertRecord{Peer: peer.ID(fmt.Sprintf("sybil-%d", i)), Seq: 1, IssuedAt: now,
			ExpiresAt: now.Add(time.Minute + time.Duration(i)*time.Millisecond)}, nil, now)
	}
	newcomer := newSigner(t)
	if !d.ingest(&advertRecord{Peer: newcomer.id, Seq: 1, IssuedAt: now, ExpiresAt: now.Add(time.Hour), Body: []byte("honest")}, nil, now) {
		t.Fatal("newcomer ignored by a full table")
	}
	if !hasAdvert(n, newcomer.id, "honest") {
		t.Fatal("newcomer not in the table")
	}
	if ad, ok := d.Advert("sybil-0"); ok {
		t.Fatalf("the advert closest to expiry was not evicted: %+v", ad)
	}
	if got := len(d.Adverts()); got != maxTableSize {
		t.Fatalf("table holds %d, want %d", got, maxTableSize)
	}
	for ev := range events {
		if ev.Kind == AdvertRemoved {
			if ev.Reason != ReasonEvicted || ev.Advert.Peer != "sybil-0" {
				t.Fatalf("removal event %v %s %s", ev.Kind, ev.Reason, ev.Advert.Peer)
			}
			return
		}
	}
}

// A node whose advert changes faster than receivers accept from one
// author (authorBurst, then one per authorRefill) paces its gossip: the
// changes coalesce, and the latest state reaches its peers. Unpaced, the
// receivers dropped the tail of the burst, the last state included, until
// the next republish (here a minute away).
func TestRapidAdvertChangesArrive(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	b, members := cluster(t, 1, func(c *Config) {
		c.Discovery.RepublishInterval, c.Discovery.AdvertTTL = time.Minute, 5*time.Minute
	})
	m := members[0]
	waitFor(ctx, t, "the members to connect", func() bool { return len(b.Host().Network().Peers()) > 0 })
	time.Sleep(syncFollowUp + time.Second) // past the pulls that follow a connection
	const n = 3 * authorBurst
	for i := range n {
		if err := m.Discovery().SetLocalAdvert([]string{"model"}, []byte(fmt.Sprintf("body-%d", i))); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond) // each change its own publish, unpaced
	}
	waitFor(ctx, t, "the bootstrap node to see the last advert", func() bool {
		return hasAdvert(b, m.ID(), fmt.Sprintf("body-%d", n-1))
	})
}
