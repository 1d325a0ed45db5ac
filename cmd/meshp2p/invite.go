package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/pnet"
	"github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"

	"github.com/neuron-tai/meshp2p/node"
	"github.com/neuron-tai/meshp2p/p2p"
)

const inviteUsage = `Usage: meshp2p invite [--data-dir DIR] [--addr HOST:PORT,...] [--swarm-key FILE | --join TOKEN] [-o FILE]

Prints a join token for the node of --data-dir (started by meshp2p start):
one line that start, generate, serve and status take as --join TOKEN in
place of --network, --swarm-key and --bootstrap.

THE TOKEN IS A SECRET: it holds the swarm key, and whoever has it can join
the swarm. Hand it over as you would swarm.key; -o FILE writes it with mode
0600 for --join @FILE. meshp2p never logs it.

It holds the swarm's name, the swarm key and this node's peer id and
addresses, from <data-dir>/node.json (written once the node is ready;
loopback addresses are left out when there are others). --addr gives the
addresses other machines reach the node at instead: host:port (an IP
address or a DNS name, e.g. a router's public address whose port is
forwarded to --listen's) or multiaddrs. The swarm key is the file the node
was started with (node.json names it) unless --swarm-key or --join gives
it; it must be the node's (the fingerprints are compared).
`

// maxInviteAddrs bounds the addresses a token names.
const maxInviteAddrs = 8

// inviteInfo is what invite reads from node.json.
type inviteInfo struct {
	node.Info
	path string
}

func runInvite(_ context.Context, stdout, stderr io.Writer, args []string) error {
	fs := cmdFlagSet("invite", stdout, inviteUsage)
	var nf netFlags
	fs.StringVar(&nf.dataDir, "data-dir", defaultDataDir(), "data directory of the node to invite to (holds its node.json)")
	fs.StringVar(&nf.swarmKey, "swarm-key", notGiven, "the swarm key file (default: the one node.json names)")
	fs.StringVar(&nf.join, "join", notGiven, "a join token of the same swarm (or @FILE, or $"+joinEnv+"): its swarm key, for a node started with --join")
	addrs := fs.String("addr", notGiven, "comma-separated addresses other machines reach the node at: host:port or multiaddrs (default: node.json's)")
	out := fs.String("o", notGiven, "write the token to this file (mode 0600) instead of stdout")
	nf.fs = fs
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	in, err := readNodeInfo(nf.dataDir)
	if err != nil {
		return err
	}
	nf.network = in.Network
	psk, err := inviteKey(&nf, in)
	if err != nil {
		return err
	}
	ai, err := inviteAddrs(in, *addrs)
	if err != nil {
		return err
	}
	tok, err := p2p.JoinToken{Network: in.Network, SwarmKey: psk, Bootstrap: []peer.AddrInfo{ai}}.Encode()
	if err != nil {
		return err
	}
	if *out != "" {
		if err := writeSecretFile(*out, tok+"\n"); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote %s (mode 0600); join with --join @%s\n", *out, *out)
	} else {
		fmt.Fprintln(stdout, tok)
	}
	printInviteNotes(stderr, in, psk, ai)
	return nil
}

// readNodeInfo reads dir's node.json.
func readNodeInfo(dir string) (*inviteInfo, error) {
	if dir == "" {
		return nil, fmt.Errorf("%w: --data-dir is required (no home directory found)", errUsage)
	}
	p := filepath.Join(dir, "node.json")
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("%w (invite names a node started with meshp2p start --data-dir %s; it writes node.json once ready)", err, dir)
	}
	in := &inviteInfo{path: p}
	if err := json.Unmarshal(b, &in.Info); err != nil || in.PeerID == "" || in.Network == "" {
		return nil, fmt.Errorf("%s: not a node's node.json (%v)", p, err)
	}
	return in, nil
}

// inviteKey is the swarm key to put in the token: --swarm-key's, --join's
// or the file node.json names; it must be the node's.
func inviteKey(nf *netFlags, in *inviteInfo) (pnet.PSK, error) {
	var psk pnet.PSK
	tok, err := nf.joinToken()
	switch {
	case err != nil:
		return nil, err
	case tok != nil:
		psk = tok.SwarmKey
	case nf.swarmKey != "":
		psk, err = p2p.ReadSwarmKey(nf.swarmKey)
	case in.SwarmKeyFile != "":
		psk, err = p2p.ReadSwarmKey(in.SwarmKeyFile)
	case in.SwarmKeyFingerprint != "":
		return nil, fmt.Errorf("%w: the node runs a private swarm (key fingerprint %s) but %s names no key file (it was started with --join): give invite its --join TOKEN or --swarm-key FILE", errUsage, in.SwarmKeyFingerprint, in.path)
	}
	if err != nil {
		return nil, err
	}
	fp := ""
	if len(psk) > 0 {
		fp = p2p.SwarmKeyFingerprint(psk)
	}
	if fp != in.SwarmKeyFingerprint {
		return nil, fmt.Errorf("the swarm key given (fingerprint %q) is not the node's (%q, in %s): the token would not join its swarm", fp, in.SwarmKeyFingerprint, in.path)
	}
	return psk, nil
}

