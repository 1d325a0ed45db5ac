package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"text/tabwriter"
	"time"

	"github.com/neuron-tai/meshp2p/node"
	"github.com/neuron-tai/meshp2p/node/localnodes"
)

const psUsage = `Usage: meshp2p ps [--json]

Lists the meshp2p nodes (start) and gateways (serve) running on
this machine as this user: pid, role, data dir, model and layers, peers
connected, sessions open on the node's hop, and uptime. Each process
keeps a record in the per-user registry (the temporary directory's
meshp2p-<uid>/nodes), refreshed every 5 s and removed when it stops; a
killed process's record is skipped and removed.
`

// localRefresh is how often a running process rewrites its record.
const localRefresh = 5 * time.Second

func runPS(_ context.Context, stdout, _ io.Writer, args []string) error {
	fs := cmdFlagSet("ps", stdout, psUsage)
	asJSON := fs.Bool("json", false, "print the records as a JSON array")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	es, err := localnodes.List(localnodes.Dir())
	if err != nil {
		return err
	}
	if *asJSON {
		if es == nil {
			es = []localnodes.Entry{}
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(es)
	}
	if len(es) == 0 {
		fmt.Fprintln(stdout, "no meshp2p node or gateway runs here (as this user)")
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PID\tROLE\tDATA DIR\tMODEL\tLAYERS\tPEERS\tSESSIONS\tUP\tPEER ID")
	for _, e := range es {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", e.PID, e.Role, dash(e.DataDir), dash(e.Model), dash(e.Layers), e.Peers, e.Sessions,
			time.Since(e.Started).Round(time.Second), shortID(e.PeerID))
	}
	return tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// shortID is a peer id's last 8 characters after an ellipsis.
func shortID(id string) string {
	if len(id) <= 12 {
		return dash(id)
	}
	return "…" + id[len(id)-8:]
}

// registerLocal puts this process in the machine's registry (meshp2p ps)
// and refreshes its record until the returned stop is called (which
// removes it). A registry that cannot be written only costs ps its line.
func registerLocal(log *slog.Logger, role, dataDir string, n *node.Node) (stop func()) {
	fill := func(e *localnodes.Entry) {
		in := n.Info()
		e.PeerID, e.Network, e.Model, e.Layers = in.PeerID, in.Network, in.Model, ""
		if in.End > in.Start {
			e.Layers = fmt.Sprintf("%d-%d", in.Start, in.End)
		}
		e.Peers = n.P2P().PeerCount()
		if h := n.Hop(); h != nil {
			e.Sessions = h.Sessions()
		}
	}
	e := localnodes.Entry{Role: role, DataDir: dataDir}
	fill(&e)
	reg, err := localnodes.Register(localnodes.Dir(), e)
	if err != nil {
		log.Debug("not listed by meshp2p ps", "err", err)
		return func() {}
	}
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(localRefresh)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if err := reg.Update(fill); err != nil {
					log.Debug("refreshing the meshp2p ps record", "err", err)
				}
			}
		}
	}()
	return func() {
		close(done)
		<-stopped
		reg.Remove()
	}
}
