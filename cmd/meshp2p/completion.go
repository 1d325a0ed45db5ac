package main

import (
	"context"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
)

const completionUsage = `Usage: meshp2p completion bash|zsh|fish

Prints a shell completion script for meshp2p's commands, subcommands and
flags. Load it:
  bash: source <(meshp2p completion bash)    (or save it under
        /etc/bash_completion.d/meshp2p)
  zsh:  meshp2p completion zsh > "${fpath[1]}/_meshp2p"   (then compinit)
  fish: meshp2p completion fish > ~/.config/fish/completions/meshp2p.fish
The script is made from this binary's own --help-all, so it lists exactly
its flags; make it again after an upgrade.
`

// completionWords are what each command completes to: its subcommands
// (shard inspect, key show, ...) and its flags (with their dashes).
type completionWords struct {
	name  string
	subs  []string
	flags []string
}

var (
	flagLineRE = regexp.MustCompile(`^\s{2,}(-{1,2}[A-Za-z0-9][A-Za-z0-9-]*)`)
)

// completionTable reads every command's --help-all and short usage
// (subcommands: each "meshp2p CMD SUB" usage line, whose --help gives
// their flags) into words.
func completionTable(ctx context.Context) []completionWords {
	var out []completionWords
	for _, c := range commands() {
		if c.name == "completion" {
			out = append(out, completionWords{name: c.name, subs: []string{"bash", "zsh", "fish"}})
			continue
		}
		w := completionWords{name: c.name}
		subRE := regexp.MustCompile(`^(?:Usage:)?\s*meshp2p ` + regexp.QuoteMeta(c.name) + ` ([a-z][a-z-]*)\b`)
		help := helpText(ctx, c, "--help-all") + shortUsage(c.name)
		for _, line := range strings.Split(help, "\n") {
			if m := subRE.FindStringSubmatch(line); m != nil && !slices.Contains(w.subs, m[1]) {
				w.subs = append(w.subs, m[1])
			}
		}
		for _, sub := range w.subs {
			help += helpText(ctx, c, sub, "--help")
		}
		for _, line := range strings.Split(help, "\n") {
			if m := flagLineRE.FindStringSubmatch(line); m != nil {
				f := m[1]
				if !strings.HasPrefix(f, "--") {
					f = "-" + f
				}
				if !slices.Contains(w.flags, f) {
					w.flags = append(w.flags, f)
				}
			}
		}
		if !slices.Contains(w.flags, "--help") {
			w.flags = append(w.flags, "--help")
		}
		out = append(out, w)
	}
	return out
}

// helpText is what command c prints for args (a help request).
func helpText(ctx context.Context, c command, args ...string) string {
	var b strings.Builder
	_ = c.run(ctx, &b, &b, args)
	return b.String()
}

func runCompletion(ctx context.Context, stdout, _ io.Writer, args []string) error {
	fs := cmdFlagSet("completion", stdout, completionUsage)
	if err := parseArgs(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("%w: which shell? bash, zsh or fish", errUsage)
	}
	table := completionTable(ctx)
	switch fs.Arg(0) {
	case "bash":
		writeBash(stdout, table)
	case "zsh":
		fmt.Fprint(stdout, "#compdef meshp2p\n# meshp2p completion zsh: through bash's completion function.\nautoload -U +X bashcompinit && bashcompinit\n")
		writeBash(stdout, table)
	case "fish":
		writeFish(stdout, table)
	default:
		return fmt.Errorf("%w: shell %q: bash, zsh or fish", errUsage, fs.Arg(0))
	}
	return nil
}

func commandNames(table []completionWords) string {
	names := make([]string, len(table))
	for i, w := range table {
		names[i] = w.name
	}
	return strings.Join(names, " ")
}

// writeBash writes a bash completion function (zsh loads it through
// bashcompinit).
func writeBash(w io.Writer, table []completionWords) {
	fmt.Fprintf(w, `# meshp2p completion bash: source <(meshp2p completion bash)
_meshp2p() {
	local cur=${COMP_WORDS[COMP_CWORD]} cmd=${COMP_WORDS[1]} words=""
	if [ "$COMP_CWORD" -eq 1 ]; then
		COMPREPLY=($(compgen -W "%s --help --version" -- "$cur"))
		return
	fi
	case "$cmd" in
`, commandNames(table))
	for _, c := range table {
		fmt.Fprintf(w, "\t%s)\n", c.name)
		if len(c.subs) > 0 {
			fmt.Fprintf(w, "\t\tif [ \"$COMP_CWORD\" -eq 2 ]; then COMPREPLY=($(compgen -W %q -- \"$cur\")); return; fi\n", strings.Join(c.subs, " "))
		}
		fmt.Fprintf(w, "\t\twords=%q ;;\n", strings.Join(c.flags, " "))
	}
	fmt.Fprint(w, `	esac
	case "$cur" in
	-*) COMPREPLY=($(compgen -W "$words" -- "$cur")) ;;
	*) COMPREPLY=($(compgen -f -- "$cur")) ;;
	esac
}
complete -o default -F _meshp2p meshp2p
`)
}

// writeFish writes fish completions.
func writeFish(w io.Writer, table []completionWords) {
	fmt.Fprintf(w, "# meshp2p completion fish\ncomplete -c meshp2p -f -n __fish_use_subcommand -a %q\n", commandNames(table))
	for _, c := range table {
		if len(c.subs) > 0 {
			fmt.Fprintf(w, "complete -c meshp2p -f -n '__fish_seen_subcommand_from %s' -a %q\n", c.name, strings.Join(c.subs, " "))
		}
		for _, f := range c.flags {
			if name, ok := strings.CutPrefix(f, "--"); ok {
				fmt.Fprintf(w, "complete -c meshp2p -n '__fish_seen_subcommand_from %s' -l %s\n", c.name, name)
			} else {
				fmt.Fprintf(w, "complete -c meshp2p -n '__fish_seen_subcommand_from %s' -o %s\n", c.name, strings.TrimPrefix(f, "-"))
			}
		}
	}
}
