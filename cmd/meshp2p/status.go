package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"time"

	"github.com/neuron-tai/meshp2p/node"
	"github.com/neuron-tai/meshp2p/route"
)

const statusUsage = `Usage: meshp2p status --bootstrap ADDR [--model NAME_OR_FINGERPRINT] [--json] [flags]

Joins the swarm briefly as a client and prints what it sees: every model
on offer, which peers serve which layers (capacity, measured speed, how
this machine reaches them: direct or relayed), and whether the layers are
covered end to end (else which range is missing).

Flags:
`

type statusShard struct {
	Peer          string  `json:"peer"`
	Start         int     `json:"start"`
	End           int     `json:"end"`
	FreeSessions  uint32  `json:"free_sessions"`
	MaxSessions   uint32  `json:"max_sessions"`
	FreeKV        uint64  `json:"free_kv_tokens"`
	MsPerLayer    float32 `json:"decode_ms_per_layer"`
	Reach         string  `json:"reach"`
	HasVocabulary bool    `json:"has_vocab"`
	// Planned: announced by a node choosing or moving its window, not
	// loaded yet (no session slot; docs/placement.md).
	Planned bool `json:"planned,omitempty"`
}

type statusModel struct {
	Fingerprint string        `json:"fingerprint"`
	Name        string        `json:"name"`
	Arch        string        `json:"arch"`
	NLayer      int           `json:"n_layer"`
	Routable    bool          `json:"routable"`
	Missing     string        `json:"missing,omitempty"`
	Shards      []statusShard `json:"shards"`
	// Replicas counts the loaded windows holding each layer.
	Replicas []int `json:"replicas"`
}

func runStatus(ctx context.Context, stdout, stderr io.Writer, args []string) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, statusUsage); fs.PrintDefaults() }
	var nf netFlags
	nf.register(fs, node.PresetClient)
	model := fs.String("model", "", "also look this model up in the DHT (name or fingerprint)")
	wait := fs.Duration("wait", 5*time.Second, "the most to wait for the swarm's view (it is pulled from the first peer reached, usually in well under a second)")
	asJSON := fs.Bool("json", false, "print JSON")
	verbose := fs.Bool("v", false, "debug logging")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if nf.bootstrap == "" {
		fs.Usage()
		return fmt.Errorf("%w: --bootstrap is required (there are no public defaults)", errUsage)
	}
	pc, err := nf.config(node.PresetClient)
	if err != nil {
		return err
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
		_, _, _ = n.WaitForModel(ctx, *model, *wait)
	} else if err := settleView(ctx, n, *wait); err != nil {
		return err
	}
	if err := n.P2P().NoPeersError(); err != nil {
		return err
	}
	models := map[string]*statusModel{}
	for _, s := range n.Table().Shards("") {
		m := models[s.Fingerprint]
		if m == nil {
			m = &statusModel{Fingerprint: s.Fingerprint, Name: s.ModelName, Arch: s.Arch, NLayer: s.NLayer}
			models[s.Fingerprint] = m
		}
		m.Shards = append(m.Shards, statusShard{Peer: s.Peer.String(), Start: s.Start, End: s.End,
			FreeSessions: s.Capacity.GetFreeSessions(), MaxSessions: s.Capacity.GetMaxSessions(), FreeKV: s.Capacity.GetFreeKvTokens(),
			MsPerLayer: s.DecodeMsPerLayer, Reach: s.Reach.String(), HasVocabulary: s.HasVocab, Planned: s.Capacity.GetMaxSessions() == 0})
	}
	var out []*statusModel
	for _, m := range models {
		m.Replicas = make([]int, m.NLayer)
		for _, s := range m.Shards {
			for l := s.Start; l < s.End && !s.Planned; l++ {
				m.Replicas[l]++
			}
		}
		_, err := (&route.LocalPlanner{Table: n.Table()}).Plan(ctx, route.Request{Fingerprint: m.Fingerprint, NLayer: m.NLayer})
		m.Routable = err == nil
		if err != nil {
			m.Missing = err.Error()
		}
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	if len(out) == 0 {
		fmt.Fprintf(stdout, "connected to %d peers; none serves a model\n", n.P2P().PeerCount())
		return nil
	}
	for _, m := range out {
		state := "routable"
		if !m.Routable {
			state = "NOT routable: " + m.Missing
		}
		fmt.Fprintf(stdout, "%s (%s, %d layers) %.16s… — %s\n", m.Name, m.Arch, m.NLayer, m.Fingerprint, state)
		for _, s := range m.Shards {
			if s.Planned {
				fmt.Fprintf(stdout, "  layers %3d-%-3d %s  %s  planned: loading (placement)\n", s.Start, s.End, s.Peer, s.Reach)
				continue
			}
			fmt.Fprintf(stdout, "  layers %3d-%-3d %s  %s  sessions %d/%d free, %d KV free, %.3f ms/layer\n",
				s.Start, s.End, s.Peer, s.Reach, s.FreeSessions, s.MaxSessions, s.FreeKV, s.MsPerLayer)
		}
		fmt.Fprintf(stdout, "  replicas per layer: %v\n", m.Replicas)
	}
	return nil
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
			last, since = c, time.Now()
			go p.Discovery().Sync(ctx)
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
