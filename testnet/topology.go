package testnet

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Kind is what a node is in the topology.
type Kind string

// Node kinds.
const (
	KindPublic Kind = "public" // on the internet segment, no NAT
	KindRouter Kind = "router" // a home router (WAN on the internet, LAN bridge)
	KindHost   Kind = "host"   // a host on a home LAN, behind its router
)

// inetName is the node name of the "internet" namespace (a bridge, no IP).
const inetName = "inet"

// DefaultStateDir is where Up records each topology (prefix.json) so that
// `meshp2p testnet status|down|exec` in another process can find it. It is
// on /run, like the namespaces themselves, so it vanishes on reboot too.
const DefaultStateDir = "/run/meshp2p-testnet"

// Node is one network namespace of a topology.
type Node struct {
	Name  string `json:"name"`
	Kind  Kind   `json:"kind"`
	NetNS string `json:"netns"` // network namespace name (`ip netns exec NetNS …`)
	// Addr is the node's own address: on the internet segment for public
	// nodes, the WAN address for routers, the LAN address for hosts.
	Addr netip.Addr `json:"addr"`
	// Public is how the node appears on the internet: Addr for public nodes
	// and routers, the router's WAN address for hosts.
	Public   netip.Addr   `json:"public"`
	LAN      netip.Prefix `json:"lan,omitzero"`     // routers and hosts
	Gateway  netip.Addr   `json:"gateway,omitzero"` // the router's LAN address
	Router   string       `json:"router,omitempty"` // hosts: their router's name
	NAT      NATKind      `json:"nat,omitempty"`
	Firewall bool         `json:"firewall,omitempty"` // router drops unsolicited WAN inbound
	Roles    []Role       `json:"roles,omitempty"`

	port string // its veth peer's name on the bridge it hangs off
}

// Options tune Up.
type Options struct {
	// LogDir receives <proc>.stdout/.stderr of processes started with Start
	// (default: a new temporary directory, removed by Close).
	LogDir string
	// StateDir is where the topology is recorded (default DefaultStateDir).
	StateDir string
	// Logger gets a debug line per command (default: discard).
	Logger *slog.Logger
}

// Topology is a built network. Close tears it down.
type Topology struct {
	Prefix string
	Spec   Spec // normalized: defaults filled in

	nodes    []*Node
	byName   map[string]*Node
	logDir   string
	ownLog   bool
	stateDir string
	log      *slog.Logger

	mu     sync.Mutex
	procs  []*Proc
	nproc  int
	closed bool
}

// Errors callers can branch on.
var (
	// ErrUnavailable: this process cannot build namespaces here (not root,
	// no CAP_SYS_ADMIN/CAP_NET_ADMIN, or ip/iptables missing).
	ErrUnavailable = errors.New("testnet: network namespaces unavailable")
	// ErrExists: a topology with this prefix is already up.
	ErrExists = errors.New("testnet: prefix already in use")
	// ErrNoNode: no node by that name.
	ErrNoNode = errors.New("testnet: no such node")
	// ErrClosed: the topology was torn down.
	ErrClosed = errors.New("testnet: topology closed")
)

// CmdError is a failed ip/iptables command with its output.
type CmdError struct {
	Args   []string
	Output string
	Err    error
}

func (e *CmdError) Error() string {
	return fmt.Sprintf("testnet: %s: %v: %s", strings.Join(e.Args, " "), e.Err, strings.TrimSpace(e.Output))
}

func (e *CmdError) Unwrap() error { return e.Err }

// Up builds the topology described by spec under prefix: one namespace
// per node plus <prefix>-inet holding the internet bridge. Every veth is
// created inside the namespaces (the root namespace is never changed). On
// error everything built so far is removed.
func Up(ctx context.Context, prefix string, spec Spec, opts Options) (*Topology, error) {
	if err := checkPrefix(prefix); err != nil {
		return nil, err
	}
	s, err := spec.normalized()
	if err != nil {
		return nil, err
	}
	if err := checkNoClash(s); err != nil {
		return nil, err
	}
	existing, err := listNetns(ctx)
	if err != nil {
		return nil, err
	}
	for _, ns := range existing {
		if strings.HasPrefix(ns, prefix+"-") {
			return nil, fmt.Errorf("%w: %s exists (run Cleanup/`meshp2p testnet down --prefix %s`)", ErrExists, ns, prefix)
		}
	}
	t := &Topology{Prefix: prefix, Spec: s, stateDir: opts.StateDir, log: opts.Logger, logDir: opts.LogDir}
	if t.stateDir == "" {
		t.stateDir = DefaultStateDir
	}
	if t.log == nil {
		t.log = slog.New(slog.DiscardHandler)
	}
	t.setNodes(plan(prefix, s))
	if err := t.build(ctx); err != nil {
		cerr := t.Close()
		return nil, errors.Join(err, cerr)
	}
	if err := t.writeState(); err != nil {
		cerr := t.Close()
		return nil, errors.Join(err, cerr)
	}
	return t, nil
}

