package main

import (
	"bytes"
	"flag"
	"slices"
	"strings"
	"testing"
)

// helpSections parses a command's help: the flags under each group title
// it prints, in order ("Ungrouped" and "Flags" count as titles).
func helpSections(t *testing.T, out string) (titles []string, flags map[string][]string) {
	t.Helper()
	known := map[string]bool{"Flags": true}
	for _, g := range groupOrder {
		known[g.title] = true
	}
	flags = map[string][]string{}
	cur := ""
	for _, line := range strings.Split(out, "\n") {
		if title, ok := strings.CutSuffix(line, ":"); ok && (known[title] || strings.HasPrefix(title, "Ungrouped")) {
			titles = append(titles, title)
			cur = title
			continue
		}
		if rest, ok := strings.CutPrefix(line, "  -"); ok && cur != "" {
			name := strings.TrimLeft(strings.Fields(rest)[0], "-")
			flags[cur] = append(flags[cur], name)
		}
	}
	return titles, flags
}

func titleOf(id string) string {
	for _, g := range groupOrder {
		if g.id == id {
			return g.title
		}
	}
	return ""
}

// runHelp runs `meshp2p ARGS` and returns its stdout; help exits 0 and
// writes nothing on stderr.
func runHelp(t *testing.T, args ...string) string {
	t.Helper()
	var out, errb bytes.Buffer
	if rc := run(args, &out, &errb); rc != 0 || errb.Len() != 0 {
		t.Fatalf("%q: exit %d, stderr %q", args, rc, errb.String())
	}
	return out.String()
}

// Issue 41 item 7: the commands with many flags list them by group, the
// common ones first and in groupOrder after; --help hides the testing
// group (and says so), --help-all shows it; every registered flag is in
// exactly one group (a flag registered without one lands in "Ungrouped",
// which fails here), and the tables name no flag a command lacks.
func TestHelpGroups(t *testing.T) {
	for cmd, groups := range flagGroups {
		t.Run(cmd, func(t *testing.T) {
			help := runHelp(t, cmd, "--help")
			all := runHelp(t, cmd, "--help-all")
			if !strings.HasPrefix(help, "Usage:") || !strings.HasPrefix(all, "Usage:") {
				t.Fatalf("help does not start with the usage:\n%s", help)
			}
			titles, shown := helpSections(t, help)
			allTitles, listed := helpSections(t, all)
			var want []string
			for _, g := range groupOrder {
				if len(groups[g.id]) > 0 {
					want = append(want, g.title)
				}
			}
			if !slices.Equal(allTitles, want) {
				t.Fatalf("--help-all groups %q, want %q", allTitles, want)
			}
			if want[0] != titleOf("common") {
				t.Fatalf("the first group is %q, not the common flags", want[0])
			}
			hidden := titleOf(hiddenGroup)
			if !slices.Equal(titles, slices.DeleteFunc(slices.Clone(want), func(s string) bool { return s == hidden })) {
				t.Fatalf("--help groups %q, want %q without %q", titles, want, hidden)
			}
			if len(groups[hiddenGroup]) > 0 && (!slices.Contains(listed[hidden], "test-mode") || !strings.Contains(help, "--help-all also lists")) {
				t.Fatalf("--help-all does not show --test-mode, or --help does not point to it:\n%s", help)
			}
			count := map[string]int{}
			for title, names := range listed {
				for _, n := range names {
					count[n]++
					if title != hidden && !slices.Contains(shown[title], n) {
						t.Errorf("--%s (%s) is not in --help", n, title)
					}
				}
			}
			for _, n := range shown[hidden] {
				t.Errorf("--help shows hidden --%s", n)
			}
			for n, c := range count {
				if c != 1 {
					t.Errorf("--%s is listed %d times", n, c)
				}
			}
			for id, names := range groups {
				if titleOf(id) == "" {
					t.Errorf("group %q is not in groupOrder", id)
				}
				for _, n := range names {
					if count[n] == 0 {
						t.Errorf("group %q names --%s, which %s does not have", id, n, cmd)
					}
				}
			}
			t.Logf("%s: %d flags, %d in --help, %d lines of --help", cmd, len(count), len(count)-len(listed[hidden]), strings.Count(help, "\n"))
		})
	}
	// A flag registered without a group is printed under "Ungrouped", which
	// the checks above refuse.
	var out bytes.Buffer
	fs := cmdFlagSet("status", &out, statusUsage)
	fs.Bool("new-flag", false, "added without a group")
	if err := parseArgs(fs, []string{"--help-all"}); err != flag.ErrHelp {
		t.Fatalf("--help-all: %v", err)
	}
	if titles, flags := helpSections(t, out.String()); !slices.ContainsFunc(titles, func(s string) bool { return strings.HasPrefix(s, "Ungrouped") }) ||
		len(flags[titles[len(titles)-1]]) != 1 {
		t.Fatalf("an ungrouped flag is not shown as such: %q\n%s", titles, out.String())
	}
}

// A usage error prints the error first, then a short usage ending in a
// pointer to --help: a few lines, not the flag list. Exit status 2.
func TestUsageErrorFirst(t *testing.T) {
	for _, c := range []struct {
		args  []string
		first string
	}{
		{[]string{"start"}, "meshp2p start: usage: --model is required"},
		{[]string{"start", "--bogus"}, "meshp2p start: usage: flag provided but not defined: -bogus"},
		{[]string{"start", "--model", "m.gguf", "--layers"}, "meshp2p start: usage: flag needs an argument: -layers"},
		{[]string{"generate", "--prompt", "x"}, "meshp2p generate: usage: --model and --prompt are required (--prompt - reads it from stdin)"},
		{[]string{"generate", "--model", "m", "--prompt", "x", "--top-k", "many"}, `meshp2p generate: usage: invalid value "many" for flag -top-k: parse error`},
		{[]string{"serve", "--api", "127.0.0.1:0"}, "meshp2p serve: usage: --join or --bootstrap (or --tracker) is required: the gateway serves what the swarm serves"},
		{[]string{"status"}, "meshp2p status: usage: --join or --bootstrap is required (there are no public defaults)"},
		{[]string{"tracker", "--bogus"}, "meshp2p tracker: usage: flag provided but not defined: -bogus"},
		{[]string{"shard", "split", "--bogus"}, "meshp2p shard split: usage: flag provided but not defined: -bogus"},
		{[]string{"shard"}, "meshp2p shard: usage: shard needs a subcommand (inspect, split, synth, verify, ls or rm)"},
		{[]string{"key", "show", "extra"}, `meshp2p key show: usage: unexpected argument "extra"`},
	} {
		var out, errb bytes.Buffer
		rc := run(c.args, &out, &errb)
		lines := strings.Split(strings.TrimSuffix(errb.String(), "\n"), "\n")
		if rc != 2 || out.Len() != 0 || lines[0] != c.first {
			t.Errorf("%q: exit %d, stdout %q, first line %q, want %q", c.args, rc, out.String(), lines[0], c.first)
			continue
		}
		if len(lines) > 12 || !strings.HasPrefix(lines[1], "Usage: meshp2p ") || !strings.Contains(lines[len(lines)-1], "--help") {
			t.Errorf("%q: the usage after the error is not a short one:\n%s", c.args, errb.String())
		}
	}
}
