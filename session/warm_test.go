package session

import (
	"bytes"
	"testing"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/route"
)

// chainOf is a fake chain: n blocks of hashes, block i filled with
// base+i (a chain's hash covers everything before it, so two chains that
// differ at a block differ from there on).
func chainOf(base byte, n int) []byte {
	return bytes.Repeat([]byte{base}, n*prefixHashLen)
}

func TestWarmRoutes(t *testing.T) {
	hop := func(p string) []route.Hop { return []route.Hop{{Peer: peer.ID(p), Start: 0, End: 4}} }
	var w warmRoutes
	if got, _, sid := w.lookup(chainOf(1, 3)); got != nil || sid != nil {
		t.Fatalf("empty memory found %v (session %x)", got, sid)
	}
	w.remember(chainOf(1, 2), hop("turn1"), nil, [16]byte{1})
	w.remember(chainOf(2, 4), hop("other"), nil, [16]byte{2})
	cases := []struct {
		name  string
		chain []byte
		want  peer.ID
		sid   byte // the session it follows
	}{
		{"a longer chain of the same conversation", chainOf(1, 5), "turn1", 1},
		{"one shared block is enough", chainOf(1, 1), "turn1", 1},
		{"the other conversation", chainOf(2, 3), "other", 2},
		{"nothing shared", chainOf(3, 3), "", 0},
		{"no whole block", chainOf(1, 0), "", 0},
	}
	for _, tc := range cases {
		got, _, sid := w.lookup(tc.chain)
		if (tc.want == "") != (got == nil) || (got != nil && got[0].Peer != tc.want) {
			t.Errorf("%s: lookup = %v, want %q", tc.name, got, tc.want)
		}
		if want := [16]byte{tc.sid}; tc.want != "" && !bytes.Equal(sid, want[:]) {
			t.Errorf("%s: follows session %x, want %x", tc.name, sid, want)
		}
	}
	// The next turn replaces the entry its chain extends.
	w.remember(chainOf(1, 4), hop("turn2"), nil, [16]byte{3})
	if got, _, _ := w.lookup(chainOf(1, 2)); got == nil || got[0].Peer != "turn2" {
		t.Fatalf("after turn 2: %v", got)
	}
	if len(w.rs) != 2 {
		t.Fatalf("%d entries, want 2 (turn 2 replaced turn 1)", len(w.rs))
	}
	// Bounded, the least recently used out first: "other" is looked up
	// now, so after MaxWarmRoutes-1 new entries it stays and turn 2 goes.
	w.lookup(chainOf(2, 1))
	for i := range MaxWarmRoutes - 1 {
		w.remember(chainOf(byte(10+i), 1), hop("x"), nil, [16]byte{})
	}
	if len(w.rs) != MaxWarmRoutes {
		t.Fatalf("%d entries, want the bound %d", len(w.rs), MaxWarmRoutes)
	}
	if got, _, _ := w.lookup(chainOf(2, 1)); got == nil || got[0].Peer != "other" {
		t.Fatalf("the recently used entry was dropped: %v", got)
	}
	if got, _, _ := w.lookup(chainOf(1, 1)); got != nil {
		t.Fatalf("the least recently used entry was kept: %v", got)
	}
}
