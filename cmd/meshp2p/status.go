package main

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/neuron-tai/meshp2p/client"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/neuron-tai/meshp2p/node"
	"github.com/neuron-tai/meshp2p/status"
)

const statusUsage = `Usage: meshp2p status --join TOKEN|--bootstrap ADDR [--model NAME_OR_FINGERPRINT] [--json] [--watch 2s] [flags]

Joins the swarm as a client and prints what it sees: every model on offer,
per-layer coverage (replicas per layer, gaps), which peers serve which
layers (capacity, load, measured speed, RTT, how this machine reaches them:
direct or relayed), and whether the layers are covered end to end (else
which range is missing). A peer that is not connected gets one dial and
ping (2 s); one that does not answer is shown dead and not counted.
--json prints the document GET /api/status serves (docs/observability.md).
`

func runStatus(ctx context.Context, stdout, stderr io.Writer, args []string) error {
	fs := cmdFlagSet("status", stdout, statusUsage)
	var nf netFlags
	nf.register(fs, node.PresetClient)
	model := fs.String("model", "", "also look this model up in the DHT (name or fingerprint)")
	wait := fs.Duration("wait", defaultStatusWait, "the most to wait for the swarm's view (it is pulled from the first peer reached, usually in well under a second)")
	asJSON := fs.Bool("json", false, "print the status document as JSON (the same document GET /api/status serves)")
	watch := fs.Duration("watch", 0, "refresh every this long until interrupted (e.g. 2s; 0: print once)")
	verbose := fs.Bool("v", false, "debug logging")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	pc, err := nf.config(node.PresetClient)
	if err != nil {
		return err
	}
	if len(pc.Bootstrap) == 0 {
		return fmt.Errorf("%w: --join or --bootstrap is required (there are no public defaults)", errUsage)
	}
	d, err := os.MkdirTemp("", "meshp2p-status-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(d)
	pc.DataDir = d // an ephemeral identity
	log := newLoggerAt(stderr, *verbose, slog.LevelWarn)
	pc.Logger = log
	n, err := node.Start(ctx, node.Config{P2P: pc, Logger: log})
	if err != nil {
		return err
	}
	defer n.Close()
	if *model != "" {
		waitRoutable(ctx, n, *model, *wait)
	} else if err := settleView(ctx, n, *wait); err != nil {
		return err
	}
	if err := n.P2P().NoPeersError(); err != nil {
		return err
	}
	col := n.StatusCollector("client")
	show := func() error {
		doc := col.Document(ctx)
		if *asJSON {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(doc)
		}
		return status.WriteText(stdout, doc)
	}
	if *watch <= 0 {
		return show()
	}
	t := time.NewTicker(*watch)
	defer t.Stop()
	for {
		if !*asJSON {
			fmt.Fprint(stdout, "\x1b[H\x1b[2J") // home, clear screen
			fmt.Fprintf(stdout, "meshp2p status — %s (every %s; Ctrl-C to stop)\n\n", time.Now().Format("15:04:05"), *watch)
		}
		if err := show(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			go n.P2P().Discovery().Sync(ctx)
		}
	}
}

// settleView waits until the node is connected and its advert table has
// stopped growing for statusQuiet (the adverts pulled on connect have
// arrived), at most wait. It fails early when no bootstrap peer can be
// reached for a reason waiting will not fix.
func settleView(ctx context.Context, n *node.Node, wait time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	last, since := -1, time.Now()
	// The quiet period counts only once the first pull has answered: on a
	// busy machine it can take longer than statusQuiet, and the view
	// printed would be empty.
	synced := make(chan struct{})
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		p := n.P2P()
		if p.Unreachable() {
			return p.NoPeersError()
		}
		if p.PeerCount() == 0 {
			continue
		}
		if c := len(p.Discovery().Adverts()); c != last {
			if last == -1 {
				go func() { defer close(synced); _ = p.Discovery().Sync(ctx) }()
			} else {
				go p.Discovery().Sync(ctx)
			}
			last, since = c, time.Now()
			continue
		}
		select {
		case <-synced:
		default:
			since = time.Now()
			continue
		}
		if time.Since(since) >= statusQuiet {
			return nil
		}
	}
}

// statusQuiet is how long the advert table must stay unchanged before
// status prints it.
const statusQuiet = 500 * time.Millisecond

// defaultStatusWait is status's --wait: the swarm's view is pulled from the
// first peer reached, usually in well under a second.
const defaultStatusWait = 5 * time.Second

// waitRoutable waits up to wait for model to be routable from client peer
// n (client.Resolve); the status document says what is missing when it is
// not.
func waitRoutable(ctx context.Context, n *node.Node, model string, wait time.Duration) {
	c, err := client.New(client.Config{Swarm: n.P2P(), Table: n.Table()})
	if err != nil {
		return
	}
	defer c.Close()
	_, _ = c.Resolve(ctx, model, wait)
}
