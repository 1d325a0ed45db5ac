package testnet

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"regexp"
)

// NATKind is how a home router translates its LAN's source addresses.
type NATKind string

const (
	// PortPreserving is plain MASQUERADE: an endpoint-independent mapping
	// that keeps the LAN source port when it is free. Hole punching works
	// through it (with the router firewall on).
	PortPreserving NATKind = "port-preserving"
	// Symmetric is MASQUERADE --random-fully: a fresh random WAN port per
	// destination (endpoint-dependent mapping). Hole punching fails through
	// it; connections stay relayed.
	Symmetric NATKind = "symmetric"
)

// Role says what a public node is for. It is informational: the testnet
// only builds the network; what runs on a node is up to the caller.
type Role string

// Roles of public nodes.
const (
	RoleBootstrap Role = "bootstrap"
	RoleRelay     Role = "relay"
	RoleTracker   Role = "tracker"
)

// DefaultInternet is the fake internet segment: TEST-NET-3. Never
// 192.0.2.0/24 (TEST-NET-1), where this machine's real eth0 lives.
const DefaultInternet = "203.0.113.0/24"

// DefaultLANs is the range the home LANs are cut from: home i (0-based)
// gets 10.0.<i+1>.0/24 with the router at .1 and hosts from .2.
const DefaultLANs = "10.0.0.0/16"

// Limits of the address plan and of names.
const (
	MaxPublic    = 90  // public nodes get .10 … .99 of the internet /24
	MaxHomes     = 99  // routers get .100 … .198 of the internet /24
	MaxHosts     = 200 // hosts per home get .2 … .201 of the LAN /24
	MaxPrefixLen = 8   // prefix + "-" + name ≤ 15 characters
	MaxNameLen   = 6
)

// Spec describes a topology. The zero value of every optional field
// means the default. It is also the JSON format read by
// `meshp2p testnet up --spec FILE`:
//
//	{
//	  "internet": "203.0.113.0/24",
//	  "public": [{"name": "relay", "roles": ["bootstrap", "relay"]}],
//	  "homes": [
//	    {"name": "home1", "nat": "port-preserving", "hosts": ["a"]},
//	    {"name": "home2", "nat": "symmetric", "hosts": ["b", "c"]},
//	    {"name": "home3", "open_firewall": true, "hosts": ["d"]}
//	  ]
//	}
type Spec struct {
	// Internet is the IPv4 /24 of the "internet" bridge segment
	// (default DefaultInternet).
	Internet string `json:"internet,omitempty"`
	// LANs is the IPv4 /16 the home LANs are cut from (default DefaultLANs).
	LANs   string   `json:"lans,omitempty"`
	Public []Public `json:"public,omitempty"`
	Homes  []Home   `json:"homes,omitempty"`
}

// Public is a node with an address on the internet segment and no NAT.
type Public struct {
	Name  string `json:"name"`
	Roles []Role `json:"roles,omitempty"`
}

// Home is a home router (a node named Name) with hosts on its LAN.
type Home struct {
	Name string `json:"name"`
	// NAT is the source-NAT kind (default PortPreserving).
	NAT NATKind `json:"nat,omitempty"`
	// OpenFirewall turns off the router firewall that drops unsolicited
	// inbound traffic on the WAN side (a plain Linux router). Hole
	// punching was measured to fail 0/10 without that firewall.
	OpenFirewall bool `json:"open_firewall,omitempty"`
	// Hosts are the names of the hosts on the LAN (at least one).
	Hosts []string `json:"hosts"`
}

// ErrSpec is wrapped by every spec validation error.
var ErrSpec = errors.New("testnet: invalid spec")

var (
	nameRE   = regexp.MustCompile(`^[a-z][a-z0-9]*$`)
	prefixRE = regexp.MustCompile(`^[a-z][a-z0-9]*$`)
)

