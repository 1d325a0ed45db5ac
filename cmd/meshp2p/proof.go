package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"google.golang.org/protobuf/proto"

	"github.com/neuron-tai/meshp2p/node"
	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/session"
	"github.com/neuron-tai/meshp2p/tracker"
)

// maxProofBytes bounds a proof file (its inputs are at most one session's
// recorded activations).
const maxProofBytes = 512 << 20

// auditFlags are an origin's audit flags (generate, serve, start).
type auditFlags struct {
	rate     float64
	proofDir string
	models   string // --audit-model
}

func (f *auditFlags) register(fs *flag.FlagSet) {
	fs.Float64Var(&f.rate, "audit-rate", session.DefaultAuditRate, "share of generations whose hops are spot-checked: one hop's layers replayed on the inputs it signed it received (0: off, and hops keep no transcripts; docs/trust.md)")
	fs.StringVar(&f.proofDir, "proof-dir", "", "where fraud proofs of convicted hops are written (default: <data dir>/proofs)")
	fs.StringVar(&f.models, "audit-model", "", "comma-separated whole GGUF models this origin replays audited hops with (besides a --model FILE); without one for the route's model, audits are skipped")
}

func (f *auditFlags) check() error {
	if f.rate < 0 || f.rate > 1 {
		return fmt.Errorf("%w: --audit-rate %g: want 0..1", errUsage, f.rate)
	}
	return nil
}

// apply sets cfg's audits: the rate, the model files auditors may replay
// with, where proofs go (dataDir/proofs unless --proof-dir) and the
// trackers they are submitted to. report, if set, also sees every report.
// Bind the started node with the function it returns (proofs are
// submitted through it).
func (f *auditFlags) apply(cfg *node.Config, dataDir string, models []string, trackers []peer.AddrInfo, log *slog.Logger, report func(session.AuditReport)) (bind func(*node.Node)) {
	cfg.AuditRate, cfg.AuditModels = f.rate, append(models, splitList(f.models)...)
	dir := f.proofDir
	if dir == "" {
		dir = filepath.Join(dataDir, "proofs")
	}
	var bound atomic.Pointer[node.Node]
	cfg.OnAudit = func(r session.AuditReport) {
		if r.Proof != nil {
			if path, err := writeProof(dir, r); err != nil {
				log.Warn("could not save the fraud proof", "peer", r.Peer, "err", err)
			} else {
				log.Warn("fraud proof saved: check it with `meshp2p proof verify`", "peer", r.Peer, "file", path)
			}
			if n := bound.Load(); n != nil && len(trackers) > 0 {
				submitProof(n, trackers, r.Proof, log)
			}
		}
		if report != nil {
			report(r)
		}
	}
	return bound.Store
}

// writeProof writes r's proof as DIR/<time>-<peer>.proof.
func writeProof(dir string, r session.AuditReport) (string, error) {
	b, err := proto.Marshal(r.Proof)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	path := filepath.Join(dir, fmt.Sprintf("%s-%s.proof", time.Now().UTC().Format("20060102T150405Z"), r.Peer.String()))
	return path, os.WriteFile(path, b, 0o644)
}

const proofUsage = `usage: meshp2p proof verify FILE --model MODEL.gguf

Checks a fraud proof offline: the origin's signature on the session, the
hop's signatures on its statements, that the recorded inputs are what the
hop signed it received, then replays the hop's layers from MODEL (a whole
model with the proof's fingerprint) and compares: exactly when this
machine's kernel class is the one the hop named, else by the cross-class
tolerance (docs/trust.md). Exit status 0: the proof convicts the hop;
1: it does not (the reason is printed).
`

