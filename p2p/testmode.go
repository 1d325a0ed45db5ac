package p2p

import (
	"net"
	"net/netip"
	"slices"
	"sync"

	"github.com/libp2p/go-libp2p/p2p/host/observedaddrs"
	manet "github.com/multiformats/go-multiaddr/net"
)

// testModeMu serialises the process-global tweaks below.
var testModeMu sync.Mutex

// applyTestOptions makes the process-global changes TestOptions asks for.
// They are idempotent and never undone (the process is a test binary or a
// testnet child).
func applyTestOptions(t TestOptions) {
	testModeMu.Lock()
	defer testModeMu.Unlock()
	for _, p := range t.PublicCIDRs {
		p = p.Masked()
		overlaps := func(n *net.IPNet) bool {
			ip, ok := netip.AddrFromSlice(n.IP)
			if !ok {
				return false
			}
			ones, _ := n.Mask.Size()
			q := netip.PrefixFrom(ip.Unmap(), ones)
			return q.Overlaps(p)
		}
		manet.Private4 = slices.DeleteFunc(slices.Clone(manet.Private4), overlaps)
		manet.Unroutable4 = slices.DeleteFunc(slices.Clone(manet.Unroutable4), overlaps)
		manet.Private6 = slices.DeleteFunc(slices.Clone(manet.Private6), overlaps)
		manet.Unroutable6 = slices.DeleteFunc(slices.Clone(manet.Unroutable6), overlaps)
	}
	if t.ObservedAddrThreshold > 0 && t.ObservedAddrThreshold < observedaddrs.ActivationThresh {
		observedaddrs.ActivationThresh = t.ObservedAddrThreshold
	}
}
