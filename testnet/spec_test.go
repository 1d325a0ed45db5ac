package testnet

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func TestSpecValidation(t *testing.T) {
	ok := Spec{Public: []Public{{Name: "relay"}}, Homes: []Home{{Name: "home1", Hosts: []string{"a"}}}}
	for _, tc := range []struct {
		name string
		edit func(*Spec)
		want string // substring of the error; "" = valid
	}{
		{"defaults", func(*Spec) {}, ""},
		{"not a /24", func(s *Spec) { s.Internet = "203.0.113.0/16" }, "internet"},
		{"host bits set", func(s *Spec) { s.Internet = "203.0.113.5/24" }, "internet"},
		{"ipv6", func(s *Spec) { s.Internet = "2001:db8::/24" }, "internet"},
		{"lans not /16", func(s *Spec) { s.LANs = "10.0.0.0/8" }, "lans"},
		{"overlap", func(s *Spec) { s.Internet = "10.0.5.0/24" }, "overlaps"},
		{"long name", func(s *Spec) { s.Public[0].Name = "toolong1" }, "at most"},
		{"bad char", func(s *Spec) { s.Public[0].Name = "re-lay" }, "must match"},
		{"duplicate", func(s *Spec) { s.Homes[0].Hosts = []string{"relay"} }, "twice"},
		{"reserved inet", func(s *Spec) { s.Public[0].Name = "inet" }, "twice"},
		{"no hosts", func(s *Spec) { s.Homes[0].Hosts = nil }, "hosts"},
		{"bad nat", func(s *Spec) { s.Homes[0].NAT = "cone" }, "nat"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := ok
			s.Public = append([]Public(nil), ok.Public...)
			s.Homes = append([]Home(nil), ok.Homes...)
			tc.edit(&s)
			n, err := s.normalized()
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if n.Internet != DefaultInternet || n.Homes[0].NAT != PortPreserving {
					t.Fatalf("defaults not filled: %+v", n)
				}
				return
			}
			if !errors.Is(err, ErrSpec) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrSpec containing %q", err, tc.want)
			}
		})
	}
}

func TestPlan(t *testing.T) {
	s, err := SimpleSpec(2, 2, Symmetric).normalized()
	if err != nil {
		t.Fatal(err)
	}
	nodes := plan("mp", s)
	want := map[string]struct {
		kind          Kind
		addr, pub, gw string
		router, netns string
	}{
		"relay": {KindPublic, "203.0.113.10", "203.0.113.10", "invalid IP", "", "mp-relay"},
		"home1": {KindRouter, "203.0.113.100", "203.0.113.100", "10.0.1.1", "", "mp-home1"},
		"h1x2":  {KindHost, "10.0.1.3", "203.0.113.100", "10.0.1.1", "home1", "mp-h1x2"},
		"home2": {KindRouter, "203.0.113.101", "203.0.113.101", "10.0.2.1", "", "mp-home2"},
		"h2x1":  {KindHost, "10.0.2.2", "203.0.113.101", "10.0.2.1", "home2", "mp-h2x1"},
	}
	if len(nodes) != 7 {
		t.Fatalf("%d nodes, want 7", len(nodes))
	}
	for _, n := range nodes {
		if len(n.NetNS) > 15 {
			t.Errorf("netns name %q longer than 15", n.NetNS)
		}
		w, ok := want[n.Name]
		if !ok {
			continue
		}
		if n.Kind != w.kind || n.Addr.String() != w.addr || n.Public.String() != w.pub || n.Gateway.String() != w.gw || n.Router != w.router || n.NetNS != w.netns {
			t.Errorf("%s = %+v, want %+v", n.Name, n, w)
		}
		if n.Kind != KindPublic && (n.NAT != Symmetric || !n.Firewall || n.LAN != netip.MustParsePrefix(n.Gateway.String()+"/24").Masked()) {
			t.Errorf("%s: nat %q firewall %v lan %s", n.Name, n.NAT, n.Firewall, n.LAN)
		}
	}
}

func TestRouterRules(t *testing.T) {
	lan := netip.MustParsePrefix("10.0.1.0/24")
	for _, tc := range []struct {
		n        Node
		want     []string
		wantNone []string
	}{
		{Node{LAN: lan, NAT: PortPreserving, Firewall: true},
			[]string{":FORWARD DROP", "-A INPUT -i wan -j DROP", "-A POSTROUTING -s 10.0.1.0/24 -o wan -j MASQUERADE\n"},
			[]string{"--random-fully"}},
		{Node{LAN: lan, NAT: Symmetric, Firewall: true},
			[]string{"MASQUERADE --random-fully"}, nil},
		{Node{LAN: lan, NAT: PortPreserving, Firewall: false},
			[]string{":FORWARD ACCEPT"}, []string{"DROP"}},
	} {
		r := routerRules(&tc.n)
		for _, w := range tc.want {
			if !strings.Contains(r, w) {
				t.Errorf("%+v: rules lack %q:\n%s", tc.n, w, r)
			}
		}
		for _, w := range tc.wantNone {
			if strings.Contains(r, w) {
				t.Errorf("%+v: rules contain %q:\n%s", tc.n, w, r)
			}
		}
	}
}

func TestPrefixes(t *testing.T) {
	p := TestPrefix()
	if err := checkPrefix(p); err != nil {
		t.Fatal(err)
	}
	pid, ok := ownerOf(p)
	if !ok || pid <= 0 {
		t.Fatalf("ownerOf(%q) = %d, %v", p, pid, ok)
	}
	for _, bad := range []string{"", "Abc", "1abc", "abcdefghi", "a-b"} {
		if checkPrefix(bad) == nil {
			t.Errorf("checkPrefix(%q) accepted", bad)
		}
	}
	if _, ok := ownerOf("mp"); ok {
		t.Error("ownerOf(mp) claims an owner")
	}
}

// A container router names Docker's interfaces; the rules are otherwise the
// namespace routers' text.
func TestRouterRulesInterfaces(t *testing.T) {
	lan := netip.MustParsePrefix("10.0.1.0/24")
	got := RouterRules(RouterConfig{LAN: lan, NAT: PortPreserving, Firewall: true, WAN: "eth0", LANIf: "eth1"})
	for _, w := range []string{"-A FORWARD -i eth1 -o eth0 -j ACCEPT\n", "-A INPUT -i eth0 -j DROP\n", "-A POSTROUTING -s 10.0.1.0/24 -o eth0 -j MASQUERADE\n"} {
		if !strings.Contains(got, w) {
			t.Errorf("rules lack %q:\n%s", w, got)
		}
	}
	def := RouterRules(RouterConfig{LAN: lan, NAT: PortPreserving, Firewall: true})
	n := Node{LAN: lan, NAT: PortPreserving, Firewall: true}
	if def != routerRules(&n) || strings.ReplaceAll(strings.ReplaceAll(got, "eth0", "wan"), "eth1", "lan") != def {
		t.Errorf("renamed rules differ from the namespace routers':\n%s\nvs\n%s", got, def)
	}
}
