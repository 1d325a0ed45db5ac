package testnet_test

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/neuron-tai/meshp2p/testnet"
)

// holePunchSpec: a public relay, two homes behind port-preserving NATs
// (a, b) and one behind a symmetric NAT (c).
func holePunchSpec() testnet.Spec {
	return testnet.Spec{
		Public: []testnet.Public{{Name: "relay", Roles: []testnet.Role{testnet.RoleBootstrap, testnet.RoleRelay}}},
		Homes: []testnet.Home{
			{Name: "ha", NAT: testnet.PortPreserving, Hosts: []string{"a"}},
			{Name: "hb", NAT: testnet.PortPreserving, Hosts: []string{"b"}},
			{Name: "hc", NAT: testnet.Symmetric, Hosts: []string{"c"}},
		},
	}
}

type readyEvent struct {
	ID    string   `json:"id"`
	Addrs []string `json:"addrs"`
}

type dialEvent struct {
	Impl          string   `json:"impl"`
	NodeDirect    bool     `json:"node_says_direct"`
	RelayedMS     float64  `json:"relayed_ms"`
	Direct        bool     `json:"direct"`
	DirectAddr    string   `json:"direct_addr"`
	DirectMS      float64  `json:"direct_ms"`
	PunchFailures int      `json:"punch_failures"`
	PunchErrors   []string `json:"punch_errors"`
	StreamRelayed bool     `json:"stream_relayed"`
	BytesSent     int64    `json:"bytes_sent"`
	BytesAcked    int64    `json:"bytes_acked"`
	TransferMS    float64  `json:"transfer_ms"`
	SendError     string   `json:"send_error"`
}

// impl selects the node implementation in the children: "p2p" (meshp2p's
// host, default) or "raw" (plain go-libp2p as in the spike, to tell a
// testnet problem from a p2p one): MESHP2P_TESTNET_IMPL.
func impl() string {
	if os.Getenv("MESHP2P_TESTNET_IMPL") == "raw" {
		return "raw"
	}
	return "p2p"
}

// trials per transport for the port-preserving case (MESHP2P_TESTNET_TRIALS
// overrides, bounded to 1…50).
func trials() int {
	n, err := strconv.Atoi(os.Getenv("MESHP2P_TESTNET_TRIALS"))
	if err != nil || n < 1 {
		return 3
	}
	return min(n, 50)
}

// TestHolePunch: two home nodes behind port-preserving NATs connect
// through a public relay, then DCUtR upgrades the connection to direct and
// a stream carries data over it (TCP and QUIC); a node behind a symmetric
// NAT stays relayed and its stream still carries 20 MB through the relay.
func TestHolePunch(t *testing.T) {
	topo := testnet.NewT(t, holePunchSpec())
	ctx, cancel := context.WithTimeout(context.Background(), 80*time.Second)
	defer cancel()

	// The relay first, and ready: a failed first reservation makes
	// autorelay back off for an hour.
	rp, err := topo.StartSelf(ctx, "relay", "relay", "-impl", impl(), "-for", "80s")
	if err != nil {
		t.Fatal(err)
	}
	var relay readyEvent
	if err := rp.WaitEvent(ctx, "ready", &relay); err != nil {
		t.Fatal(err)
	}
	relayNode := mustNode(t, topo, "relay")
	relayArg := map[string]string{}
	for _, a := range relay.Addrs {
		if !strings.HasPrefix(a, "/ip4/"+relayNode.Addr.String()+"/") {
			continue
		}
		full := a + "/p2p/" + relay.ID
		switch {
		case strings.Contains(a, "/quic-v1"):
			relayArg["quic"] = full
		case strings.Contains(a, "/tcp/"):
			relayArg["tcp"] = full
		}
	}
	if relayArg["tcp"] == "" || relayArg["quic"] == "" {
		t.Fatalf("relay addrs %v: want TCP and QUIC on %s", relay.Addrs, relayNode.Addr)
	}

	listeners := map[string]readyEvent{}
	for _, tr := range []string{"tcp", "quic"} {
		lp, err := topo.StartSelf(ctx, "b", "peer", "-impl", impl(), "-bootstrap", "-mode", "listen", "-transport", tr, "-relay", relayArg[tr], "-for", "80s")
		if err != nil {
			t.Fatal(err)
		}
		var ev readyEvent
		if err := lp.WaitEvent(ctx, "ready", &ev); err != nil {
			t.Fatal(err)
		}
		listeners[tr] = ev
	}

	n := trials()
	for _, tr := range []string{"tcp", "quic"} {
		t.Run("port-preserving/"+tr, func(t *testing.T) {
			direct := 0
			for i := range n {
				dp, err := topo.StartSelf(ctx, "a", "peer", "-impl", impl(), "-bootstrap", "-mode", "dial", "-transport", tr, "-relay", relayArg[tr],
					"-target", listeners[tr].ID, "-bytes", strconv.Itoa(1<<20), "-wait-direct", "10s", "-for", "30s")
				if err != nil {
					t.Fatal(err)
				}
				var ev dialEvent
				if err := dp.WaitEvent(ctx, "result", &ev); err != nil {
					t.Fatalf("trial %d: %v", i, err)
				}
				if !ev.Direct {
					t.Errorf("trial %d: still relayed after the hole punch (failures %d: %v)", i, ev.PunchFailures, ev.PunchErrors)
					continue
				}
				direct++
				if !ev.NodeDirect {
					t.Errorf("trial %d: connection %s is direct but the node (%s) reports it relayed", i, ev.DirectAddr, ev.Impl)
				}
				if ev.StreamRelayed || ev.BytesAcked != 1<<20 || ev.SendError != "" {
					t.Errorf("trial %d: stream over %s: relayed=%v acked %d of %d bytes (%s)", i, ev.DirectAddr, ev.StreamRelayed, ev.BytesAcked, 1<<20, ev.SendError)
				}
				t.Logf("trial %d: relayed connect %.1f ms, direct after %.1f ms via %s, 1 MiB in %.1f ms", i, ev.RelayedMS, ev.DirectMS, ev.DirectAddr, ev.TransferMS)
			}
			t.Logf("%s (%s): %d/%d hole punches went direct", tr, impl(), direct, n)
		})
	}

	t.Run("symmetric/tcp", func(t *testing.T) {
		const size = 20 << 20
		dp, err := topo.StartSelf(ctx, "c", "peer", "-impl", impl(), "-bootstrap", "-mode", "dial", "-transport", "tcp", "-relay", relayArg["tcp"],
			"-target", listeners["tcp"].ID, "-bytes", strconv.Itoa(size), "-data-when", "relayed", "-wait-direct", "25s", "-for", "40s")
		if err != nil {
			t.Fatal(err)
		}
		var ev dialEvent
		if err := dp.WaitEvent(ctx, "result", &ev); err != nil {
			t.Fatal(err)
		}
		if ev.Direct {
			t.Errorf("behind a symmetric NAT the connection went direct via %s; want it to stay relayed", ev.DirectAddr)
		}
		if ev.NodeDirect {
			t.Errorf("node (%s) reports a direct path behind a symmetric NAT", ev.Impl)
		}
		if ev.PunchFailures == 0 {
			t.Errorf("no failed hole-punch attempt seen; want the punch tried and failed")
		}
		if !ev.StreamRelayed || ev.BytesAcked != size || ev.SendError != "" {
			t.Errorf("relayed stream: relayed=%v acked %d of %d bytes (%s)", ev.StreamRelayed, ev.BytesAcked, size, ev.SendError)
		}
		t.Logf("symmetric: relayed connect %.1f ms, %d failed punches, 20 MiB relayed in %.1f ms", ev.RelayedMS, ev.PunchFailures, ev.TransferMS)
	})
}

