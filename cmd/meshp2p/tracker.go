package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/node"
	"github.com/neuron-tai/meshp2p/p2p"
	"github.com/neuron-tai/meshp2p/session"
	"github.com/neuron-tai/meshp2p/tracker"
)

const trackerUsage = `Usage: meshp2p tracker [--listen ADDRS] [--data-dir DIR] [--network NAME] [flags]

Runs a tracker: a publicly reachable swarm peer that is DHT server,
gossipsub hub, circuit relay (limits raised for activation traffic, swarm
members only), AutoNAT server and route oracle. Origins started with
--tracker <its multiaddr>/p2p/<id> ask it for signed route tickets; hops
started with --require-ticket --trust-tracker <id> admit only sessions
carrying one. Its identity persists in <data-dir>/identity.key
('meshp2p key show' prints the peer id to pin); once ready it prints its
peer id and addresses and writes them to <data-dir>/node.json.
`

func runTracker(ctx context.Context, stdout, stderr io.Writer, args []string) error {
	fs := cmdFlagSet("tracker", stdout, trackerUsage)
	var nf netFlags
	nf.register(fs, node.PresetRelay)
	ttl := fs.Duration("ticket-ttl", tracker.DefaultTicketTTL, "how long an issued route ticket stays valid")
	pingEvery := fs.Duration("ping-interval", tracker.DefaultPingInterval, "how often the tracker measures RTT to every node")
	auditRate := fs.Float64("audit-rate", 0, "share of tickets that assign their client an audit of one hop (committed to in the ticket, opened only to the client; 0: clients draw their own; docs/trust.md)")
	auditModels := fs.String("audit-model", "", "comma-separated whole GGUF models this tracker replays submitted fraud proofs with; a verified proof makes it refuse tickets through the convicted peer (empty: it accepts no proofs)")
	verbose := fs.Bool("v", false, "debug logging")
	var lf logFormat
	lf.register(fs)
	var mf metricsFlag
	mf.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *auditRate < 0 || *auditRate > 1 {
		return fmt.Errorf("%w: --audit-rate %g: want 0..1", errUsage, *auditRate)
	}
	pc, err := nf.config(node.PresetRelay)
	if err != nil {
		return err
	}
	unlock, err := lockDataDir(pc.DataDir)
	if err != nil {
		return err
	}
	defer unlock()
	log, err := lf.logger(stderr, *verbose)
	if err != nil {
		return err
	}
	pc.Logger = log
	m, err := mf.metrics()
	if err != nil {
		return err
	}
	if m != nil {
		pc.Metrics = m.Registry
	}
	tcfg := tracker.Config{P2P: pc, TicketTTL: *ttl, PingInterval: *pingEvery, Logger: log, AuditRate: *auditRate}
	if models := splitList(*auditModels); len(models) > 0 {
		eng := &node.AuditEngines{Models: models, DataDir: pc.DataDir, Threads: 1, Logger: log}
		defer eng.Close()
		tcfg.Judge = judgeWith(eng)
	}
	tr, err := tracker.Start(ctx, tcfg)
	if err != nil {
		return err
	}
	defer tr.Close()
	stopMetrics, err := serveTrackerMetrics(stdout, log, &mf, tr)
	if err != nil {
		return err
	}
	defer stopMetrics()
	info := tr.Info()
	fmt.Fprintf(stdout, "peer id:  %s\nrole:     tracker (route oracle, relay, DHT server) network %s\n", info.PeerID, info.Network)
	for _, a := range info.Addrs {
		fmt.Fprintf(stdout, "address:  %s\n", a)
	}
	p, err := tr.WriteInfo()
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "ready; node info in %s\n", p)
	<-ctx.Done()
	log.Info("shutting down tracker")
	stopMetrics()
	return tr.Close()
}

// trackerFlags are the tracker-related flags of start and generate.
type trackerFlags struct {
	trackers       listFlag // --tracker MULTIADDR/p2p/ID (repeatable, comma lists)
	trust          listFlag // --trust-tracker PEERID (repeatable, comma lists)
	requireTracker bool
	requireTicket  bool
}

// listFlag collects repeated and comma-separated values.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }
func (l *listFlag) Set(s string) error {
	*l = append(*l, splitList(s)...)
	return nil
}

