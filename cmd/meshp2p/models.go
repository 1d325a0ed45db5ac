package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// expandModels reads start's --model when it names several models: a
// comma-separated list of whole GGUF files, or a directory (its *.gguf
// files, sorted by name). One model (a file, URL, name or fingerprint)
// comes back as it is; so does an existing file whose name has a comma.
// Every file of a list must exist.
func expandModels(spec string) ([]string, error) {
	if st, err := os.Stat(spec); err == nil && !st.IsDir() {
		return []string{spec}, nil
	}
	parts := strings.Split(spec, ",")
	if len(parts) == 1 {
		st, err := os.Stat(spec)
		if err != nil || !st.IsDir() {
			return []string{spec}, nil
		}
	}
	var out []string
	for _, p := range parts {
		p = strings.TrimSpace(p)
		if p == "" {
			return nil, fmt.Errorf("%w: --model %q: an empty entry in the list", errUsage, spec)
		}
		st, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("%w: --model %q: %s: no such file (a list of models names local whole GGUF files or directories)", errUsage, spec, p)
		}
		if !st.IsDir() {
			out = append(out, p)
			continue
		}
		files, err := filepath.Glob(filepath.Join(p, "*.gguf"))
		if err != nil {
			return nil, err
		}
		if len(files) == 0 {
			return nil, fmt.Errorf("%w: --model %s: the directory holds no .gguf file", errUsage, p)
		}
		sort.Strings(files)
		out = append(out, files...)
	}
	return out, nil
}
