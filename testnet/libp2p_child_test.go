package testnet_test

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-libp2p/p2p/host/autorelay"
	rcmgr "github.com/libp2p/go-libp2p/p2p/host/resource-manager"
	"github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/relay"
	"github.com/libp2p/go-libp2p/p2p/protocol/holepunch"
	libp2pquic "github.com/libp2p/go-libp2p/p2p/transport/quic"
	"github.com/libp2p/go-libp2p/p2p/transport/tcp"
	"github.com/libp2p/go-libp2p/x/rate"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
)

// sinkProto: the dialer sends N bytes, half-closes, the listener answers
// with the 8-byte count it received.
const sinkProto = "/testnet/sink/1.0.0"

// markPublic removes the testnet's internet CIDR from go-multiaddr's
// "unroutable"/"private" lists, in this child process only: libp2p never
// hole-punches without public addresses.
func markPublic(cidr string) error {
	_, n, err := net.ParseCIDR(cidr)
	if err != nil {
		return err
	}
	drop := func(x *net.IPNet) bool { return x.Contains(n.IP) }
	manet.Unroutable4 = slices.DeleteFunc(slices.Clone(manet.Unroutable4), drop)
	manet.Private4 = slices.DeleteFunc(slices.Clone(manet.Private4), drop)
	return nil
}

// relaxedRcmgr lifts the per-IP connection rate limit and count for the
// testnet internet (every host behind one NAT shares an IP).
func relaxedRcmgr(cidr string) (network.ResourceManager, error) {
	pfx, err := netip.ParsePrefix(cidr)
	if err != nil {
		return nil, err
	}
	return rcmgr.NewResourceManager(rcmgr.NewFixedLimiter(rcmgr.DefaultLimits.AutoScale()),
		rcmgr.WithConnRateLimiters(&rate.Limiter{NetworkPrefixLimits: []rate.PrefixLimit{{Prefix: pfx}}}),
		rcmgr.WithNetworkPrefixLimit([]rcmgr.NetworkPrefixLimit{{Network: pfx, ConnCount: 100000}}, nil))
}

func transportOpts(transport string, port int) ([]libp2p.Option, error) {
	var listen []string
	var opts []libp2p.Option
	if transport == "tcp" || transport == "both" {
		listen = append(listen, fmt.Sprintf("/ip4/0.0.0.0/tcp/%d", port))
		opts = append(opts, libp2p.Transport(tcp.NewTCPTransport))
	}
	if transport == "quic" || transport == "both" {
		listen = append(listen, fmt.Sprintf("/ip4/0.0.0.0/udp/%d/quic-v1", port))
		opts = append(opts, libp2p.Transport(libp2pquic.NewTransport))
	}
	if len(listen) == 0 {
		return nil, fmt.Errorf("transport %q: want tcp, quic or both", transport)
	}
	return append(opts, libp2p.ListenAddrStrings(listen...)), nil
}

func addrStrings(h host.Host) []string {
	var out []string
	for _, a := range h.Addrs() {
		out = append(out, a.String())
	}
	return out
}

// childRelay: a public relay (and identify/AutoNAT server) on port 4001.
func childRelay(args []string) error {
	fs := flag.NewFlagSet("relay", flag.ContinueOnError)
	life := fs.Duration("for", 60*time.Second, "lifetime")
	inet := fs.String("internet", "203.0.113.0/24", "CIDR to treat as public")
	limits := fs.String("limits", "infinite", "relay circuit limits: infinite or default")
	impl := fs.String("impl", "p2p", "p2p (meshp2p's host) or raw (plain go-libp2p)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *impl == "p2p" {
		return p2pRelay(*life, *inet, *limits)
	}
	if err := markPublic(*inet); err != nil {
		return err
	}
	rm, err := relaxedRcmgr(*inet)
	if err != nil {
		return err
	}
	var ropts []relay.Option
	if *limits == "infinite" {
		ropts = append(ropts, relay.WithInfiniteLimits())
	}
	opts, _ := transportOpts("both", 4001)
	h, err := libp2p.New(append(opts,
		libp2p.EnableRelayService(ropts...),
		libp2p.ForceReachabilityPublic(),
		libp2p.EnableNATService(),
		libp2p.ResourceManager(rm),
	)...)
	if err != nil {
		return err
	}
	defer h.Close()
	emit(map[string]any{"event": "ready", "id": h.ID().String(), "addrs": addrStrings(h)})
	time.Sleep(*life)
	return nil
}

