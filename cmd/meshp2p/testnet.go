package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/neuron-tai/meshp2p/testnet"
)

const testnetHelp = `Usage: meshp2p testnet <up|down|status|exec|spec> [flags]

Builds a NAT test network out of Linux network namespaces (needs root):
an "internet" bridge on 203.0.113.0/24, public nodes (bootstrap/relay/
tracker) at .10, .11, ..., home routers at .100, .101, ... doing source NAT
for their LAN 10.0.<i>.0/24 (port-preserving MASQUERADE or symmetric
MASQUERADE --random-fully) behind a firewall that drops unsolicited inbound
traffic, and hosts behind them. Nothing in the root namespace changes.

  meshp2p testnet up [--prefix mp] [--homes 2] [--hosts 1] [--nat port-preserving|symmetric] [--open-firewall]
  meshp2p testnet up [--prefix mp] --spec topo.json
        build it and print how to reach each node
  meshp2p testnet status [--prefix mp]
        show a topology (without --prefix: list all on this machine)
  meshp2p testnet exec [--prefix mp] NODE -- COMMAND [ARGS...]
        run a command inside NODE's namespace (like ip netns exec)
  meshp2p testnet down [--prefix mp]
        kill its processes by PID and delete its namespaces
  meshp2p testnet down --stale [--prefix mp]
        remove test topologies (t<pid><rand>) whose test process is gone
        (and the --prefix one, if given)
  meshp2p testnet spec [--homes 2] [--hosts 1] [--nat ...] [--open-firewall]
        print the JSON spec 'up' would build, to edit and pass to --spec
  meshp2p testnet router-rules --lan 10.0.1.0/24 --wan 198.51.100.0/24 [--nat ...] [--open-firewall]
        print this machine's home-router rules (NAT + firewall, the same text
        the namespace routers load) for iptables-restore; the interfaces are
        the ones holding addresses in --lan and --wan (testnet/compose routers)

Spec (JSON):
  {"internet": "203.0.113.0/24",            optional, an IPv4 /24
   "lans": "10.0.0.0/16",                   optional, home i gets 10.0.<i+1>.0/24
   "public": [{"name": "relay", "roles": ["bootstrap", "relay"]}],
   "homes": [{"name": "home1", "nat": "port-preserving", "hosts": ["a"]},
             {"name": "home2", "nat": "symmetric", "open_firewall": false, "hosts": ["b", "c"]}]}
  Names: [a-z][a-z0-9]*, at most 6 characters; prefix at most 8 (netns <prefix>-<name>).

libp2p nodes inside must run in test mode: 203.0.113.0/24 treated as public
(libp2p never hole-punches towards "documentation" addresses otherwise) and
relaxed relay rate limits. Start the relay first and wait until it is ready.
`

// runTestnet implements `meshp2p testnet`.
func runTestnet(ctx context.Context, stdout, stderr io.Writer, args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: missing subcommand (up, down, status, exec, spec)", errUsage)
	}
	switch args[0] {
	case "-h", "--help", "help":
		fmt.Fprint(stdout, testnetHelp)
		return nil
	case "up":
		return testnetUp(ctx, stdout, stderr, args[1:])
	case "down":
		return testnetDown(ctx, stdout, stderr, args[1:])
	case "status":
		return testnetStatus(ctx, stdout, stderr, args[1:])
	case "exec":
		return testnetExec(ctx, stdout, stderr, args[1:])
	case "spec":
		return testnetSpec(stdout, stderr, args[1:])
	case "router-rules":
		return testnetRouterRules(stdout, stderr, args[1:])
	}
	return fmt.Errorf("%w: unknown subcommand %q", errUsage, args[0])
}

// specFlags are the flags that describe a simple topology.
type specFlags struct {
	homes, hosts int
	nat          string
	open         bool
}