func (t *Topology) setNodes(nodes []*Node) {
	t.nodes = nodes
	t.byName = make(map[string]*Node, len(nodes))
	for _, n := range nodes {
		t.byName[n.Name] = n
	}
}

func (t *Topology) inetNS() string { return t.Prefix + "-" + inetName }

func (t *Topology) build(ctx context.Context) error {
	inet := t.inetNS()
	// All namespaces first, so a failure part-way leaves only names Close knows.
	for _, ns := range append([]string{inet}, t.netnsNames()...) {
		if err := t.ip(ctx, "netns", "add", ns); err != nil {
			if errors.Is(err, syscall.EPERM) || strings.Contains(err.Error(), "ermission denied") || strings.Contains(err.Error(), "not permitted") {
				return fmt.Errorf("%w: %w", ErrUnavailable, err)
			}
			return err
		}
		if err := t.ip(ctx, "-n", ns, "link", "set", "lo", "up"); err != nil {
			return err
		}
	}
	steps := [][]string{
		{"-n", inet, "link", "add", "br0", "type", "bridge"},
		{"-n", inet, "link", "set", "br0", "up"},
	}
	for _, n := range t.nodes {
		switch n.Kind {
		case KindPublic:
			steps = append(steps,
				[]string{"-n", n.NetNS, "link", "add", "eth0", "type", "veth", "peer", "name", n.port, "netns", inet},
				[]string{"-n", inet, "link", "set", n.port, "master", "br0", "up"},
				[]string{"-n", n.NetNS, "addr", "add", n.Addr.String() + "/24", "dev", "eth0"},
				[]string{"-n", n.NetNS, "link", "set", "eth0", "up"},
			)
		case KindRouter:
			steps = append(steps,
				[]string{"-n", n.NetNS, "link", "add", "wan", "type", "veth", "peer", "name", n.port, "netns", inet},
				[]string{"-n", inet, "link", "set", n.port, "master", "br0", "up"},
				[]string{"-n", n.NetNS, "addr", "add", n.Addr.String() + "/24", "dev", "wan"},
				[]string{"-n", n.NetNS, "link", "set", "wan", "up"},
				[]string{"-n", n.NetNS, "link", "add", "lan", "type", "bridge"},
				[]string{"-n", n.NetNS, "addr", "add", fmt.Sprintf("%s/%d", n.Gateway, n.LAN.Bits()), "dev", "lan"},
				[]string{"-n", n.NetNS, "link", "set", "lan", "up"},
			)
		case KindHost:
			r := t.byName[n.Router]
			steps = append(steps,
				[]string{"-n", n.NetNS, "link", "add", "eth0", "type", "veth", "peer", "name", n.port, "netns", r.NetNS},
				[]string{"-n", r.NetNS, "link", "set", n.port, "master", "lan", "up"},
				[]string{"-n", n.NetNS, "addr", "add", fmt.Sprintf("%s/%d", n.Addr, n.LAN.Bits()), "dev", "eth0"},
				[]string{"-n", n.NetNS, "link", "set", "eth0", "up"},
				[]string{"-n", n.NetNS, "route", "add", "default", "via", n.Gateway.String()},
			)
		}
	}
	for _, s := range steps {
		if err := t.ip(ctx, s...); err != nil {
			return err
		}
	}
	for _, n := range t.nodes {
		if n.Kind != KindRouter {
			continue
		}
		// Forwarding and NAT only inside the router's own namespace.
		if err := t.nsRun(ctx, n.NetNS, "", "sysctl", "-qw", "net.ipv4.ip_forward=1"); err != nil {
			return err
		}
		if err := t.nsRun(ctx, n.NetNS, routerRules(n), "iptables-restore"); err != nil {
			return err
		}
	}
	return nil
}

// routerRules is the iptables-restore input for a home router of this
// topology (interfaces "wan" and "lan"; see RouterRules).
func routerRules(n *Node) string {
	return RouterRules(RouterConfig{LAN: n.LAN, NAT: n.NAT, Firewall: n.Firewall})
}

