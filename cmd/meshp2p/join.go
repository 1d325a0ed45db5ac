package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/pnet"
	"github.com/multiformats/go-multiaddr"

	"github.com/neuron-tai/meshp2p/p2p"
)

// Joining with one token (issue 41 item 3): --join TOKEN (or --join
// @FILE, or $MESHP2P_JOIN) stands for --network, --swarm-key and
// --bootstrap. --swarm-key beside --join is an error (two keys), and so
// is a --network other than the token's; --bootstrap adds peers to the
// token's. An explicit --swarm-key turns $MESHP2P_JOIN off (the flag
// wins over the environment). The token is a secret and is never
// printed, logged or quoted in an error.

// joinEnv is the environment variable that holds a join token.
const joinEnv = "MESHP2P_JOIN"

const joinUsage = "join token from 'meshp2p invite' (or @FILE holding one, or $" + joinEnv + "): sets --network, the swarm key and the bootstrap peers; --bootstrap adds peers to it. A secret: whoever has it can join the swarm (on a shared machine use @FILE or $" + joinEnv + ": other users can read command lines)"

// given reports whether the flag name was set on the command line.
func (f *netFlags) given(name string) bool {
	found := false
	if f.fs != nil {
		f.fs.Visit(func(fl *flag.Flag) { found = found || fl.Name == name })
	}
	return found
}

// joinToken is the token of --join or $MESHP2P_JOIN (nil: none).
func (f *netFlags) joinToken() (*p2p.JoinToken, error) {
	src, text := "--join", f.join
	if text == "" && !f.given("swarm-key") {
		src, text = "$"+joinEnv, os.Getenv(joinEnv)
	}
	if strings.TrimSpace(text) == "" {
		return nil, nil
	}
	if path, ok := strings.CutPrefix(text, "@"); ok {
		b, err := readSecretFile(path)
		if err != nil {
			return nil, fmt.Errorf("%w: %s @%s: %v", errUsage, src, path, err)
		}
		text = string(b)
	}
	tok, err := p2p.DecodeJoinToken(text)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", errUsage, src, err)
	}
	switch {
	case f.given("swarm-key"):
		return nil, fmt.Errorf("%w: --join carries the swarm key; drop --swarm-key", errUsage)
	case f.given("network") && f.network != tok.Network:
		return nil, fmt.Errorf("%w: %s is for --network %q, not %q; drop --network", errUsage, src, tok.Network, f.network)
	}
	return &tok, nil
}

// readSecretFile reads a small file holding a secret, refusing one that
// group or others may read (as the swarm key is refused).
func readSecretFile(path string) ([]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("mode %04o: anyone who can read it can join the swarm; run chmod 600 %s", st.Mode().Perm(), path)
	}
	if st.Size() > 64<<10 {
		return nil, fmt.Errorf("%d bytes: not a join token", st.Size())
	}
	return os.ReadFile(path)
}

// applyJoin sets c's network, swarm key and bootstrap peers from the
// token (if any) and the flags; host:port bootstrap peers are resolved
// under the swarm key (resolvePeer).
func (f *netFlags) applyJoin(c *p2p.Config) error {
	tok, err := f.joinToken()
	if err != nil {
		return err
	}
	var psk pnet.PSK
	if tok != nil {
		f.network = tok.Network
		c.SwarmKey = tok.SwarmKeyFile()
		psk = tok.SwarmKey
		c.Bootstrap = append(c.Bootstrap, tok.Bootstrap...)
	} else if f.swarmKey != "" {
		c.SwarmKeyPath = f.swarmKey
		if psk, err = p2p.ReadSwarmKey(f.swarmKey); err != nil {
			return err
		}
	}
	c.Network = f.network
	more, err := parsePeers(f.bootstrap, "--bootstrap", psk)
	if err != nil {
		return err
	}
	c.Bootstrap = append(c.Bootstrap, more...)
	return nil
}