func (f *specFlags) register(fs *flag.FlagSet) {
	fs.IntVar(&f.homes, "homes", defaultTestnetHomes, "number of home routers (NATs)")
	fs.IntVar(&f.hosts, "hosts", defaultTestnetHosts, "hosts behind each home router")
	fs.StringVar(&f.nat, "nat", string(testnet.PortPreserving), "NAT kind of every home: port-preserving or symmetric")
	fs.BoolVar(&f.open, "open-firewall", false, "no router firewall (hole punching then fails)")
}

func (f *specFlags) spec() (testnet.Spec, error) {
	if f.homes < 0 || f.homes > testnet.MaxHomes || f.hosts < 1 || f.hosts > 9 {
		return testnet.Spec{}, fmt.Errorf("%w: --homes 0…%d, --hosts 1…9 (more: use --spec)", errUsage, testnet.MaxHomes)
	}
	nat := testnet.NATKind(f.nat)
	if nat != testnet.PortPreserving && nat != testnet.Symmetric {
		return testnet.Spec{}, fmt.Errorf("%w: --nat %q: want %s or %s", errUsage, f.nat, testnet.PortPreserving, testnet.Symmetric)
	}
	s := testnet.SimpleSpec(f.homes, f.hosts, nat)
	for i := range s.Homes {
		s.Homes[i].OpenFirewall = f.open
	}
	return s, nil
}

// newFlagSet is the flag set of testnet's subcommand name; its help goes
// to w.
func newFlagSet(name string, w io.Writer) *flag.FlagSet {
	return cmdFlagSet("testnet "+name, w, "")
}

// parse wraps flag errors (other than --help) as usage errors.
func parse(fs *flag.FlagSet, args []string) error { return parseArgs(fs, args) }

func testnetUp(ctx context.Context, stdout, stderr io.Writer, args []string) error {
	fs := newFlagSet("up", stderr)
	prefix := fs.String("prefix", "mp", "name prefix: namespaces are <prefix>-<node>")
	specFile := fs.String("spec", "", "JSON spec file (instead of --homes/--hosts/--nat)")
	var sf specFlags
	sf.register(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected arguments %q", errUsage, fs.Args())
	}
	var spec testnet.Spec
	var err error
	if *specFile != "" {
		f, err := os.Open(*specFile)
		if err != nil {
			return err
		}
		spec, err = testnet.ReadSpec(f)
		f.Close()
		if err != nil {
			return err
		}
	} else if spec, err = sf.spec(); err != nil {
		return err
	}
	if err := testnet.Check(ctx); err != nil {
		return err
	}
	topo, err := testnet.Up(ctx, *prefix, spec, testnet.Options{})
	if err != nil {
		return err
	}
	printTopology(stdout, topo, nil)
	fmt.Fprintf(stdout, "\nTear down: meshp2p testnet down --prefix %s\n", topo.Prefix)
	return nil
}

func testnetDown(ctx context.Context, stdout, stderr io.Writer, args []string) error {
	fs := newFlagSet("down", stderr)
	prefix := fs.String("prefix", "mp", "name prefix of the topology")
	stale := fs.Bool("stale", false, "also remove test topologies whose test process is gone")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected arguments %q", errUsage, fs.Args())
	}
	prefixSet := false
	fs.Visit(func(f *flag.Flag) { prefixSet = prefixSet || f.Name == "prefix" })
	if *stale {
		if err := testnet.SweepStale(ctx); err != nil {
			return err
		}
		fmt.Fprintln(stdout, "stale test networks removed")
		if !prefixSet {
			return nil
		}
	}
	if err := testnet.Cleanup(ctx, *prefix); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "testnet %s: down\n", *prefix)
	return nil
}

