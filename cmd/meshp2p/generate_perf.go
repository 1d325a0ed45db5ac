package main

import (
	"flag"
	"fmt"
	"io"

	"github.com/neuron-tai/meshp2p/session"
)

// perfFlags are generate's flags for measuring (issue 16): equal thread
// counts for --local A/B runs and the prefill chunk size.
type perfFlags struct {
	threads *int
	chunk   *int
}

func (p *perfFlags) register(fs *flag.FlagSet) {
	p.threads = fs.Int("threads", 0, "with --local: compute threads (0: auto, like start's default: the CPUs the machine's meshp2p processes are not computing on); give the nodes' --threads for a fair comparison")
	p.chunk = fs.Int("prefill-chunk", session.DefaultChunk, "prompt rows per prefill frame (with --local: per llama_decode)")
}

func (p *perfFlags) check() error {
	switch {
	case *p.threads < 0:
		return fmt.Errorf("%w: --threads %d is negative", errUsage, *p.threads)
	case *p.chunk < 1 || *p.chunk > 8192:
		return fmt.Errorf("%w: --prefill-chunk %d outside [1, 8192]", errUsage, *p.chunk)
	}
	return nil
}

// networkMs is the time per token no hop accounts for: the per-token time
// minus every hop's busy time (read, convert, compute, convert, write,
// up to the origin). It is the links' latency plus what the kernel and
// the stream muxers add.
func networkMs(msPerToken float64, hops []session.HopStat) float64 {
	busy := 0.0
	for _, h := range hops {
		busy += h.BusyUs()
	}
	return msPerToken - busy/1000
}

// printHopBreakdown writes each hop's mean time per token, in ms.
func printHopBreakdown(w io.Writer, hops []session.HopStat, network float64) {
	if len(hops) == 0 || hops[0].StepsTimed == 0 {
		return
	}
	fmt.Fprintln(w, "per token (ms):  wait   read  to-f32  compute  to-wire  write  up")
	for i, h := range hops {
		fmt.Fprintf(w, "  hop %d %5d-%-3d %6.2f %6.3f %6.3f %8.2f %7.3f %6.3f %6.3f\n", i, h.Start, h.End,
			h.WaitUs/1000, h.ReadUs/1000, h.DecodeUs/1000, h.MeanUs/1000, h.EncodeUs/1000, h.WriteUs/1000, h.UpUs/1000)
	}
	fmt.Fprintf(w, "  network (ms/token not spent on a hop): %.2f\n", network)
}