func (f *trackerFlags) registerOrigin(fs *flag.FlagSet) {
	fs.Var(&f.trackers, "tracker", "tracker multiaddr ending in /p2p/<id> (repeatable or comma-separated); the id is pinned: only tickets it signs are accepted")
	fs.BoolVar(&f.requireTracker, "require-tracker", false, "fail when no tracker returns a valid ticket instead of planning locally")
}

func (f *trackerFlags) registerHop(fs *flag.FlagSet) {
	fs.Var(&f.trackers, "tracker", "tracker multiaddr ending in /p2p/<id> (repeatable or comma-separated): bootstrap peer and relay, trusted with --require-ticket")
	fs.BoolVar(&f.requireTicket, "require-ticket", false, "admit only sessions carrying a valid route ticket from a trusted tracker")
	fs.Var(&f.trust, "trust-tracker", "peer id of a tracker whose tickets are accepted (repeatable or comma-separated; default: the --tracker ids)")
}

// addrInfos parses --tracker.
func (f *trackerFlags) addrInfos() ([]peer.AddrInfo, error) {
	return parseAddrInfos(strings.Join(f.trackers, ","))
}

// trusted is --trust-tracker, or the --tracker ids when none is given.
func (f *trackerFlags) trusted() ([]peer.ID, error) {
	var out []peer.ID
	for _, s := range f.trust {
		id, err := peer.Decode(s)
		if err != nil {
			return nil, fmt.Errorf("%w: --trust-tracker %q: %v", errUsage, s, err)
		}
		out = append(out, id)
	}
	if len(out) == 0 {
		ais, err := f.addrInfos()
		if err != nil {
			return nil, err
		}
		for _, ai := range ais {
			out = append(out, ai.ID)
		}
	}
	return out, nil
}

// mergePeers appends trackers to a bootstrap/relay list, skipping duplicates.
func mergePeers(list []peer.AddrInfo, extra []peer.AddrInfo) []peer.AddrInfo {
	for _, e := range extra {
		dup := false
		for _, l := range list {
			dup = dup || l.ID == e.ID
		}
		if !dup {
			list = append(list, e)
		}
	}
	return list
}

// applyHop adds the trackers as bootstrap peers and relays and, with
// --require-ticket, installs the ticket admission hook.
func (f *trackerFlags) applyHop(pc *p2p.Config, hop *session.HopConfig) error {
	trk, err := f.addrInfos()
	if err != nil {
		return err
	}
	pc.Bootstrap = mergePeers(pc.Bootstrap, trk)
	pc.StaticRelays = mergePeers(pc.StaticRelays, trk)
	if !f.requireTicket {
		if len(f.trust) > 0 {
			return fmt.Errorf("%w: --trust-tracker needs --require-ticket", errUsage)
		}
		return nil
	}
	trusted, err := f.trusted()
	if err != nil {
		return err
	}
	if len(trusted) == 0 {
		return fmt.Errorf("%w: --require-ticket needs --trust-tracker PEERID or --tracker ADDR", errUsage)
	}
	hop.Admit = session.TicketAdmission(session.TicketPolicy{Network: pc.Network, Trusted: trusted})
	return nil
}

// applyOrigin adds the trackers as bootstrap peers and returns them.
func (f *trackerFlags) applyOrigin(pc *p2p.Config) ([]peer.AddrInfo, error) {
	trk, err := f.addrInfos()
	if err != nil {
		return nil, err
	}
	if f.requireTracker && len(trk) == 0 {
		return nil, fmt.Errorf("%w: --require-tracker needs --tracker ADDR", errUsage)
	}
	pc.Bootstrap = mergePeers(pc.Bootstrap, trk)
	pc.StaticRelays = mergePeers(pc.StaticRelays, trk)
	return trk, nil
}

// parsePeerIDs decodes the peer ids of flag name (nil if none).
func parsePeerIDs(name string, ids []string) (map[peer.ID]bool, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	out := map[peer.ID]bool{}
	for _, s := range ids {
		id, err := peer.Decode(s)
		if err != nil {
			return nil, fmt.Errorf("%w: %s %q: not a peer id: %v", errUsage, name, s, err)
		}
		out[id] = true
	}
	return out, nil
}
