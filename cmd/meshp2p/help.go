package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
)

// Help (issue 41, item 7): a command's --help lists its flags grouped by
// purpose, the common ones first; the testing and debugging flags (and a
// client's relay internals) only with --help-all. A usage error prints
// the error first, then the command's synopsis and a pointer to --help
// (main.go), not the whole flag list.

// helpAllFlag prints every flag, the hidden group's too.
const helpAllFlag = "help-all"

// hiddenGroup is the group --help leaves out.
const hiddenGroup = "testing"

// groupOrder is the order groups are printed in, and their titles.
var groupOrder = []struct{ id, title string }{
	{"common", "Common flags"},
	{"sampling", "Sampling"},
	{"network", "Network"},
	{"placement", "Placement and resources"},
	{"api", "HTTP API"},
	{"trust", "Trust and limits"},
	{"observability", "Logs and metrics"},
	{"advanced", "Advanced"},
	{hiddenGroup, "Testing, debugging and internals"},
}

// The hidden flags every client command (generate, serve, status) has:
// the test switches and the relay service's, which a client never runs.
var clientHidden = []string{"test-mode", "test-public-cidrs", "relay-service", "relay-peer-mib"}

// flagGroups are the flag groups of the commands with many flags, by
// flag set name: group id -> flag names. Every flag of these commands is
// in exactly one group (TestHelpGroups); a flag without one is printed
// under "Ungrouped", which that test refuses. Commands not listed print
// one "Flags" list.
var flagGroups = map[string]map[string][]string{
	"start": {
		"common":        {"model", "layers", "memory", "join", "bootstrap", "swarm-key", "listen", "data-dir", "api"},
		"network":       {"network", "relay", "relay-service", "tracker", "port-mapping"},
		"placement":     {"name", "draft", "device", "backend-dir", "threads", "ctx", "prefix-cache", "batch", "max-sessions", "mmap", "rebalance-interval", "fetch-wait", "upload-limit", "upload-limit-per-peer"},
		"api":           {"api-key", "cors-origin", "api-max-active", "api-queue", "api-max-tokens", "api-max-body", "warm-timeout", "speculative", "chat-template"},
		"trust":         {"trusted-client", "max-session-kv", "max-sessions-per-client", "idle-timeout", "require-ticket", "trust-tracker", "audit-rate", "audit-model", "proof-dir"},
		"observability": {"metrics", "log-format", "v"},
		"advanced":      {"dht-mode", "reachability", "direct-wait", "relay-peer-mib"},
		hiddenGroup:     {"test-mode", "test-public-cidrs"},
	},
	"generate": {
		"common":        {"model", "prompt", "join", "bootstrap", "swarm-key", "max-tokens", "chat", "chat-template", "local", "stats", "json"},
		"sampling":      {"temperature", "top-k", "top-p", "min-p", "repeat-penalty", "repeat-last-n", "frequency-penalty", "presence-penalty", "seed", "stop"},
		"network":       {"network", "listen", "relay", "tracker", "data-dir", "wait"},
		"placement":     {"device", "backend-dir", "threads", "mmap"},
		"trust":         {"require-tracker", "audit-rate", "audit-model", "proof-dir"},
		"observability": {"v"},
		"advanced":      {"speculative", "standby", "wire-dtype", "dht-mode", "reachability", "port-mapping", "prefill-chunk"},
		hiddenGroup:     clientHidden,
	},
	"chat": {
		"common":        {"model", "system", "join", "bootstrap", "swarm-key", "max-tokens", "chat-template", "local"},
		"sampling":      {"temperature", "top-k", "top-p", "min-p", "repeat-penalty", "repeat-last-n", "frequency-penalty", "presence-penalty", "seed", "stop"},
		"network":       {"network", "listen", "relay", "tracker", "data-dir", "wait"},
		"placement":     {"device", "backend-dir", "threads", "mmap"},
		"trust":         {"require-tracker", "audit-rate", "audit-model", "proof-dir"},
		"observability": {"v"},
		"advanced":      {"speculative", "standby", "wire-dtype", "dht-mode", "reachability", "port-mapping", "prefill-chunk"},
		// generate's one-shot flags, refused by chat.
		hiddenGroup: append([]string{"prompt", "chat", "stats", "json"}, clientHidden...),
	},
	"serve": {
		"common":        {"api", "join", "bootstrap", "swarm-key", "api-key", "data-dir"},
		"network":       {"network", "listen", "relay", "tracker"},
		"api":           {"chat-template", "cors-origin", "api-max-active", "api-queue", "api-max-tokens", "api-max-body", "warm-timeout", "speculative"},
		"trust":         {"require-tracker", "audit-rate", "audit-model", "proof-dir"},
		"observability": {"log-format", "v"},
		"advanced":      {"dht-mode", "reachability", "port-mapping"},
		hiddenGroup:     clientHidden,
	},
	"status": {
		"common":        {"join", "bootstrap", "swarm-key", "model", "json", "watch"},
		"network":       {"network", "listen", "relay", "wait"},
		"observability": {"v"},
		"advanced":      {"dht-mode", "reachability", "port-mapping"},
		// status joins with a temporary identity: --data-dir is unused.
		hiddenGroup: append([]string{"data-dir"}, clientHidden...),
	},
	"tracker": {
		"common":        {"listen", "data-dir", "network", "join", "swarm-key", "bootstrap"},
		"network":       {"relay", "relay-service", "relay-peer-mib", "port-mapping", "dht-mode", "reachability"},
		"trust":         {"ticket-ttl", "audit-rate", "audit-model"},
		"observability": {"metrics", "log-format", "v"},
		"advanced":      {"ping-interval"},
		hiddenGroup:     {"test-mode", "test-public-cidrs"},
	},
}