// RouterConfig describes a home router's rules (RouterRules).
type RouterConfig struct {
	LAN      netip.Prefix // the LAN whose sources are translated
	NAT      NATKind      // PortPreserving (default) or Symmetric
	Firewall bool         // drop unsolicited inbound traffic on the WAN
	// WAN and LANIf name the interfaces (default "wan" and "lan", as in
	// the namespace routers; a container router passes Docker's eth<i>).
	WAN, LANIf string
}

// RouterRules is the iptables-restore input for a home router: source NAT
// of the LAN out of the WAN and, with Firewall, a home-router firewall:
// new inbound connections on the WAN are dropped, replies to connections
// from the LAN pass. The namespace routers and the container testnet's
// router containers (`meshp2p testnet router-rules`) load this same text.
func RouterRules(c RouterConfig) string {
	wan, lan := c.WAN, c.LANIf
	if wan == "" {
		wan = "wan"
	}
	if lan == "" {
		lan = "lan"
	}
	var b strings.Builder
	b.WriteString("*filter\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n")
	if c.Firewall {
		b.WriteString(":FORWARD DROP [0:0]\n")
		b.WriteString("-A FORWARD -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT\n")
		fmt.Fprintf(&b, "-A FORWARD -i %s -o %s -j ACCEPT\n", lan, wan)
		fmt.Fprintf(&b, "-A FORWARD -i %s -o %s -j ACCEPT\n", lan, lan)
		fmt.Fprintf(&b, "-A INPUT -i %s -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT\n", wan)
		fmt.Fprintf(&b, "-A INPUT -i %s -j DROP\n", wan)
	} else {
		b.WriteString(":FORWARD ACCEPT [0:0]\n")
	}
	b.WriteString("COMMIT\n")
	b.WriteString("*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n")
	masq := fmt.Sprintf("-A POSTROUTING -s %s -o %s -j MASQUERADE", c.LAN, wan)
	if c.NAT == Symmetric {
		masq += " --random-fully"
	}
	b.WriteString(masq + "\nCOMMIT\n")
	return b.String()
}

// netnsNames are the node namespaces (without inet) in spec order.
func (t *Topology) netnsNames() []string {
	names := make([]string, 0, len(t.nodes))
	for _, n := range t.nodes {
		names = append(names, n.NetNS)
	}
	return names
}

// Nodes returns the nodes in spec order: public nodes, then each router
// followed by its hosts.
func (t *Topology) Nodes() []*Node { return slices.Clone(t.nodes) }

// Node returns the node called name.
func (t *Topology) Node(name string) (*Node, error) {
	n, ok := t.byName[name]
	if !ok {
		return nil, fmt.Errorf("%w: %q in %s", ErrNoNode, name, t.Prefix)
	}
	return n, nil
}

// Close kills every process started with Start (and any other process
// found inside the namespaces) by PID, then deletes the namespaces and
// the state record. It is idempotent.
func (t *Topology) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	procs := slices.Clone(t.procs)
	t.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var errs []error
	for _, p := range procs {
		p.kill()
	}
	for _, p := range procs {
		select {
		case <-p.done:
		case <-time.After(5 * time.Second):
			errs = append(errs, fmt.Errorf("testnet: process %s (pid %d) did not exit after SIGKILL", p.Name, p.PID))
		}
	}
	names := append(t.netnsNames(), t.inetNS())
	errs = append(errs, deleteNetns(ctx, names, t.log))
	if t.stateDir != "" {
		if err := os.Remove(filepath.Join(t.stateDir, t.Prefix+".json")); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if t.ownLog {
		_ = os.RemoveAll(t.logDir)
	}
	return errors.Join(errs...)
}

// Cleanup removes whatever is left of the topology with this prefix (for
// example after an interrupted run or `meshp2p testnet up`): processes
// inside its namespaces are killed by PID, the namespaces deleted, the
// state record removed. Nothing with another prefix is touched.
func Cleanup(ctx context.Context, prefix string) error {
	return cleanup(ctx, prefix, DefaultStateDir, nil)
}

