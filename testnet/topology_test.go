package testnet_test

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/neuron-tai/meshp2p/testnet"
)

// natSpec: one public node, a port-preserving home (a), a symmetric home
// (s) and a home with its firewall open (o).
func natSpec() testnet.Spec {
	return testnet.Spec{
		Public: []testnet.Public{{Name: "pub", Roles: []testnet.Role{testnet.RoleRelay}}},
		Homes: []testnet.Home{
			{Name: "hpp", NAT: testnet.PortPreserving, Hosts: []string{"a"}},
			{Name: "hsym", NAT: testnet.Symmetric, Hosts: []string{"s"}},
			{Name: "hopen", NAT: testnet.PortPreserving, OpenFirewall: true, Hosts: []string{"o"}},
		},
	}
}

func netnsWithPrefix(t *testing.T, prefix string) []string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		t.Fatalf("ip netns list: %v", err)
	}
	var found []string
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) > 0 && strings.HasPrefix(f[0], prefix+"-") {
			found = append(found, f[0])
		}
	}
	return found
}

func available(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := testnet.Check(ctx); err != nil {
		if os.Getenv(testnet.RequireEnv) == "1" {
			t.Fatal(err)
		}
		t.Skipf("skipping network-namespace test: %v", err)
	}
}

func TestUpCloseLeavesNothing(t *testing.T) {
	available(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	prefix := testnet.TestPrefix()
	topo, err := testnet.Up(ctx, prefix, natSpec(), testnet.Options{LogDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			topo.Close()
		}
	})
	// 6 nodes (pub, 3 routers, 3 hosts) + inet.
	if got := netnsWithPrefix(t, prefix); len(got) != 8 {
		t.Fatalf("after Up: %d namespaces %v, want 8", len(got), got)
	}
	if _, err := testnet.Up(ctx, prefix, natSpec(), testnet.Options{}); !errors.Is(err, testnet.ErrExists) {
		t.Fatalf("second Up with the same prefix: %v, want ErrExists", err)
	}
	p, err := topo.StartSelf(ctx, "a", "sleep", "-for", "60s")
	if err != nil {
		t.Fatal(err)
	}
	if err := p.WaitEvent(ctx, "ready", nil); err != nil {
		t.Fatal(err)
	}
	if err := topo.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	closed = true
	select {
	case <-p.Done():
	case <-time.After(5 * time.Second):
		t.Fatalf("child pid %d still running after Close", p.PID)
	}
	if got := netnsWithPrefix(t, prefix); len(got) != 0 {
		t.Fatalf("after Close: namespaces left: %v", got)
	}
	if _, err := os.Stat(testnet.DefaultStateDir + "/" + prefix + ".json"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("state record left after Close: %v", err)
	}
}