// ReadSpec decodes a JSON spec, rejecting unknown fields.
func ReadSpec(r io.Reader) (Spec, error) {
	var s Spec
	dec := json.NewDecoder(io.LimitReader(r, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return Spec{}, fmt.Errorf("%w: %w", ErrSpec, err)
	}
	return s, nil
}

// SimpleSpec is the spec behind `meshp2p testnet up --homes N`: one public
// node "relay" (bootstrap+relay), and homes "home1"… each with hostsPerHome
// hosts named "h<home>x<host>" ("h1x1", "h1x2", …), all with the same NAT.
func SimpleSpec(homes, hostsPerHome int, nat NATKind) Spec {
	s := Spec{Public: []Public{{Name: "relay", Roles: []Role{RoleBootstrap, RoleRelay}}}}
	for i := 1; i <= homes; i++ {
		h := Home{Name: fmt.Sprintf("home%d", i), NAT: nat}
		for j := 1; j <= hostsPerHome; j++ {
			h.Hosts = append(h.Hosts, fmt.Sprintf("h%dx%d", i, j))
		}
		s.Homes = append(s.Homes, h)
	}
	return s
}

// normalized returns the spec with defaults filled in, or an error.
func (s Spec) normalized() (Spec, error) {
	n := s
	if n.Internet == "" {
		n.Internet = DefaultInternet
	}
	if n.LANs == "" {
		n.LANs = DefaultLANs
	}
	inet, err := netip.ParsePrefix(n.Internet)
	if err != nil || !inet.Addr().Is4() || inet.Bits() != 24 || inet.Masked() != inet {
		return Spec{}, fmt.Errorf("%w: internet %q must be an IPv4 /24 network address", ErrSpec, n.Internet)
	}
	lans, err := netip.ParsePrefix(n.LANs)
	if err != nil || !lans.Addr().Is4() || lans.Bits() != 16 || lans.Masked() != lans {
		return Spec{}, fmt.Errorf("%w: lans %q must be an IPv4 /16 network address", ErrSpec, n.LANs)
	}
	if inet.Overlaps(lans) {
		return Spec{}, fmt.Errorf("%w: internet %s overlaps lans %s", ErrSpec, inet, lans)
	}
	if len(n.Public) > MaxPublic {
		return Spec{}, fmt.Errorf("%w: %d public nodes (max %d)", ErrSpec, len(n.Public), MaxPublic)
	}
	if len(n.Homes) > MaxHomes {
		return Spec{}, fmt.Errorf("%w: %d homes (max %d)", ErrSpec, len(n.Homes), MaxHomes)
	}
	seen := map[string]bool{inetName: true}
	checkName := func(name string) error {
		if len(name) > MaxNameLen || !nameRE.MatchString(name) {
			return fmt.Errorf("%w: node name %q must match [a-z][a-z0-9]* and have at most %d characters", ErrSpec, name, MaxNameLen)
		}
		if seen[name] {
			return fmt.Errorf("%w: node name %q used twice (or reserved)", ErrSpec, name)
		}
		seen[name] = true
		return nil
	}
	n.Public = append([]Public(nil), s.Public...)
	for _, p := range n.Public {
		if err := checkName(p.Name); err != nil {
			return Spec{}, err
		}
	}
	n.Homes = append([]Home(nil), s.Homes...)
	for i := range n.Homes {
		h := &n.Homes[i]
		if err := checkName(h.Name); err != nil {
			return Spec{}, err
		}
		switch h.NAT {
		case "":
			h.NAT = PortPreserving
		case PortPreserving, Symmetric:
		default:
			return Spec{}, fmt.Errorf("%w: home %s: nat %q (want %q or %q)", ErrSpec, h.Name, h.NAT, PortPreserving, Symmetric)
		}
		if len(h.Hosts) == 0 || len(h.Hosts) > MaxHosts {
			return Spec{}, fmt.Errorf("%w: home %s has %d hosts (want 1…%d)", ErrSpec, h.Name, len(h.Hosts), MaxHosts)
		}
		h.Hosts = append([]string(nil), h.Hosts...)
		for _, name := range h.Hosts {
			if err := checkName(name); err != nil {
				return Spec{}, err
			}
		}
	}
	return n, nil
}

// checkNoClash refuses address plans that overlap an address configured on
// this process's interfaces (the root namespace when called from there), so
// the testnet can never shadow or reach the machine's real networks.
func checkNoClash(s Spec) error {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return fmt.Errorf("testnet: list interface addresses: %w", err)
	}
	nets := []netip.Prefix{netip.MustParsePrefix(s.Internet), netip.MustParsePrefix(s.LANs)}
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		ip, ok := netip.AddrFromSlice(ipn.IP)
		if !ok || ip.IsLoopback() {
			continue
		}
		ones, _ := ipn.Mask.Size()
		p := netip.PrefixFrom(ip.Unmap(), ones).Masked()
		for _, n := range nets {
			if n.Overlaps(p) {
				return fmt.Errorf("%w: %s overlaps this machine's interface network %s", ErrSpec, n, p)
			}
		}
	}
	return nil
}

// plan is the address and name plan derived from a normalized spec.
func plan(prefix string, s Spec) []*Node {
	inet := netip.MustParsePrefix(s.Internet).Addr().As4()
	lans := netip.MustParsePrefix(s.LANs).Addr().As4()
	at := func(base [4]byte, c, d int) netip.Addr {
		b := base
		if c >= 0 {
			b[2] = byte(c)
		}
		b[3] = byte(d)
		return netip.AddrFrom4(b)
	}
	var nodes []*Node
	for i, p := range s.Public {
		nodes = append(nodes, &Node{
			Name: p.Name, Kind: KindPublic, NetNS: prefix + "-" + p.Name,
			Addr: at(inet, -1, 10+i), Public: at(inet, -1, 10+i), Roles: append([]Role(nil), p.Roles...),
			port: fmt.Sprintf("p%d", i),
		})
	}
	for i, h := range s.Homes {
		wan := at(inet, -1, 100+i)
		lan := netip.PrefixFrom(at(lans, i+1, 0), 24)
		nodes = append(nodes, &Node{
			Name: h.Name, Kind: KindRouter, NetNS: prefix + "-" + h.Name,
			Addr: wan, Public: wan, LAN: lan, Gateway: at(lans, i+1, 1), NAT: h.NAT, Firewall: !h.OpenFirewall,
			port: fmt.Sprintf("r%d", i),
		})
		for j, name := range h.Hosts {
			nodes = append(nodes, &Node{
				Name: name, Kind: KindHost, NetNS: prefix + "-" + name,
				Addr: at(lans, i+1, 2+j), Public: wan, LAN: lan, Gateway: at(lans, i+1, 1), Router: h.Name,
				NAT: h.NAT, Firewall: !h.OpenFirewall,
				port: fmt.Sprintf("h%d", j),
			})
		}
	}
	return nodes
}

func checkPrefix(prefix string) error {
	if len(prefix) == 0 || len(prefix) > MaxPrefixLen || !prefixRE.MatchString(prefix) {
		return fmt.Errorf("%w: prefix %q must match [a-z][a-z0-9]* and have 1…%d characters", ErrSpec, prefix, MaxPrefixLen)
	}
	return nil
}
