package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// The config file: defaults for the flags people repeat (--bootstrap,
// --swarm-key, --network, --data-dir, ...), so `meshp2p generate --model m
// --prompt hi` joins the usual swarm. Path: $MESHP2P_CONFIG, else
// <user config dir>/meshp2p/config.toml (~/.config/meshp2p/config.toml on
// Linux). A small TOML subset:
//
//	# top level: every command that has the flag
//	bootstrap = "/ip4/192.0.2.7/tcp/4001/p2p/12D3KooW..."
//	swarm-key = "/home/me/.meshp2p/swarm.key"
//	[start]               # one command's own
//	memory = "12G"
//	threads = 2
//	mmap = false
//	[generate]
//	max-tokens = 256
//	stop = ["\n\n", "THE END"]   # a list: comma-joined
//
// The command line wins over the file, a command's section over the top
// level. A top-level key no flag of the command has is left alone (it is
// another command's); a key a section's command does not have is an error
// naming the file and line (a typo must not pass silently).

// configEnv names the config file in place of the default path.
const configEnv = "MESHP2P_CONFIG"

// maxConfigBytes bounds the config file.
const maxConfigBytes = 1 << 20

// configPath is the config file to read ("" : none).
func configPath() string {
	if p, ok := os.LookupEnv(configEnv); ok {
		return p
	}
	d, err := os.UserConfigDir()
	if err != nil {
		return ""
	}
	return filepath.Join(d, "meshp2p", "config.toml")
}

// configEntry is one key = value of the file.
type configEntry struct {
	section, key, value string
	line                int
}

// applyConfig sets each flag of fs that the command line did not set from
// the config file at path (a missing file sets nothing).
func applyConfig(fs *flag.FlagSet, path string) error {
	if path == "" {
		return nil
	}
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	defer f.Close()
	entries, err := parseConfig(io.LimitReader(f, maxConfigBytes))
	if err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	given := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { given[fl.Name] = true })
	values := map[string]configEntry{}
	for _, e := range entries {
		switch {
		case e.section == "" && fs.Lookup(e.key) != nil:
			if _, ok := values[e.key]; !ok {
				values[e.key] = e
			}
		case e.section == fs.Name():
			if fs.Lookup(e.key) == nil {
				return fmt.Errorf("%w: config %s:%d: meshp2p %s has no flag --%s", errUsage, path, e.line, fs.Name(), e.key)
			}
			values[e.key] = e // the command's own wins
		}
	}
	for key, e := range values {
		if given[key] {
			continue
		}
		if err := fs.Set(key, e.value); err != nil {
			return fmt.Errorf("%w: config %s:%d: %s: %v", errUsage, path, e.line, key, err)
		}
	}
	return nil
}

// parseConfig reads the TOML subset: comments, [section] headers and
// key = value with a quoted string, a bare number or boolean, or a list of
// strings (joined with commas).
func parseConfig(r io.Reader) ([]configEntry, error) {
	var out []configEntry
	section := ""
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if name, ok := strings.CutPrefix(line, "["); ok {
			name, ok = strings.CutSuffix(stripComment(name), "]")
			if !ok || strings.TrimSpace(name) == "" {
				return nil, fmt.Errorf("line %d: a section is [command]", n)
			}
			section = strings.TrimSpace(name)
			continue
		}
		key, raw, ok := strings.Cut(line, "=")
		key = strings.TrimSpace(key)
		if !ok || key == "" {
			return nil, fmt.Errorf("line %d: want key = value", n)
		}
		v, err := configValue(strings.TrimSpace(raw))
		if err != nil {
			return nil, fmt.Errorf("line %d: %s: %w", n, key, err)
		}
		out = append(out, configEntry{section: section, key: key, value: v, line: n})
	}
	return out, sc.Err()
}

// configValue is one value as a flag's text.
func configValue(raw string) (string, error) {
	switch {
	case strings.HasPrefix(raw, `"`):
		s, rest, err := quoted(raw)
		if err != nil {
			return "", err
		}
		if r := stripComment(rest); strings.TrimSpace(r) != "" {
			return "", fmt.Errorf("text after the string: %q", r)
		}
		return s, nil
	case strings.HasPrefix(raw, "["):
		var items []string
		rest := strings.TrimSpace(raw[1:])
		for !strings.HasPrefix(rest, "]") {
			s, after, err := quoted(rest)
			if err != nil {
				return "", fmt.Errorf("a list is [\"a\", \"b\"] on one line: %w", err)
			}
			items = append(items, s)
			rest = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(after), ","))
		}
		if r := stripComment(rest[1:]); strings.TrimSpace(r) != "" {
			return "", fmt.Errorf("text after the list: %q", r)
		}
		return strings.Join(items, ","), nil
	}
	v := strings.TrimSpace(stripComment(raw))
	if v == "" {
		return "", errors.New("no value")
	}
	return v, nil
}

// quoted reads the double-quoted string that s starts with (Go/TOML
// escapes) and returns it and what follows.
func quoted(s string) (string, string, error) {
	if !strings.HasPrefix(s, `"`) {
		return "", "", fmt.Errorf("want a quoted string at %q", s)
	}
	for i := 1; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '"':
			v, err := strconv.Unquote(s[:i+1])
			return v, s[i+1:], err
		}
	}
	return "", "", errors.New("unterminated string")
}

// stripComment drops a # comment (outside strings: callers pass what
// follows them).
func stripComment(s string) string {
	if i := strings.Index(s, "#"); i >= 0 {
		return s[:i]
	}
	return s
}