// parsePeers parses a comma-separated list of multiaddrs ending in
// /p2p/<id>, or host:port forms (or TCP multiaddrs without /p2p) whose
// peer id is learnt under psk.
func parsePeers(s, flagName string, psk pnet.PSK) ([]peer.AddrInfo, error) {
	var out []peer.AddrInfo
	for _, part := range splitList(s) {
		if strings.HasPrefix(part, "/") {
			hp, bare := bareTCPAddr(part)
			if !bare {
				ais, err := parseAddrInfos(part)
				if err != nil {
					return nil, err
				}
				out = append(out, ais...)
				continue
			}
			part = hp
		}
		ai, err := resolvePeer(part, flagName, psk)
		if err != nil {
			return nil, err
		}
		out = append(out, ai)
	}
	return out, nil
}

// resolvePeer turns host:port into a peer: its TCP multiaddr and the
// peer id learnt by p2p.ProbePeerID, which is safe only under a swarm
// key (only members get through the handshake). Without one, the full
// multiaddr is needed.
func resolvePeer(hostport, flagName string, psk pnet.PSK) (peer.AddrInfo, error) {
	a, err := hostPortAddr(hostport)
	if err != nil {
		return peer.AddrInfo{}, fmt.Errorf("%w: %s %q: want a multiaddr (/ip4/…/tcp/PORT/p2p/ID) or host:port: %v", errUsage, flagName, hostport, err)
	}
	if len(psk) == 0 {
		return peer.AddrInfo{}, fmt.Errorf("%w: %s %q: host:port works in a private swarm only (with --swarm-key or --join: then only a member can answer with its peer id); give the node's full address ending in /p2p/<peer id> (an \"address:\" line start printed), or a --join token from meshp2p invite", errUsage, flagName, hostport)
	}
	ctx, cancel := context.WithTimeout(context.Background(), bootstrapProbeTimeout)
	defer cancel()
	id, err := p2p.ProbePeerID(ctx, hostport, psk)
	if err != nil {
		return peer.AddrInfo{}, fmt.Errorf("%s %s: cannot learn its peer id: %v (host:port is resolved once, at start, so that node must be up now; a full /p2p/<id> address or a --join token is retried until it is)", flagName, hostport, err)
	}
	return peer.AddrInfo{ID: id, Addrs: []multiaddr.Multiaddr{a}}, nil
}

// bootstrapProbeTimeout bounds learning one host:port's peer id.
const bootstrapProbeTimeout = 10 * time.Second

// hostPortAddr is host:port's TCP multiaddr: /ip4, /ip6 or /dns.
func hostPortAddr(hostport string) (multiaddr.Multiaddr, error) {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return nil, err
	}
	if host == "" {
		return nil, fmt.Errorf("no host")
	}
	proto := "dns"
	if ip, err := netip.ParseAddr(host); err == nil {
		proto = "ip4"
		if !ip.Unmap().Is4() {
			proto = "ip6"
		}
		host = ip.Unmap().String()
	}
	return multiaddr.NewMultiaddr("/" + proto + "/" + host + "/tcp/" + port)
}

// bareTCPAddr is the host:port of a multiaddr /ip4|ip6|dns|dns4|dns6/HOST/tcp/PORT
// with no /p2p part (bare false for anything else).
func bareTCPAddr(s string) (hostport string, bare bool) {
	m, err := multiaddr.NewMultiaddr(s)
	if err != nil || len(m) != 2 {
		return "", false
	}
	port, err := m.ValueForProtocol(multiaddr.P_TCP)
	if err != nil {
		return "", false
	}
	switch m[0].Code() {
	case multiaddr.P_IP4, multiaddr.P_IP6, multiaddr.P_DNS, multiaddr.P_DNS4, multiaddr.P_DNS6:
		return net.JoinHostPort(m[0].Value(), port), true
	}
	return "", false
}
