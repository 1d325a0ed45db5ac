package perfbench

import (
	"context"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	mocknet "github.com/libp2p/go-libp2p/p2p/net/mock"

	"github.com/neuron-tai/meshp2p/p2p"
	"github.com/neuron-tai/meshp2p/route"
	"github.com/neuron-tai/meshp2p/session"
)

// mockHost adapts a mocknet host to session.Host: every path is direct and
// never changes.
type mockHost struct{ host.Host }

func (h mockHost) ProtocolID(name, version string) protocol.ID {
	return protocol.ID("/meshp2p/perfbench/" + name + "/" + version)
}
func (h mockHost) Protect(p peer.ID, tag string)        { h.ConnManager().Protect(p, tag) }
func (h mockHost) Unprotect(p peer.ID, tag string) bool { return h.ConnManager().Unprotect(p, tag) }
func (h mockHost) PathTo(peer.ID) p2p.Path              { return p2p.PathDirect }
func (h mockHost) SubscribeConn(ctx context.Context) <-chan p2p.ConnEvent {
	ch := make(chan p2p.ConnEvent)
	go func() {
		<-ctx.Done()
		close(ch)
	}()
	return ch
}

// fixedPlanner always plans the same hops.
type fixedPlanner struct{ hops []route.Hop }

func (p fixedPlanner) Plan(_ context.Context, req route.Request) (*route.Route, error) {
	return &route.Route{Fingerprint: req.Fingerprint, NLayer: req.NLayer, Epoch: req.Epoch, Hops: p.hops}, nil
}

// Ring is a route of hops and an origin on a simulated network whose
// links all have the same one-way delay.
type Ring struct {
	Origin *session.Origin
	Hops   []*session.HopService
	net    mocknet.Mocknet
}

// NewRing serves engines (in route order, contiguous layer ranges) as hops
// and links every pair of peers, the origin included, with one-way delay
// h. Close it when done.
func NewRing(fingerprint string, engines []session.Engine, h time.Duration) (*Ring, error) {
	return NewRingWith(fingerprint, engines, h, nil)
}

// NewRingWith is NewRing with a change to every hop's configuration.
func NewRingWith(fingerprint string, engines []session.Engine, h time.Duration, tweak func(*session.HopConfig)) (*Ring, error) {
	mn := mocknet.New()
	mn.SetLinkDefaults(mocknet.LinkOptions{Latency: h})
	r := &Ring{net: mn}
	var hops []route.Hop
	for _, e := range engines {
		hh, err := mn.GenPeer()
		if err != nil {
			_ = mn.Close()
			return nil, err
		}
		mh := mockHost{hh}
		hc := session.HopConfig{Fingerprint: fingerprint, Idle: time.Minute, OpenTimeout: 30 * time.Second,
			MaxSessionKV: -1, MaxSessionsPerPeer: -1, MaxKVPerPeer: -1, Logger: quiet}
		if tweak != nil {
			tweak(&hc)
		}
		svc := session.NewHopService(mh, e, hc)
		r.Hops = append(r.Hops, svc)
		info := e.Info()
		hops = append(hops, route.Hop{Peer: hh.ID(), Start: info.Start, End: info.End, Addrs: hh.Addrs(), Reach: p2p.PathDirect})
	}
	oh, err := mn.GenPeer()
	if err != nil {
		r.Close()
		return nil, err
	}
	if err := mn.LinkAll(); err != nil {
		r.Close()
		return nil, err
	}
	if err := mn.ConnectAllButSelf(); err != nil {
		r.Close()
		return nil, err
	}
	mo := mockHost{oh}
	r.Origin = &session.Origin{Dialer: mo, Key: oh.Peerstore().PrivKey(oh.ID()), Planner: fixedPlanner{hops}, Protocol: mo.ProtocolID(session.ProtoSession, session.ProtoVersion),
		MaxReroutes: -1, RouteWait: -1, CapacityWait: -1, TokenTimeout: 2 * time.Minute, Logger: quiet}
	return r, nil
}

// Close ends the hops and the simulated network.
func (r *Ring) Close() {
	for _, h := range r.Hops {
		h.Close()
	}
	_ = r.net.Close()
}

// PerToken is a generation's decode time per token after the first.
func PerToken(res *session.Result) time.Duration {
	if len(res.Tokens) < 2 {
		return 0
	}
	return (res.Total - res.TTFT) / time.Duration(len(res.Tokens)-1)
}

// Floor is Σ compute + k·h per token from a generation's per-hop compute
// means and the ring's k links of one-way delay h.
func Floor(res *session.Result, h time.Duration) time.Duration {
	var us float64
	for _, s := range res.HopStats {
		us += s.MeanUs
	}
	return time.Duration(us*float64(time.Microsecond)) + time.Duration(len(res.HopStats))*h
}
