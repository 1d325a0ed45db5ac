package testnet_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/neuron-tai/meshp2p/testnet"
)

// A tracker on the public segment is the only peer anybody is told about:
// two home nodes behind different NATs (serving layers 0-3 and 3-5, and
// admitting only sessions with a ticket from that tracker) and a client
// behind a third NAT find each other through it, reach each other through
// its relay, and a generation through a tracker-issued route
// (--require-tracker) equals --local.
func TestTrackerAcrossNATs(t *testing.T) {
	c := newCLISwarm(t, "nattrk", testnet.Spec{
		Public: []testnet.Public{{Name: "trk", Roles: []testnet.Role{testnet.RoleTracker, testnet.RoleRelay, testnet.RoleBootstrap}}},
		Homes: []testnet.Home{
			{Name: "h1", Hosts: []string{"a"}},
			{Name: "h2", Hosts: []string{"b"}},
			{Name: "h3", Hosts: []string{"c"}},
		},
	}, 150*time.Second)
	trk := c.start("trk", "tracker", "--reachability", "public", "--ping-interval", "2s")
	trkAddr := c.addr("trk")
	home := []string{"--reachability", "private", "--dht-mode", "client", "--tracker", trkAddr, "--require-ticket"}
	head := c.shard("a", "0-3", home...)
	c.shard("b", "3-5", home...)

	want := c.local("24")
	got := c.result(c.generateProc("c", "24", "--tracker", trkAddr, "--require-tracker"), trk, head)
	if fmt.Sprint(got.Tokens) != fmt.Sprint(want.Tokens) || len(got.Route) != 2 {
		t.Fatalf("swarm %v (route %+v)\nlocal %v", got.Tokens, got.Route, want.Tokens)
	}
	// The ticket came from the tracker, which saw both home nodes as
	// reachable only through its relay.
	issued, err := waitStderr(c.ctx, trk, "route ticket issued")
	if err != nil {
		t.Fatalf("tracker issued no ticket: %v\n%s", err, trk.StderrTail(3000))
	}
	if strings.Count(issued, "relayed") != 2 {
		t.Errorf("tracker does not see both home nodes as relay-only: %s", issued)
	}
	t.Logf("tracker: %s", issued)
	if seam, err := waitStderr(c.ctx, head, "seam to next hop open"); err == nil {
		t.Logf("head's seam: %s", seam)
	}
	t.Logf("text through a tracker-issued route across NATs: %q", got.Text)
}