func runProof(ctx context.Context, stdout, stderr io.Writer, args []string) error {
	if len(args) == 0 || args[0] != "verify" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
			fmt.Fprint(stdout, proofUsage)
			return nil
		}
		return fmt.Errorf("%w: proof needs the subcommand verify", errUsage)
	}
	fs := cmdFlagSet("proof verify", stdout, proofUsage)
	model := fs.String("model", "", "the whole GGUF model the proof's session ran (required)")
	dataDir := fs.String("data-dir", "", "where the model's window is split to (default: a temporary directory)")
	asJSON := fs.Bool("json", false, "print the verdict as JSON")
	pos, err := parseInterspersed(fs, args[1:], 1, "one proof file")
	if err != nil {
		return err
	}
	if *model == "" {
		return fmt.Errorf("%w: --model is required", errUsage)
	}
	p, err := readProof(pos[0])
	if err != nil {
		return err
	}
	dir := *dataDir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "meshp2p-proof-"); err != nil {
			return err
		}
		defer os.RemoveAll(dir)
	}
	eng := &node.AuditEngines{Models: []string{*model}, DataDir: dir, Threads: node.DefaultEngine().Threads, Logger: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	defer eng.Close()
	v, err := session.Judge(ctx, p, eng)
	if err != nil {
		return fmt.Errorf("proof %s does not verify: %w", pos[0], err)
	}
	h := p.GetOpen().GetRoute().GetHops()[p.GetHopIndex()]
	if *asJSON {
		return writeIndented(stdout, map[string]any{"convicted": v.Convicted, "reason": v.Reason, "window": v.Window, "windows": v.Windows,
			"frames": v.Frames, "exact": v.Exact, "kernel_class": v.Class, "hop": p.GetHopIndex(), "layers": [2]uint32{h.GetStart(), h.GetEnd()},
			"replay_ms": v.Replay.Milliseconds()})
	}
	fmt.Fprintf(stdout, "proof:    %s\nhop:      %d, layers %d-%d\nreplayed: %d windows, %d frames in %s on kernel class %s (exact: %v)\n",
		pos[0], p.GetHopIndex(), h.GetStart(), h.GetEnd(), v.Windows, v.Frames, v.Replay.Round(time.Millisecond), v.Class, v.Exact)
	if !v.Convicted {
		return fmt.Errorf("%w: the replay agrees with what the hop signed: the proof convicts nobody", session.ErrProof)
	}
	fmt.Fprintf(stdout, "verdict:  convicted: %s\n", v.Reason)
	return nil
}

// readProof reads a proof file (bounded).
func readProof(path string) (*meshp2pb.Proof, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxProofBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxProofBytes {
		return nil, fmt.Errorf("%s: over %d bytes: not a proof", path, maxProofBytes)
	}
	p := &meshp2pb.Proof{}
	if err := proto.Unmarshal(b, p); err != nil {
		return nil, fmt.Errorf("%s: not a proof: %w", path, err)
	}
	if p.GetOpen() == nil {
		return nil, errors.New(path + ": not a proof (no session)")
	}
	return p, nil
}

// judgeWith is a tracker's proof check: session.Judge over eng.
func judgeWith(eng session.AuditEngines) tracker.Judge {
	return func(ctx context.Context, p *meshp2pb.Proof) (bool, peer.ID, string, error) {
		v, err := session.Judge(ctx, p, eng)
		if err != nil || !v.Convicted {
			return false, "", v.Reason, err
		}
		h := p.GetOpen().GetRoute().GetHops()[p.GetHopIndex()]
		return true, peer.ID(h.GetPeerId()), v.Reason, nil
	}
}

// submitProof sends a proof to every tracker (each replays it before it
// believes it) and logs their verdicts.
func submitProof(n *node.Node, trackers []peer.AddrInfo, p *meshp2pb.Proof, log *slog.Logger) {
	for _, t := range trackers {
		ctx, cancel := context.WithTimeout(context.Background(), tracker.ProofTimeout)
		v, err := n.SubmitProof(ctx, t, p)
		cancel()
		switch {
		case err != nil:
			log.Warn("could not submit the fraud proof to the tracker", "tracker", t.ID, "err", err)
		case v.GetError() != nil:
			log.Warn("the tracker did not check the fraud proof", "tracker", t.ID, "err", frame.FromProto(v.GetError()))
		default:
			log.Info("fraud proof submitted", "tracker", t.ID, "convicted", v.GetConvicted(), "reason", v.GetReason())
		}
	}
}