func cleanup(ctx context.Context, prefix, stateDir string, log *slog.Logger) error {
	if err := checkPrefix(prefix); err != nil {
		return err
	}
	all, err := listNetns(ctx)
	if err != nil {
		return err
	}
	var names []string
	for _, ns := range all {
		if strings.HasPrefix(ns, prefix+"-") {
			names = append(names, ns)
		}
	}
	errs := []error{deleteNetns(ctx, names, log)}
	if stateDir != "" {
		if err := os.Remove(filepath.Join(stateDir, prefix+".json")); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// deleteNetns kills every process left in each namespace by PID (a process
// keeps a namespace alive after `ip netns del`), then deletes it. Missing
// namespaces are not an error.
func deleteNetns(ctx context.Context, names []string, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	existing, err := listNetns(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, ns := range names {
		if !slices.Contains(existing, ns) {
			continue
		}
		for _, pid := range netnsPIDs(ctx, ns) {
			log.Debug("testnet: kill leftover", "netns", ns, "pid", pid)
			killPID(pid)
		}
		if err := runCmd(ctx, log, "", "ip", "netns", "del", ns); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// netnsPIDs lists processes inside a namespace (`ip netns pids`).
func netnsPIDs(ctx context.Context, ns string) []int {
	out, err := exec.CommandContext(ctx, "ip", "netns", "pids", ns).Output()
	if err != nil {
		return nil
	}
	var pids []int
	for _, f := range strings.Fields(string(out)) {
		var pid int
		if _, err := fmt.Sscan(f, &pid); err == nil && pid > 1 && pid != os.Getpid() {
			pids = append(pids, pid)
		}
	}
	return pids
}

// listNetns returns the names of all named network namespaces. It reads
// /run/netns (what `ip netns list` reads); a missing directory means none.
func listNetns(ctx context.Context) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	entries, err := os.ReadDir("/run/netns")
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("testnet: list namespaces: %w", err)
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names, nil
}

// Prefixes returns the prefixes of topologies that have namespaces on
// this machine (names <prefix>-<node>), sorted.
func Prefixes(ctx context.Context) ([]string, error) {
	names, err := listNetns(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, ns := range names {
		p, _, ok := strings.Cut(ns, "-")
		if ok && checkPrefix(p) == nil && !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out, nil
}

func (t *Topology) ip(ctx context.Context, args ...string) error {
	return runCmd(ctx, t.log, "", "ip", args...)
}

func (t *Topology) nsRun(ctx context.Context, ns, stdin string, args ...string) error {
	return runCmd(ctx, t.log, stdin, "ip", append([]string{"netns", "exec", ns}, args...)...)
}

func runCmd(ctx context.Context, log *slog.Logger, stdin, name string, args ...string) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log.Debug("testnet: run", "cmd", name, "args", args)
	cmd := exec.CommandContext(ctx, name, args...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	if err := cmd.Run(); err != nil {
		return &CmdError{Args: append([]string{name}, args...), Output: out.String(), Err: err}
	}
	return nil
}

// state is what Up records in StateDir/<prefix>.json.
type state struct {
	Prefix  string    `json:"prefix"`
	Spec    Spec      `json:"spec"`
	Nodes   []*Node   `json:"nodes"`
	Owner   int       `json:"owner_pid"`
	Created time.Time `json:"created"`
}

func (t *Topology) writeState() error {
	if err := os.MkdirAll(t.stateDir, 0o755); err != nil {
		return fmt.Errorf("testnet: state dir: %w", err)
	}
	b, err := json.MarshalIndent(state{Prefix: t.Prefix, Spec: t.Spec, Nodes: t.nodes, Owner: os.Getpid(), Created: time.Now().UTC()}, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(t.stateDir, t.Prefix+".json"), append(b, '\n'), 0o644)
}

// Load returns a handle on a topology built earlier (by another process)
// from its state record. Close on it tears the topology down; processes
// started by the other process are killed through `ip netns pids`.
func Load(ctx context.Context, prefix string, opts Options) (*Topology, error) {
	if err := checkPrefix(prefix); err != nil {
		return nil, err
	}
	dir := opts.StateDir
	if dir == "" {
		dir = DefaultStateDir
	}
	b, err := os.ReadFile(filepath.Join(dir, prefix+".json"))
	if err != nil {
		return nil, fmt.Errorf("testnet: no recorded topology %q: %w", prefix, err)
	}
	var st state
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("testnet: state of %q: %w", prefix, err)
	}
	s, err := st.Spec.normalized()
	if err != nil {
		return nil, err
	}
	t := &Topology{Prefix: prefix, Spec: s, stateDir: dir, log: opts.Logger, logDir: opts.LogDir}
	if t.log == nil {
		t.log = slog.New(slog.DiscardHandler)
	}
	t.setNodes(plan(prefix, s))
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return t, nil
}
