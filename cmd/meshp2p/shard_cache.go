package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/neuron-tai/meshp2p/engine/gguf"
)

// cacheEntry is one file of the shard cache (<data-dir>/shards/<fp16>/).
type cacheEntry struct {
	Model string     `json:"model"` // fingerprint (from the shard) or its 16-character directory prefix
	Kind  string     `json:"kind"`  // shard, manifest, vocab, staging
	Range gguf.Range `json:"range,omitzero"`
	Size  int64      `json:"size"`
	Path  string     `json:"path"`
}

// listCache lists the shard cache: shard files (cut by split, fetched or
// downloaded), manifests, vocabularies and unfinished fetches' staging.
func listCache(dataDir string) ([]cacheEntry, error) {
	root := filepath.Join(dataDir, "shards")
	dirs, err := os.ReadDir(root)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []cacheEntry
	for _, d := range dirs {
		if !d.IsDir() {
			continue
		}
		dir := filepath.Join(root, d.Name())
		files, err := os.ReadDir(dir)
		if err != nil {
			return nil, err
		}
		for _, f := range files {
			p := filepath.Join(dir, f.Name())
			e := cacheEntry{Model: d.Name(), Path: p}
			switch {
			case f.IsDir():
				e.Kind = "staging"
				_ = filepath.WalkDir(p, func(_ string, de os.DirEntry, _ error) error {
					if de != nil && !de.IsDir() {
						if fi, err := de.Info(); err == nil {
							e.Size += fi.Size()
						}
					}
					return nil
				})
			case f.Name() == "manifest":
				e.Kind = "manifest"
			case strings.HasSuffix(f.Name(), "vocab.gguf"):
				e.Kind = "vocab"
			case strings.HasSuffix(f.Name(), ".gguf"):
				e.Kind = "shard"
				if g, err := gguf.Open(p); err == nil {
					if si, err := gguf.ReadShardInfo(g.Metadata); err == nil {
						e.Model, e.Range = si.ParentFingerprint, si.Range
					}
					g.Close()
				}
			default:
				continue
			}
			if e.Kind != "staging" {
				if fi, err := f.Info(); err == nil {
					e.Size = fi.Size()
				}
			}
			out = append(out, e)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
}

const shardLsUsage = `Usage: meshp2p shard ls [--data-dir DIR] [--json]
       meshp2p shard rm [--data-dir DIR] FILE | MODEL[:A-B]

ls lists the shard cache (<data-dir>/shards, shared by start's split, fetch
and URL downloads): shard files with their model and layers, manifests,
vocabularies, and the staging of unfinished fetches. rm removes one cached
file, one model's shard of layers A-B, or everything cached for a model
(MODEL: a fingerprint or a prefix of at least 8 characters).
`

func runShardLs(_ context.Context, stdout, stderr io.Writer, args []string) error {
	fs := cmdFlagSet("shard ls", stdout, shardLsUsage)
	dataDir := fs.String("data-dir", defaultDataDir(), "node data directory")
	asJSON := fs.Bool("json", false, "JSON output")
	if _, err := parseInterspersed(fs, args, 0, "no arguments"); err != nil {
		return err
	}
	es, err := listCache(*dataDir)
	if err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(es)
	}
	tw := tabwriter.NewWriter(stdout, 0, 2, 2, ' ', 0)
	fmt.Fprintln(tw, "MODEL\tKIND\tLAYERS\tSIZE\tPATH")
	var total int64
	for _, e := range es {
		layers := "-"
		if e.Kind == "shard" && e.Range.Len() > 0 {
			layers = e.Range.String()
		}
		fmt.Fprintf(tw, "%.16s\t%s\t%s\t%s\t%s\n", e.Model, e.Kind, layers, humanBytes(e.Size), e.Path)
		total += e.Size
	}
	fmt.Fprintf(tw, "\t\t\t%s\ttotal\n", humanBytes(total))
	return tw.Flush()
}

func runShardRm(_ context.Context, stdout, stderr io.Writer, args []string) error {
	fs := cmdFlagSet("shard rm", stdout, shardLsUsage)
	dataDir := fs.String("data-dir", defaultDataDir(), "node data directory")
	pos, err := parseInterspersed(fs, args, 1, "one FILE or MODEL[:A-B]")
	if err != nil {
		return err
	}
	es, err := listCache(*dataDir)
	if err != nil {
		return err
	}
	target := pos[0]
	var rm []cacheEntry
	if abs, err := filepath.Abs(target); err == nil {
		for _, e := range es {
			if ea, _ := filepath.Abs(e.Path); ea == abs {
				rm = append(rm, e)
			}
		}
	}
	if len(rm) == 0 {
		model, rng, hasRange := strings.Cut(target, ":")
		if len(model) < 8 {
			return fmt.Errorf("%w: %q is not a cached file, and a model prefix needs at least 8 characters", errUsage, target)
		}
		var want gguf.Range
		if hasRange {
			rs, err := gguf.ParseRanges(rng)
			if err != nil || len(rs) != 1 {
				return fmt.Errorf("%w: bad layer range %q", errUsage, rng)
			}
			want = rs[0]
		}
		models := map[string]bool{}
		for _, e := range es {
			if !strings.HasPrefix(e.Model, model) && !strings.HasPrefix(model, e.Model) {
				continue
			}
			if hasRange && (e.Kind != "shard" || e.Range != want) {
				continue
			}
			rm = append(rm, e)
			models[filepath.Base(filepath.Dir(e.Path))] = true
		}
		if len(models) > 1 {
			return fmt.Errorf("%w: %q matches %d models; give more of the fingerprint", errUsage, model, len(models))
		}
	}
	if len(rm) == 0 {
		return fmt.Errorf("nothing in the shard cache matches %q (see meshp2p shard ls)", target)
	}
	for _, e := range rm {
		if err := os.RemoveAll(e.Path); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "removed %s (%s, %s)\n", e.Path, e.Kind, humanBytes(e.Size))
	}
	return nil
}
