package main

import (
	"fmt"
	"io"
	"net"
	"net/netip"

	"github.com/neuron-tai/meshp2p/testnet"
)

// testnetRouterRules implements `meshp2p testnet router-rules`: it prints
// the home-router rules of the namespace testnet (testnet.RouterRules) for
// this machine's interfaces, for iptables-restore. The container testnet's
// router containers load them this way, so both testnets NAT and filter
// with the same text.
func testnetRouterRules(stdout, stderr io.Writer, args []string) error {
	fs := newFlagSet("router-rules", stderr)
	lan := fs.String("lan", "", "the LAN (CIDR) to translate; the interface holding an address in it is the LAN side (required)")
	wan := fs.String("wan", "", "the internet segment (CIDR); the interface holding an address in it is the WAN side (required)")
	nat := fs.String("nat", string(testnet.PortPreserving), "port-preserving (MASQUERADE) or symmetric (MASQUERADE --random-fully)")
	open := fs.Bool("open-firewall", false, "no home-router firewall (unsolicited WAN traffic passes)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("%w: unexpected arguments %q", errUsage, fs.Args())
	}
	lanP, err := netip.ParsePrefix(*lan)
	if err != nil {
		return fmt.Errorf("%w: --lan: %w", errUsage, err)
	}
	wanP, err := netip.ParsePrefix(*wan)
	if err != nil {
		return fmt.Errorf("%w: --wan: %w", errUsage, err)
	}
	kind := testnet.NATKind(*nat)
	if kind != testnet.PortPreserving && kind != testnet.Symmetric {
		return fmt.Errorf("%w: --nat %q: want port-preserving or symmetric", errUsage, *nat)
	}
	ifs, err := net.Interfaces()
	if err != nil {
		return fmt.Errorf("listing interfaces: %w", err)
	}
	lanIf, err := interfaceIn(ifs, lanP)
	if err != nil {
		return err
	}
	wanIf, err := interfaceIn(ifs, wanP)
	if err != nil {
		return err
	}
	_, err = io.WriteString(stdout, testnet.RouterRules(testnet.RouterConfig{
		LAN: lanP.Masked(), NAT: kind, Firewall: !*open, WAN: wanIf, LANIf: lanIf,
	}))
	return err
}

// interfaceIn names the interface holding an address inside p.
func interfaceIn(ifs []net.Interface, p netip.Prefix) (string, error) {
	for _, i := range ifs {
		addrs, err := i.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			ipn, ok := a.(*net.IPNet)
			if !ok {
				continue
			}
			if ip, ok := netip.AddrFromSlice(ipn.IP); ok && p.Contains(ip.Unmap()) {
				return i.Name, nil
			}
		}
	}
	return "", fmt.Errorf("no interface here has an address in %s", p)
}
