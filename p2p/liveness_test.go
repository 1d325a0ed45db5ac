package p2p

import (
	"fmt"
	"testing"
	"time"
)

// TestDeadPeerAdvertDropped: a member whose host dies without withdrawing
// its advert (what SIGKILL leaves) is dropped by the peers it was
// connected to within seconds, long before its advert's TTL (1 minute
// here); a newcomer pulling adverts from them never sees it; a live peer
// whose connection was merely closed keeps its advert; and the dead
// peer's identity coming back with a newer advert is accepted again.
func TestDeadPeerAdvertDropped(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	slow := func(c *Config) {
		c.Discovery = DiscoveryConfig{RepublishInterval: 20 * time.Second, AdvertTTL: time.Minute}
	}
	b, members := cluster(t, 3, slow)
	for i, m := range members {
		if err := m.Discovery().SetLocalAdvert([]string{"k"}, []byte(fmt.Sprintf("body-%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	for i, m := range members {
		waitFor(ctx, t, fmt.Sprintf("bootstrap and node 0 to see node %d", i), func() bool {
			return hasAdvert(b, m.ID(), fmt.Sprintf("body-%d", i)) && (i == 0 || hasAdvert(members[0], m.ID(), fmt.Sprintf("body-%d", i)))
		})
	}
	events := b.Discovery().Subscribe(ctx)

	// A live peer's connection closes (a trim, a network blip): the probe
	// redials it and its advert stays.
	live := members[1]
	if err := b.Host().Network().ClosePeer(live.ID()); err != nil {
		t.Fatal(err)
	}

	dead := members[2]
	killed := time.Now()
	if err := dead.Host().Close(); err != nil { // no withdrawal: as SIGKILL
		t.Fatal(err)
	}
	for _, watcher := range []*Node{b, members[0]} {
		waitFor(ctx, t, "the dead peer's advert to be dropped", func() bool {
			_, ok := watcher.Discovery().Advert(dead.ID())
			return !ok
		})
	}
	t.Logf("dead peer's advert dropped %v after the kill (TTL 1m)", time.Since(killed).Round(time.Millisecond))
	var reason string
	for reason == "" {
		select {
		case ev := <-events:
			if ev.Kind == AdvertRemoved && ev.Advert.Peer == dead.ID() {
				reason = ev.Reason
			}
			if ev.Kind == AdvertRemoved && ev.Advert.Peer == live.ID() {
				t.Fatalf("the live peer's advert was removed (%s)", ev.Reason)
			}
		case <-ctx.Done():
			t.Fatal("no removal event for the dead peer")
		}
	}
	if reason != ReasonUnreachable {
		t.Fatalf("removal reason %q, want %q", reason, ReasonUnreachable)
	}
	if !hasAdvert(b, live.ID(), "body-1") {
		t.Fatal("the live peer whose connection closed lost its advert")
	}

	// A newcomer pulls from the bootstrap: it gets the live adverts and
	// not the dead one.
	late := newTestNode(t, func(c *Config) { slow(c); withBootstrap(b)(c) })
	waitFor(ctx, t, "the newcomer to pull the live adverts", func() bool {
		return hasAdvert(late, members[0].ID(), "body-0") && hasAdvert(late, live.ID(), "body-1")
	})
	if _, ok := late.Discovery().Advert(dead.ID()); ok {
		t.Fatal("the newcomer was handed the dead peer's advert")
	}

	// The old advert re-offered (by a peer that still holds it) is refused.
	b.Discovery().mu.Lock()
	g, marked := b.Discovery().gone[dead.ID()]
	b.Discovery().mu.Unlock()
	if !marked {
		t.Fatal("no mark for the dead peer")
	}
	if rec := (&advertRecord{Peer: dead.ID(), Seq: g.seq}); !func() bool {
		b.Discovery().mu.Lock()
		defer b.Discovery().mu.Unlock()
		return b.Discovery().refusedLocked(rec)
	}() {
		t.Fatal("the dead peer's last advert is not refused")
	}
	if rec := (&advertRecord{Peer: dead.ID(), Seq: g.seq + 1}); func() bool {
		b.Discovery().mu.Lock()
		defer b.Discovery().mu.Unlock()
		return b.Discovery().refusedLocked(rec)
	}() {
		t.Fatal("a newer advert of the dead peer's identity is refused")
	}
}