// TestP2PBootstrapSourcePort is a regression test for a p2p bug found with
// the testnet: a home node given the relay as a bootstrap peer must reach it
// from its listen port (reuseport), or the relay's observation of its public
// address is ignored and the node never hole-punches. The DHT used to dial
// bootstrap peers during libp2p.New, before the swarm listened, and the
// connection got a random port (4 of 6 runs); now only bootstrapLoop dials
// them, after the host listens.
func TestP2PBootstrapSourcePort(t *testing.T) {
	topo := testnet.NewT(t, testnet.Spec{
		Public: []testnet.Public{{Name: "relay"}},
		Homes:  []testnet.Home{{Name: "ha", Hosts: []string{"a"}}},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rp, err := topo.StartSelf(ctx, "relay", "relay", "-impl", "p2p", "-for", "60s")
	if err != nil {
		t.Fatal(err)
	}
	var relay readyEvent
	if err := rp.WaitEvent(ctx, "ready", &relay); err != nil {
		t.Fatal(err)
	}
	addr := "/ip4/" + mustNode(t, topo, "relay").Addr.String() + "/tcp/4001/p2p/" + relay.ID
	bad := 0
	const runs = 5
	for i := range runs {
		p, err := topo.StartSelf(ctx, "a", "peer", "-impl", "p2p", "-bootstrap", "-mode", "listen", "-transport", "tcp",
			"-relay", addr, "-ready-timeout", "3s", "-allow-unready", "-for", "5s")
		if err != nil {
			t.Fatal(err)
		}
		var ev struct {
			Ready  bool     `json:"ready"`
			Local  []string `json:"conn_local_addrs"`
			Listen []string `json:"listen_addrs"`
		}
		if err := p.WaitEvent(ctx, "ready", &ev); err != nil {
			t.Fatal(err)
		}
		p.Kill()
		ports := map[string]bool{}
		for _, l := range ev.Listen {
			ports[l[strings.LastIndex(l, "/")+1:]] = true
		}
		for _, l := range ev.Local {
			if !ports[l[strings.LastIndex(l, "/")+1:]] {
				bad++
				t.Errorf("run %d: connection to the bootstrap relay from %s, not from a listen port %v (hole-punch ready: %v)", i, l, ev.Listen, ev.Ready)
			}
		}
	}
	t.Logf("%d/%d runs dialled the bootstrap relay from a non-listen port", bad, runs)
}
