package p2p

import (
	"errors"
	"fmt"
	"net"
	"syscall"

	"github.com/multiformats/go-multiaddr"
)

// ErrPortInUse: a listen address names a port another socket holds.
var ErrPortInUse = errors.New("port in use")

// CheckListenAddrs fails with ErrPortInUse, naming the address and port,
// when a listen address with a fixed port (not 0) cannot be bound now.
// go-libp2p binds its TCP listeners with SO_REUSEPORT, so a second node
// on a port another one holds would bind it too, print its address and
// get half of the first one's connections from the kernel: a plain bind,
// made and released here first, refuses that port instead. New checks
// its listen addresses; callers that do slow work before New (loading a
// model) check them sooner too. Addresses that do not parse or bind for
// another reason are left to the host, whose error names them.
func CheckListenAddrs(addrs []string) error {
	for _, s := range addrs {
		a, err := multiaddr.NewMultiaddr(s)
		if err != nil {
			continue
		}
		netw, hostport, ok := bindArgs(a)
		if !ok {
			continue
		}
		// Other failures (an address not on this host) are the host's to
		// report: it starts if any listen address binds.
		if err := probeBind(netw, hostport); errors.Is(err, syscall.EADDRINUSE) {
			_, port, _ := net.SplitHostPort(hostport)
			return fmt.Errorf("%w: listen address %s: %s port %s is in use (another meshp2p node or program listens on it; stop it, or choose another port, or port 0 for a random one)",
				ErrPortInUse, s, netw[:3], port)
		}
	}
	return nil
}

// bindArgs is what net.Listen (tcp) or net.ListenPacket (udp: QUIC) takes
// for a's IP and port, when the port is fixed.
func bindArgs(a multiaddr.Multiaddr) (netw, hostport string, ok bool) {
	ip, err := a.ValueForProtocol(multiaddr.P_IP4)
	netw = "4"
	if err != nil {
		if ip, err = a.ValueForProtocol(multiaddr.P_IP6); err != nil {
			return "", "", false
		}
		netw = "6"
	}
	port, err := a.ValueForProtocol(multiaddr.P_TCP)
	netw = "tcp" + netw
	if err != nil {
		if port, err = a.ValueForProtocol(multiaddr.P_UDP); err != nil {
			return "", "", false
		}
		netw = "udp" + netw[3:]
	}
	if port == "0" {
		return "", "", false
	}
	return netw, net.JoinHostPort(ip, port), true
}

// probeBind binds hostport on netw without SO_REUSEPORT and releases it.
func probeBind(netw, hostport string) error {
	if netw[:3] == "udp" {
		c, err := net.ListenPacket(netw, hostport)
		if err != nil {
			return err
		}
		return c.Close()
	}
	l, err := net.Listen(netw, hostport)
	if err != nil {
		return err
	}
	return l.Close()
}