// cmdHelp is the --help-all flag's value; it also holds what --help
// prints before the flags and where.
type cmdHelp struct {
	out    io.Writer
	header string
	all    bool
}

func (h *cmdHelp) String() string {
	if h == nil {
		return "false"
	}
	return strconv.FormatBool(h.all)
}

func (h *cmdHelp) Set(s string) error {
	v, err := strconv.ParseBool(s)
	h.all = v
	return err
}

func (h *cmdHelp) IsBoolFlag() bool { return true }

// cmdFlagSet is a command's flag set: help (the header, then the grouped
// flags) goes to out when asked for (--help, --help-all); the flag
// package prints nothing itself, so an error is printed once, first, by
// main. header "" prints the command's synopsis.
func cmdFlagSet(name string, out io.Writer, header string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	fs.Var(&cmdHelp{out: out, header: header}, helpAllFlag, "list every flag, the testing and debugging ones too")
	return fs
}

// parseArgs parses args with fs; it prints the help asked for and then
// returns flag.ErrHelp, and wraps other errors in errUsage.
func parseArgs(fs *flag.FlagSet, args []string) error {
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		printHelp(fs, false)
		return err
	case err != nil:
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if h := helpOf(fs); h != nil && h.all {
		printHelp(fs, true)
		return flag.ErrHelp
	}
	return applyConfig(fs, configPath())
}

func helpOf(fs *flag.FlagSet) *cmdHelp {
	if f := fs.Lookup(helpAllFlag); f != nil {
		if h, ok := f.Value.(*cmdHelp); ok {
			return h
		}
	}
	return nil
}

// printHelp prints fs's help: the header, then the flags by group (all:
// the hidden group too).
func printHelp(fs *flag.FlagSet, all bool) {
	h := helpOf(fs)
	if h == nil {
		return
	}
	header := h.header
	if header == "" {
		header = synopsis(fs.Name())
	}
	fmt.Fprint(h.out, strings.TrimRight(header, "\n")+"\n")
	groups, grouped := flagGroups[fs.Name()]
	if !grouped {
		fmt.Fprintf(h.out, "\nFlags:\n")
		fs.VisitAll(func(f *flag.Flag) {
			if f.Name != helpAllFlag {
				printFlag(h.out, f)
			}
		})
		return
	}
	placed := map[string]bool{helpAllFlag: true}
	for _, g := range groupOrder {
		for _, n := range groups[g.id] {
			placed[n] = true
		}
		if len(groups[g.id]) == 0 || (g.id == hiddenGroup && !all) {
			continue
		}
		fmt.Fprintf(h.out, "\n%s:\n", g.title)
		for _, n := range groups[g.id] {
			if f := fs.Lookup(n); f != nil {
				printFlag(h.out, f)
			}
		}
	}
	var rest []*flag.Flag
	fs.VisitAll(func(f *flag.Flag) {
		if !placed[f.Name] {
			rest = append(rest, f)
		}
	})
	if len(rest) > 0 {
		fmt.Fprintf(h.out, "\nUngrouped (give each a group in cmd/meshp2p/help.go):\n")
		for _, f := range rest {
			printFlag(h.out, f)
		}
	}
	if n := len(groups[hiddenGroup]); n > 0 && !all {
		fmt.Fprintf(h.out, "\n--help-all also lists %d testing and debugging flags.\n", n)
	}
}

