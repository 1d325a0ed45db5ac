package status

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// WriteText prints the document for a terminal (`meshp2p status`).
func WriteText(w io.Writer, d *Document) error {
	var b strings.Builder
	if len(d.Models) == 0 {
		fmt.Fprintf(&b, "connected to %d peers; none serves a model\n", countLive(d.Peers))
	}
	for _, m := range d.Models {
		writeModel(&b, m)
	}
	writeSelf(&b, d.Self, d.Counters)
	writeDemand(&b, d.Demand)
	writeRoutes(&b, d.Routes)
	_, err := io.WriteString(w, b.String())
	return err
}

// writeModel prints a model: its state, coverage, kernel classes when
// they differ, and a line per shard.
func writeModel(b *strings.Builder, m Model) {
	state := "routable"
	if !m.Routable {
		state = "NOT routable: " + m.Missing
	}
	fp := m.Fingerprint
	if len(fp) > 16 {
		fp = fp[:16]
	}
	fmt.Fprintf(b, "%s (%s, %d layers) %s… — %s\n", m.Name, m.Arch, m.NLayer, fp, state)
	fmt.Fprintf(b, "  coverage  %s\n", bar(m.Replicas))
	classes, backends := map[string]bool{}, map[string]bool{}
	for _, s := range m.Shards {
		if s.KernelClass != "" {
			classes[s.KernelClass] = true
		}
		if s.Backend != "" {
			backends[printable(s.Backend)] = true
		}
	}
	if len(classes) > 1 {
		fmt.Fprintf(b, "  kernel classes: %d (hops of different classes agree only to rounding; see kernel_class in --json)", len(classes))
		if len(backends) > 0 {
			fmt.Fprintf(b, "; backends: %s", strings.Join(slices.Sorted(maps.Keys(backends)), ", "))
		}
		b.WriteString("\n")
	}
	for _, s := range m.Shards {
		writeShard(b, s)
	}
}

// writeShard prints a shard's line: planned, or its room, speed and
// liveness.
func writeShard(b *strings.Builder, s Shard) {
	if s.Planned {
		fmt.Fprintf(b, "  layers %3d-%-3d %s  %s%s  planned: loading (placement)\n", s.Start, s.End, s.Peer, s.Path, backendText(s))
		return
	}
	live := ""
	if !s.Live {
		live = "  DEAD (no answer to dial/ping)"
	}
	rtt := ""
	if s.RTTMs > 0 {
		rtt = fmt.Sprintf(", rtt %.1f ms", s.RTTMs)
	}
	tps := ""
	if s.TokensPerSec > 0 {
		tps = fmt.Sprintf(", %.1f tok/s", s.TokensPerSec)
	}
	fmt.Fprintf(b, "  layers %3d-%-3d %s  %s%s  sessions %d/%d free, %d KV free, %.3f ms/layer%s%s%s\n",
		s.Start, s.End, s.Peer, s.Path, backendText(s), s.FreeSessions, s.MaxSessions, s.FreeKV, s.MsPerLayer, tps, rtt, live)
}

// writeSelf prints this node's counters, speculation, audits and
// placement.
func writeSelf(b *strings.Builder, self Self, c Counters) {
	fmt.Fprintf(b, "this node %s (%s): %d sessions active, %d admitted, %d refused, %d tokens served, %d re-routes\n",
		short(self.PeerID), self.Role, c.SessionsActive, c.SessionsAdmitted, c.SessionsRefused, c.TokensServed, c.Reroutes)
	if c.SpecWindows > 0 {
		rate := 0.0
		if c.SpecProposed > 0 {
			rate = 100 * float64(c.SpecAccepted) / float64(c.SpecProposed)
		}
		fmt.Fprintf(b, "  speculation: %d windows, %d of %d proposed tokens accepted (%.0f%%)\n", c.SpecWindows, c.SpecAccepted, c.SpecProposed, rate)
	}
	if n := c.AuditsPassed + c.AuditsFailed + c.AuditsInconclusive; n > 0 {
		fmt.Fprintf(b, "  audits: %d run, %d passed, %d failed (hop convicted), %d inconclusive\n", n, c.AuditsPassed, c.AuditsFailed, c.AuditsInconclusive)
	}
	if p := self.Placement; p != nil {
		writePlacement(b, p)
	}
}