// punchTracer counts hole-punch outcomes.
type punchTracer struct {
	mu       sync.Mutex
	failures int
	success  int
	errs     []string
}

func (p *punchTracer) Trace(evt *holepunch.Event) {
	if evt.Type != holepunch.EndHolePunchEvtT {
		return
	}
	e, ok := evt.Evt.(*holepunch.EndHolePunchEvt)
	if !ok {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if e.Success {
		p.success++
	} else {
		p.failures++
		if len(p.errs) < 8 {
			p.errs = append(p.errs, e.Error)
		}
	}
}

func (p *punchTracer) counts() (success, failures int, errs []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.success, p.failures, slices.Clone(p.errs)
}

type peerConfig struct {
	transport string
	relays    []peer.AddrInfo
	inet      string
	bootstrap bool // p2p: also pass the relays as bootstrap peers
}

// testPeer is what the peer child needs from a node: plain go-libp2p
// (rawPeer, the spike's setup) or meshp2p's p2p.Node (p2pPeer).
type testPeer interface {
	Host() host.Host
	// Direct reports whether the node itself considers p reached directly.
	Direct(p peer.ID) bool
	// Punches returns hole-punch outcomes with p so far.
	Punches(p peer.ID) (success, failures int, errs []string)
	NewStream(ctx context.Context, p peer.ID, proto protocol.ID) (network.Stream, error)
	Close() error
}

type rawPeer struct {
	h  host.Host
	tr *punchTracer
}

func (r rawPeer) Host() host.Host { return r.h }
func (r rawPeer) Close() error    { return r.h.Close() }

func (r rawPeer) Direct(p peer.ID) bool {
	return slices.ContainsFunc(r.h.Network().ConnsToPeer(p), func(c network.Conn) bool { return !isRelayed(c) })
}

func (r rawPeer) Punches(peer.ID) (int, int, []string) { return r.tr.counts() }

func (r rawPeer) NewStream(ctx context.Context, p peer.ID, proto protocol.ID) (network.Stream, error) {
	return r.h.NewStream(network.WithAllowLimitedConn(ctx, "testnet"), p, proto)
}

func newRawPeer(cfg peerConfig) (testPeer, error) {
	if err := markPublic(cfg.inet); err != nil {
		return nil, err
	}
	opts, err := transportOpts(cfg.transport, 0)
	if err != nil {
		return nil, err
	}
	tr := &punchTracer{}
	h, err := libp2p.New(append(opts,
		libp2p.EnableRelay(),
		libp2p.EnableAutoRelayWithStaticRelays(cfg.relays, autorelay.WithBootDelay(0)),
		libp2p.EnableHolePunching(holepunch.WithTracer(tr)),
		libp2p.ForceReachabilityPrivate(),
	)...)
	if err != nil {
		return nil, err
	}
	return rawPeer{h: h, tr: tr}, nil
}

// isRelayed reports whether a connection goes through a circuit relay (a
// relay with raised limits does not mark it Limited, so look at the addr).
func isRelayed(c network.Conn) bool {
	_, err := c.RemoteMultiaddr().ValueForProtocol(ma.P_CIRCUIT)
	return err == nil
}

// waitPunchReady waits until the hole-punch service runs (it starts only
// once the host has a public observed address) and, if needCircuit, the
// host advertises a relay circuit address.
func waitPunchReady(ctx context.Context, h host.Host, needCircuit bool) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		dcutr := slices.Contains(h.Mux().Protocols(), holepunch.Protocol)
		circuit := !needCircuit || slices.ContainsFunc(h.Addrs(), func(a ma.Multiaddr) bool {
			return strings.Contains(a.String(), "/p2p-circuit")
		})
		if dcutr && circuit {
			return nil
		}
		select {
		case <-ctx.Done():
			var conns []string
			for _, c := range h.Network().Conns() {
				conns = append(conns, c.LocalMultiaddr().String()+"->"+c.RemoteMultiaddr().String())
			}
			return fmt.Errorf("not ready (dcutr=%v circuit=%v addrs=%v conns=%v): %w", dcutr, circuit, h.Addrs(), conns, ctx.Err())
		case <-tick.C:
		}
	}
}