// TestCleanupRemovesLeftovers: a topology abandoned with a process running
// in it (an interrupted run) is removed by Cleanup(prefix), which kills the
// process by PID, and other prefixes are untouched.
func TestCleanupRemovesLeftovers(t *testing.T) {
	available(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	spec := testnet.Spec{Public: []testnet.Public{{Name: "pub"}}, Homes: []testnet.Home{{Name: "home", Hosts: []string{"a"}}}}
	abandoned, other := testnet.TestPrefix(), testnet.TestPrefix()
	topo, err := testnet.Up(ctx, abandoned, spec, testnet.Options{LogDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { topo.Close() })
	keep, err := testnet.Up(ctx, other, spec, testnet.Options{LogDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { keep.Close() })
	p, err := topo.StartSelf(ctx, "a", "sleep", "-for", "60s")
	if err != nil {
		t.Fatal(err)
	}
	if err := p.WaitEvent(ctx, "ready", nil); err != nil {
		t.Fatal(err)
	}
	if err := testnet.Cleanup(ctx, abandoned); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	select {
	case <-p.Done():
	case <-time.After(5 * time.Second):
		t.Fatalf("process pid %d in the abandoned topology survived Cleanup", p.PID)
	}
	if got := netnsWithPrefix(t, abandoned); len(got) != 0 {
		t.Fatalf("after Cleanup: namespaces left: %v", got)
	}
	if got := netnsWithPrefix(t, other); len(got) != 4 {
		t.Fatalf("Cleanup(%s) touched %s: namespaces now %v", abandoned, other, got)
	}
}

type probeResult struct {
	TCPSeen string   `json:"tcp_seen"`
	UDPPort int      `json:"udp_port"`
	UDPSeen []string `json:"udp_seen"`
}

type dialResult struct {
	OK      bool   `json:"ok"`
	Timeout bool   `json:"timeout"`
	Error   string `json:"error"`
}

// TestNATAndFirewall: hosts reach the public node and are seen from their
// router's WAN address; a port-preserving NAT keeps the source port for
// every destination while a symmetric one picks a new port per
// destination; and the router firewall drops unsolicited inbound traffic
// (while a router with the firewall open lets the same dial through).
func TestNATAndFirewall(t *testing.T) {
	topo := testnet.NewT(t, natSpec())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pub := mustNode(t, topo, "pub")

	obs, err := topo.StartSelf(ctx, "pub", "observe", "-for", "30s")
	if err != nil {
		t.Fatal(err)
	}
	if err := obs.WaitEvent(ctx, "ready", nil); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		host      string
		symmetric bool
	}{{"a", false}, {"s", true}} {
		t.Run("translate/"+tc.host, func(t *testing.T) {
			h := mustNode(t, topo, tc.host)
			p, err := topo.StartSelf(ctx, tc.host, "probe", "-server", pub.Addr.String())
			if err != nil {
				t.Fatal(err)
			}
			var r probeResult
			if err := p.WaitEvent(ctx, "result", &r); err != nil {
				t.Fatal(err)
			}
			tcpIP, _, _ := net.SplitHostPort(r.TCPSeen)
			if tcpIP != h.Public.String() || h.Public == h.Addr {
				t.Errorf("TCP from %s (%s) seen as %s, want from router WAN %s", tc.host, h.Addr, r.TCPSeen, h.Public)
			}
			if len(r.UDPSeen) != 2 {
				t.Fatalf("UDP probe: %+v", r)
			}
			var ports [2]int
			for i, s := range r.UDPSeen {
				ip, port, _ := net.SplitHostPort(s)
				if ip != h.Public.String() {
					t.Errorf("UDP from %s seen as %s, want from %s", tc.host, s, h.Public)
				}
				ports[i], _ = strconv.Atoi(port)
			}
			if !tc.symmetric && (ports[0] != r.UDPPort || ports[1] != r.UDPPort) {
				t.Errorf("port-preserving NAT: local UDP port %d seen as %v by two destinations, want it kept", r.UDPPort, ports)
			}
			if tc.symmetric && ports[0] == ports[1] {
				t.Errorf("symmetric NAT: both destinations saw port %d, want a new mapping per destination", ports[0])
			}
		})
	}

	t.Run("firewall", func(t *testing.T) {
		// A route on the public node towards each LAN via its router's WAN
		// (an attacker next to the router; only inside our namespaces).
		for _, host := range []string{"a", "o"} {
			h := mustNode(t, topo, host)
			if out, err := exec.Command("ip", "-n", pub.NetNS, "route", "add", h.LAN.String(), "via", h.Public.String()).CombinedOutput(); err != nil {
				t.Fatalf("route: %v: %s", err, out)
			}
			l, err := topo.StartSelf(ctx, host, "listen", "-addr", ":7100", "-for", "20s")
			if err != nil {
				t.Fatal(err)
			}
			if err := l.WaitEvent(ctx, "ready", nil); err != nil {
				t.Fatal(err)
			}
		}
		for _, tc := range []struct {
			name, target string
			wantOK       bool
		}{
			{"LAN host behind firewall", mustNode(t, topo, "a").Addr.String() + ":7100", false},
			{"router WAN", mustNode(t, topo, "hpp").Addr.String() + ":7100", false},
			{"LAN host behind open router (control)", mustNode(t, topo, "o").Addr.String() + ":7100", true},
		} {
			d, err := topo.StartSelf(ctx, "pub", "dial", "-addr", tc.target, "-timeout", "1s")
			if err != nil {
				t.Fatal(err)
			}
			var r dialResult
			if err := d.WaitEvent(ctx, "result", &r); err != nil {
				t.Fatal(err)
			}
			if r.OK != tc.wantOK {
				t.Errorf("%s: dial %s from the internet: ok=%v (%s), want ok=%v", tc.name, tc.target, r.OK, r.Error, tc.wantOK)
			}
			if !tc.wantOK && !r.Timeout {
				t.Errorf("%s: dial %s failed with %q, want a timeout (dropped, not rejected)", tc.name, tc.target, r.Error)
			}
		}
	})
}

func mustNode(t *testing.T, topo *testnet.Topology, name string) *testnet.Node {
	t.Helper()
	n, err := topo.Node(name)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// --- children ---

func childSleep(args []string) error {
	fs := flag.NewFlagSet("sleep", flag.ContinueOnError)
	d := fs.Duration("for", 10*time.Second, "")
	if err := fs.Parse(args); err != nil {
		return err
	}
	emit(map[string]any{"event": "ready", "pid": os.Getpid()})
	time.Sleep(*d)
	return nil
}

// childObserve answers on TCP :7000 and UDP :7001, :7002 with the address
// it sees the peer as.
func childObserve(args []string) error {
	fs := flag.NewFlagSet("observe", flag.ContinueOnError)
	d := fs.Duration("for", 30*time.Second, "lifetime")
	if err := fs.Parse(args); err != nil {
		return err
	}
	l, err := net.Listen("tcp4", ":7000")
	if err != nil {
		return err
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "%s\n", c.RemoteAddr())
			c.Close()
		}
	}()
	for _, port := range []int{7001, 7002} {
		pc, err := net.ListenPacket("udp4", fmt.Sprintf(":%d", port))
		if err != nil {
			return err
		}
		go func() {
			buf := make([]byte, 64)
			for {
				_, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				pc.WriteTo([]byte(from.String()), from)
			}
		}()
	}
	emit(map[string]any{"event": "ready"})
	time.Sleep(*d)
	return nil
}

// childProbe asks the observer how it sees us over TCP, and over UDP from
// one local port to two destination ports.
func childProbe(args []string) error {
	fs := flag.NewFlagSet("probe", flag.ContinueOnError)
	server := fs.String("server", "", "observer IP")
	if err := fs.Parse(args); err != nil {
		return err
	}
	c, err := net.DialTimeout("tcp4", net.JoinHostPort(*server, "7000"), 3*time.Second)
	if err != nil {
		return err
	}
	c.SetDeadline(time.Now().Add(3 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	c.Close()
	if err != nil {
		return err
	}
	pc, err := net.ListenPacket("udp4", ":0")
	if err != nil {
		return err
	}
	defer pc.Close()
	res := map[string]any{"event": "result", "tcp_seen": strings.TrimSpace(line), "udp_port": pc.LocalAddr().(*net.UDPAddr).Port}
	var seen []string
	buf := make([]byte, 64)
	for _, port := range []string{"7001", "7002"} {
		dst, err := net.ResolveUDPAddr("udp4", net.JoinHostPort(*server, port))
		if err != nil {
			return err
		}
		var got string
		for try := 0; try < 5 && got == ""; try++ { // UDP: bounded retries
			pc.WriteTo([]byte("?"), dst)
			pc.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
			n, _, err := pc.ReadFrom(buf)
			if err == nil {
				got = string(buf[:n])
			}
		}
		if got == "" {
			return fmt.Errorf("no UDP answer from %s", dst)
		}
		seen = append(seen, got)
	}
	res["udp_seen"] = seen
	emit(res)
	return nil
}

func childListen(args []string) error {
	fs := flag.NewFlagSet("listen", flag.ContinueOnError)
	addr := fs.String("addr", ":7100", "")
	d := fs.Duration("for", 20*time.Second, "lifetime")
	if err := fs.Parse(args); err != nil {
		return err
	}
	l, err := net.Listen("tcp4", *addr)
	if err != nil {
		return err
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	emit(map[string]any{"event": "ready"})
	time.Sleep(*d)
	return nil
}

func childDial(args []string) error {
	fs := flag.NewFlagSet("dial", flag.ContinueOnError)
	addr := fs.String("addr", "", "")
	timeout := fs.Duration("timeout", time.Second, "")
	if err := fs.Parse(args); err != nil {
		return err
	}
	c, err := net.DialTimeout("tcp4", *addr, *timeout)
	if err != nil {
		emit(map[string]any{"event": "result", "ok": false, "error": err.Error(), "timeout": errors.Is(err, os.ErrDeadlineExceeded) || isTimeout(err), "refused": errors.Is(err, syscall.ECONNREFUSED)})
		return nil
	}
	c.Close()
	emit(map[string]any{"event": "result", "ok": true})
	return nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