// writePlacement prints this node's automatic placement.
func writePlacement(b *strings.Builder, p *Placement) {
	b.WriteString("  placement:")
	if p.BudgetBytes > 0 {
		fmt.Fprintf(b, " automatic, budget %d MiB,", p.BudgetBytes>>20)
	}
	fmt.Fprintf(b, " serving layers %d-%d, %d move(s)", p.Start, p.End, p.Moves)
	if p.Loading != nil {
		fmt.Fprintf(b, ", loading %d-%d", p.Loading.Start, p.Loading.End)
	}
	if p.Draining != nil {
		fmt.Fprintf(b, ", draining %d-%d", p.Draining.Start, p.Draining.End)
	}
	if p.LastReason != "" {
		fmt.Fprintf(b, "; last: %s", p.LastReason)
	}
	if p.HealPlan != "" {
		fmt.Fprintf(b, "; heal plan: %s", p.HealPlan)
	}
	if p.ModelReason != "" {
		fmt.Fprintf(b, "; models: %s", p.ModelReason)
	}
	b.WriteString("\n")
}

// writeRoutes prints the five most recent routes.
func writeRoutes(b *strings.Builder, routes []Route) {
	for i, r := range routes {
		if i == 5 {
			break
		}
		var hops []string
		for _, h := range r.Hops {
			hops = append(hops, fmt.Sprintf("%s[%d-%d]", short(h.Peer), h.Start, h.End))
		}
		re := ""
		if r.Reroute {
			re = " (re-route)"
		}
		fmt.Fprintf(b, "  route %s epoch %d%s: %s\n", r.Time.Format("15:04:05"), r.Epoch, re, strings.Join(hops, " → "))
	}
}

// backendText is the shard's backend for its line: "  cpu",
// "  vulkan (llvmpipe (LLVM 15.0.6, 256 bits))", or "" when its node did
// not say (older nodes).
func backendText(s Shard) string {
	switch {
	case s.Backend == "":
		return ""
	case s.Device == "":
		return "  " + printable(s.Backend)
	default:
		return "  " + printable(s.Backend) + " (" + printable(s.Device) + ")"
	}
}

// printable replaces control characters in advertised text (a peer's
// device description) so that it cannot drive the terminal.
func printable(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) || r == utf8.RuneError {
			return '?'
		}
		return r
	}, s)
}

// bar draws replicas per layer: '.' for a gap, else the count (9+: '+').
func bar(rep []int) string {
	var b strings.Builder
	for _, r := range rep {
		switch {
		case r == 0:
			b.WriteByte('.')
		case r > 9:
			b.WriteByte('+')
		default:
			b.WriteByte(byte('0' + r))
		}
	}
	return b.String()
}

func short(id string) string {
	if len(id) > 12 {
		return "…" + id[len(id)-8:]
	}
	return id
}

func countLive(ps []Peer) int {
	n := 0
	for _, p := range ps {
		if p.Live {
			n++
		}
	}
	return n
}

// writeDemand prints the swarm's demand per model (gossiped reports,
// decayed) and which models are warming or warmable.
func writeDemand(b *strings.Builder, ds []ModelDemand) {
	if len(ds) == 0 {
		return
	}
	b.WriteString("demand (per second, gossiped):\n")
	for _, m := range ds {
		name := printable(m.Name)
		if name == "" {
			name = short(m.Fingerprint)
		}
		offers := ""
		if m.Offers > 0 {
			offers = fmt.Sprintf(", %d peer(s) offer to load it", m.Offers)
		}
		fmt.Fprintf(b, "  %-24s %-8s %.2f requests, %.2f queued, %.2f refused, %.1f tokens%s\n",
			name, m.State, m.Requests, m.Queued, m.Refused, m.TokensPerSec, offers)
	}
}