// childPeer: a NATed peer. -mode listen waits for streams; -mode dial
// connects to -target through the relay, waits for a direct connection (or
// the hole punch to give up) and sends -bytes over a stream.
func childPeer(args []string) error {
	fs := flag.NewFlagSet("peer", flag.ContinueOnError)
	life := fs.Duration("for", 60*time.Second, "lifetime")
	mode := fs.String("mode", "listen", "listen or dial")
	transport := fs.String("transport", "tcp", "tcp, quic or both")
	relayFlag := fs.String("relay", "", "relay multiaddrs with /p2p/ID, comma separated")
	inet := fs.String("internet", "203.0.113.0/24", "CIDR to treat as public")
	target := fs.String("target", "", "dial: peer ID of the listener")
	nbytes := fs.Int64("bytes", 1<<20, "dial: bytes to send")
	dataWhen := fs.String("data-when", "direct", "dial: send when the connection is direct, or at once over the relay (relayed)")
	waitDirect := fs.Duration("wait-direct", 10*time.Second, "dial: how long to wait for a direct connection")
	impl := fs.String("impl", "p2p", "p2p (meshp2p's host) or raw (plain go-libp2p)")
	bootstrap := fs.Bool("bootstrap", false, "p2p: pass the relays as bootstrap peers too")
	readyTimeout := fs.Duration("ready-timeout", 20*time.Second, "how long to wait for DCUtR readiness")
	allowUnready := fs.Bool("allow-unready", false, "report readiness timeouts in the ready event (ready=false) instead of failing")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), *life)
	defer cancel()

	var relays []peer.AddrInfo
	for _, s := range strings.Split(*relayFlag, ",") {
		if s == "" {
			continue
		}
		ai, err := peer.AddrInfoFromString(s)
		if err != nil {
			return fmt.Errorf("relay %q: %w", s, err)
		}
		relays = append(relays, *ai)
	}
	if len(relays) == 0 {
		return errors.New("no -relay")
	}
	start := time.Now()
	newPeer := newRawPeer
	if *impl == "p2p" {
		newPeer = newP2PPeer
	}
	node, err := newPeer(peerConfig{transport: *transport, relays: relays, inet: *inet, bootstrap: *bootstrap})
	if err != nil {
		return err
	}
	defer node.Close()
	h := node.Host()
	h.SetStreamHandler(sinkProto, func(s network.Stream) {
		defer s.Close()
		s.SetDeadline(time.Now().Add(60 * time.Second))
		n, _ := io.Copy(io.Discard, s)
		var b [8]byte
		binary.BigEndian.PutUint64(b[:], uint64(n))
		s.Write(b[:])
	})
	for _, r := range relays {
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		err := h.Connect(cctx, r)
		ccancel()
		if err != nil {
			return fmt.Errorf("connect relay: %w", err)
		}
	}
	rctx, rcancel := context.WithTimeout(ctx, *readyTimeout)
	err = waitPunchReady(rctx, h, *mode == "listen")
	rcancel()
	if err != nil && !*allowUnready {
		return err
	}
	var local []string
	for _, c := range h.Network().Conns() {
		local = append(local, c.LocalMultiaddr().String())
	}
	var listen []string
	for _, a := range h.Network().ListenAddresses() {
		listen = append(listen, a.String())
	}
	emit(map[string]any{"event": "ready", "id": h.ID().String(), "addrs": addrStrings(h), "ready_ms": ms(time.Since(start)),
		"ready": err == nil, "conn_local_addrs": local, "listen_addrs": listen})
	if err != nil {
		return nil
	}
	if *mode == "listen" {
		<-ctx.Done()
		return nil
	}

	tid, err := peer.Decode(*target)
	if err != nil {
		return fmt.Errorf("target: %w", err)
	}
	var circuit []ma.Multiaddr
	for _, r := range relays {
		for _, a := range r.Addrs {
			ca, err := ma.NewMultiaddr(a.String() + "/p2p/" + r.ID.String() + "/p2p-circuit")
			if err != nil {
				return err
			}
			circuit = append(circuit, ca)
		}
	}
	t0 := time.Now()
	cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
	err = h.Connect(cctx, peer.AddrInfo{ID: tid, Addrs: circuit})
	ccancel()
	if err != nil {
		return fmt.Errorf("relayed connect: %w", err)
	}
	res := map[string]any{"event": "result", "relayed_ms": ms(time.Since(t0))}

	send := func() error {
		sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
		defer scancel()
		s, err := node.NewStream(sctx, tid, sinkProto)
		if err != nil {
			return fmt.Errorf("stream: %w", err)
		}
		defer s.Close()
		s.SetDeadline(time.Now().Add(30 * time.Second))
		res["stream_relayed"] = isRelayed(s.Conn())
		ts := time.Now()
		buf := make([]byte, 64<<10)
		var sent int64
		for sent < *nbytes {
			n := int(min(int64(len(buf)), *nbytes-sent))
			w, err := s.Write(buf[:n])
			sent += int64(w)
			if err != nil {
				res["bytes_sent"] = sent
				return fmt.Errorf("write after %d bytes: %w", sent, err)
			}
		}
		if err := s.CloseWrite(); err != nil {
			return err
		}
		var b [8]byte
		if _, err := io.ReadFull(s, b[:]); err != nil {
			return fmt.Errorf("ack after %d bytes: %w", sent, err)
		}
		res["bytes_sent"] = sent
		res["bytes_acked"] = binary.BigEndian.Uint64(b[:])
		res["transfer_ms"] = ms(time.Since(ts))
		return nil
	}
	if *dataWhen == "relayed" {
		if err := send(); err != nil {
			res["send_error"] = err.Error()
		}
	}

	// Wait for a direct connection, or for the hole punch to give up
	// (3 failed attempts), bounded by -wait-direct.
	deadline := time.After(*waitDirect)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	direct := ""
wait:
	for {
		if node.Direct(tid) {
			for _, c := range h.Network().ConnsToPeer(tid) {
				if !isRelayed(c) {
					direct = c.RemoteMultiaddr().String()
					break wait
				}
			}
		}
		if _, fails, _ := node.Punches(tid); fails >= 3 {
			break
		}
		select {
		case <-deadline:
			break wait
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	succ, fails, errs := node.Punches(tid)
	res["impl"] = *impl
	res["direct"] = direct != ""
	// The node's own view (p2p: ConnStatus) against the connections' addresses.
	res["node_says_direct"] = node.Direct(tid)
	res["direct_addr"] = direct
	res["punch_success"] = succ
	res["punch_failures"] = fails
	res["punch_errors"] = errs
	if direct != "" {
		res["direct_ms"] = ms(time.Since(t0))
	}
	if *dataWhen == "direct" && direct != "" {
		if err := send(); err != nil {
			res["send_error"] = err.Error()
		}
	}
	emit(res)
	return nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