// inviteAddrs is the node as the token names it: its peer id and the
// addresses of --addr, else node.json's direct ones (no relay or IPv6
// link-local ones; loopback only when there is nothing else), at most
// maxInviteAddrs.
func inviteAddrs(in *inviteInfo, addrs string) (peer.AddrInfo, error) {
	id, err := peer.Decode(in.PeerID)
	if err != nil {
		return peer.AddrInfo{}, fmt.Errorf("%s: peer id: %v", in.path, err)
	}
	ai := peer.AddrInfo{ID: id}
	for _, s := range splitList(addrs) {
		a, err := hostPortAddr(s)
		if strings.HasPrefix(s, "/") {
			a, err = multiaddr.NewMultiaddr(s)
		}
		if err != nil {
			return ai, fmt.Errorf("%w: --addr %q: want host:port or a multiaddr: %v", errUsage, s, err)
		}
		a, pid := peer.SplitAddr(a)
		if a == nil || (pid != "" && pid != id) {
			return ai, fmt.Errorf("%w: --addr %q is not an address of node %s", errUsage, s, id)
		}
		ai.Addrs = append(ai.Addrs, a)
	}
	if len(ai.Addrs) == 0 {
		var loop []multiaddr.Multiaddr
		for _, s := range in.Addrs {
			a, err := multiaddr.NewMultiaddr(s)
			if err != nil || slices.ContainsFunc(a, func(c multiaddr.Component) bool { return c.Code() == multiaddr.P_CIRCUIT }) {
				continue
			}
			if a, _ = peer.SplitAddr(a); a == nil || manet.IsIP6LinkLocal(a) {
				continue // link-local: needs a zone no other machine knows
			}
			if manet.IsIPLoopback(a) {
				loop = append(loop, a)
			} else {
				ai.Addrs = append(ai.Addrs, a)
			}
		}
		if len(ai.Addrs) == 0 {
			ai.Addrs = loop
		}
	}
	ai.Addrs = ai.Addrs[:min(len(ai.Addrs), maxInviteAddrs)]
	if len(ai.Addrs) == 0 {
		return ai, fmt.Errorf("%s lists no direct address: give the node's with --addr HOST:PORT", in.path)
	}
	return ai, nil
}

// writeSecretFile writes s to path with mode 0600.
func writeSecretFile(path, s string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return err
	}
	if _, err := f.WriteString(s); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// printInviteNotes says what the token holds and that it is a secret.
func printInviteNotes(w io.Writer, in *inviteInfo, psk pnet.PSK, ai peer.AddrInfo) {
	var addrs, ports []string
	for _, a := range ai.Addrs {
		addrs = append(addrs, a.String())
		if p, err := a.ValueForProtocol(multiaddr.P_TCP); err == nil && !slices.Contains(ports, p) {
			ports = append(ports, p)
		}
	}
	if len(psk) > 0 {
		fmt.Fprintf(w, "The join token is a SECRET: it holds the key of swarm %q (fingerprint %s); whoever has it can join. Pass it like swarm.key, never in a chat or a log.\n",
			in.Network, p2p.SwarmKeyFingerprint(psk))
	} else {
		fmt.Fprintf(w, "swarm %q is public (no swarm key): the token holds none, only its name and this node's address.\n", in.Network)
	}
	fmt.Fprintf(w, "It names node %s at %s; the other machines must reach one of them: allow TCP port %s in this machine's firewall (behind a home router, forward it).\n",
		ai.ID, strings.Join(addrs, ", "), strings.Join(ports, ", "))
	fmt.Fprintf(w, "On a new machine: meshp2p start --join TOKEN --model FILE ...   (or generate, serve, status --join TOKEN)\n")
}

// joinHint is the line start prints once ready: how another machine
// joins. It names the invite command, never the token (a secret: this
// output often ends up in a log). joined: the node's swarm key came from
// a token, so invite is given that token (FILE) again.
func joinHint(dataDir string, addrs []string, joined bool) string {
	cmd, note := "meshp2p invite", ""
	if dataDir != defaultDataDir() {
		cmd += " --data-dir " + dataDir
	}
	if joined { // no key file to read: invite needs the token again
		cmd += " --join TOKEN"
		note = " (TOKEN: the one this node joined with)"
	}
	var ports []string
	for _, s := range addrs {
		a, err := multiaddr.NewMultiaddr(s)
		if err != nil || manet.IsIPLoopback(a) {
			continue
		}
		if p, err := a.ValueForProtocol(multiaddr.P_TCP); err == nil && !slices.Contains(ports, p) {
			ports = append(ports, p)
		}
	}
	fw := ""
	if len(ports) > 0 {
		fw = "; other machines connect to TCP " + strings.Join(ports, ", ") + " here (allow it in the firewall)"
	}
	return fmt.Sprintf("to join: run '%s'%s here for a new token (a secret), then 'meshp2p start --join TOKEN ...' on the new machine%s", cmd, note, fw)
}