func testnetStatus(ctx context.Context, stdout, stderr io.Writer, args []string) error {
	fs := newFlagSet("status", stderr)
	prefix := fs.String("prefix", "", "name prefix of the topology (default: list all)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected arguments %q", errUsage, fs.Args())
	}
	if *prefix == "" {
		prefixes, err := testnet.Prefixes(ctx)
		if err != nil {
			return err
		}
		if len(prefixes) == 0 {
			fmt.Fprintln(stdout, "no test networks on this machine")
			return nil
		}
		for _, p := range prefixes {
			fmt.Fprintln(stdout, p)
		}
		fmt.Fprintln(stdout, "\nDetails: meshp2p testnet status --prefix PREFIX")
		return nil
	}
	topo, err := testnet.Load(ctx, *prefix, testnet.Options{})
	if err != nil {
		return err
	}
	present, err := namespaces()
	if err != nil {
		return err
	}
	printTopology(stdout, topo, present)
	return nil
}

func testnetExec(ctx context.Context, stdout, stderr io.Writer, args []string) error {
	fs := newFlagSet("exec", stderr)
	prefix := fs.String("prefix", "mp", "name prefix of the topology")
	if err := parse(fs, args); err != nil {
		return err
	}
	rest := fs.Args()
	if len(rest) > 1 && rest[1] == "--" {
		rest = append(rest[:1:1], rest[2:]...)
	}
	if len(rest) < 2 {
		return fmt.Errorf("%w: want NODE -- COMMAND [ARGS...]", errUsage)
	}
	topo, err := testnet.Load(ctx, *prefix, testnet.Options{})
	if err != nil {
		return err
	}
	n, err := topo.Node(rest[0])
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", n.NetNS}, rest[1:]...)...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, stdout, stderr
	return cmd.Run()
}

func testnetSpec(stdout, stderr io.Writer, args []string) error {
	fs := newFlagSet("spec", stderr)
	var sf specFlags
	sf.register(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	s, err := sf.spec()
	if err != nil {
		return err
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(s)
}

// namespaces lists named network namespaces (nil if none).
func namespaces() ([]string, error) {
	entries, err := os.ReadDir("/run/netns")
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out, nil
}

// printTopology prints a table of nodes and how to reach them. present,
// when not nil, marks namespaces that are gone.
func printTopology(w io.Writer, topo *testnet.Topology, present []string) {
	fmt.Fprintf(w, "testnet %s: internet %s (bridge br0 in netns %s-inet), LANs from %s\n\n",
		topo.Prefix, topo.Spec.Internet, topo.Prefix, topo.Spec.LANs)
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tKIND\tNETNS\tADDRESS\tON THE INTERNET AS\tNOTES")
	first := ""
	for _, n := range topo.Nodes() {
		var notes []string
		switch n.Kind {
		case testnet.KindPublic:
			for _, r := range n.Roles {
				notes = append(notes, string(r))
			}
		case testnet.KindRouter:
			fw := "firewall on"
			if !n.Firewall {
				fw = "firewall OFF"
			}
			notes = append(notes, "lan "+n.LAN.String(), "nat "+string(n.NAT), fw)
		case testnet.KindHost:
			notes = append(notes, "behind "+n.Router+" ("+string(n.NAT)+")")
		}
		if present != nil && !slices.Contains(present, n.NetNS) {
			notes = append(notes, "MISSING")
		}
		if first == "" && n.Kind != testnet.KindRouter {
			first = n.Name
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", n.Name, n.Kind, n.NetNS, n.Addr, n.Public, strings.Join(notes, ", "))
	}
	tw.Flush()
	if first == "" {
		return
	}
	fmt.Fprintf(w, "\nRun a command on a node:  meshp2p testnet exec --prefix %s %s -- COMMAND [ARGS...]\n", topo.Prefix, first)
	fmt.Fprintf(w, "                      or: ip netns exec %s-%s COMMAND [ARGS...]\n", topo.Prefix, first)
	fmt.Fprintf(w, "Hosts reach public nodes directly; nothing reaches a host from outside its LAN unless it dialled out first.\n")
}

// testnet up's defaults: two homes behind their own NAT, one host each.
const (
	defaultTestnetHomes = 2
	defaultTestnetHosts = 1
)