// printFlag prints one flag as the flag package would, with "--" before
// names longer than one letter and the usage wrapped.
func printFlag(w io.Writer, f *flag.Flag) {
	typ, usage := flag.UnquoteUsage(f)
	dash := "--"
	if len(f.Name) == 1 {
		dash = "-"
	}
	line := "  " + dash + f.Name
	if typ != "" {
		line += " " + typ
	}
	switch f.DefValue {
	case "", "0", "false", "0s", "[]":
	default:
		if typ == "string" {
			usage += fmt.Sprintf(" (default %q)", f.DefValue)
		} else {
			usage += fmt.Sprintf(" (default %s)", f.DefValue)
		}
	}
	fmt.Fprintln(w, line)
	fmt.Fprint(w, wrap(usage, "        ", 88))
}

// wrap breaks s into lines of at most width columns (a longer word
// stands alone), each starting with indent.
func wrap(s, indent string, width int) string {
	var b strings.Builder
	line := indent
	for _, word := range strings.Fields(s) {
		if line != indent && len(line)+1+len(word) > width {
			b.WriteString(line + "\n")
			line = indent
		}
		if line != indent {
			line += " "
		}
		line += word
	}
	b.WriteString(line + "\n")
	return b.String()
}

// usageTexts are the commands' usage texts, where synopsis finds the
// command lines of a command or subcommand.
func usageTexts() map[string]string {
	return map[string]string{"start": startUsage, "generate": generateUsage, "serve": serveUsage, "status": statusUsage,
		"tracker": trackerUsage, "shard": shardUsage + shardLsUsage, "key": keyUsage, "invite": inviteUsage, "proof": proofUsage, "testnet": testnetHelp,
		"version": "Usage: meshp2p version [--backend-dir DIRS]\n"}
}

// synopsis is the short usage of path ("start", "shard split"): the
// lines of its command's usage text that begin with "meshp2p PATH",
// under "Usage:".
func synopsis(path string) string {
	top, _, _ := strings.Cut(path, " ")
	var lines []string
	for _, l := range strings.Split(usageTexts()[top], "\n") {
		t := strings.TrimSpace(l)
		t = strings.TrimSpace(strings.TrimPrefix(strings.TrimPrefix(t, "Usage:"), "usage:"))
		if (t == "meshp2p "+path || strings.HasPrefix(t, "meshp2p "+path+" ")) && !slices.Contains(lines, t) {
			lines = append(lines, t)
		}
	}
	if len(lines) == 0 {
		return ""
	}
	return "Usage: " + strings.Join(lines, "\n       ") + "\n"
}

// cmdPath is the (sub)command args run: "start", or "shard split" when
// args[1] names a subcommand the usage text lists.
func cmdPath(args []string) string {
	if len(args) > 1 && !strings.HasPrefix(args[1], "-") && synopsis(args[0]+" "+args[1]) != "" {
		return args[0] + " " + args[1]
	}
	return args[0]
}

// shortUsage is what follows a usage error of path: its synopsis and
// where the rest is.
func shortUsage(path string) string {
	more := ""
	if _, ok := flagGroups[path]; ok {
		more = " (--help-all: every flag)"
	}
	return synopsis(path) + fmt.Sprintf("Run 'meshp2p %s --help' for more%s.\n", path, more)
}
