package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/fetch"
	"github.com/neuron-tai/meshp2p/node"
)

// fetchFlags are start's flags for fetching only a node's layers.
type fetchFlags struct {
	uploadLimit string
	perPeer     string
	wait        time.Duration
}

func (f *fetchFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.uploadLimit, "upload-limit", "0", "bytes per second this node sends to peers fetching tensors from it, over all of them (e.g. 5M, 500K; 0: unlimited)")
	fs.StringVar(&f.perPeer, "upload-limit-per-peer", "0", "bytes per second each peer fetching tensors from this node gets (0: unlimited)")
	fs.DurationVar(&f.wait, "fetch-wait", node.DefaultFetchWait, "with --model NAME|FINGERPRINT: how long to wait for peers that serve the model")
}

// apply decides how --model is served: a local file as before; a URL, or a
// model name or fingerprint with no such file, is fetched (only the
// tensors of --layers).
func (f *fetchFlags) apply(cfg *node.Config, model string, layers *gguf.Range, stderr io.Writer) error {
	limit, err := parseByteRate(f.uploadLimit)
	if err != nil {
		return fmt.Errorf("%w: --upload-limit %q: %v", errUsage, f.uploadLimit, err)
	}
	cfg.UploadLimit = limit
	if cfg.UploadLimitPerPeer, err = parseByteRate(f.perPeer); err != nil {
		return fmt.Errorf("%w: --upload-limit-per-peer %q: %v", errUsage, f.perPeer, err)
	}
	isURL := node.IsURL(model)
	if !isURL {
		if _, err := os.Stat(model); err == nil {
			return nil // a local model or shard file
		}
		if strings.Contains(model, string(os.PathSeparator)) || strings.HasSuffix(model, ".gguf") {
			return fmt.Errorf("--model %s: no such file (give a model file, a URL, or a model name or fingerprint to fetch from peers)", model)
		}
	}
	if layers == nil && cfg.Placement == nil {
		return fmt.Errorf("%w: --model %s is fetched (no local file): give the layers to fetch with --layers A-B, or --memory to have them chosen", errUsage, model)
	}
	var mu sync.Mutex
	fh, ok := stderr.(*os.File)
	tty := ok && isTerminal(fh)
	cfg.ModelPath = ""
	cfg.Fetch = &node.FetchConfig{Model: model, Wait: f.wait, Progress: func(done, total int64, rate float64, eta time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		line := fetch.Line("fetching", done, total, rate, eta)
		if tty {
			fmt.Fprintf(stderr, "\r%s", line)
			if done >= total {
				fmt.Fprintln(stderr)
			}
			return
		}
		fmt.Fprintln(stderr, line)
	}}
	return nil
}

// parseByteRate parses "5M", "500K", "1G", "1024" (bytes; K = 1024).
func parseByteRate(s string) (int64, error) {
	s = strings.TrimSuffix(strings.TrimSpace(s), "B")
	mult := int64(1)
	if s != "" {
		switch s[len(s)-1] {
		case 'K', 'k':
			mult = 1 << 10
		case 'M', 'm':
			mult = 1 << 20
		case 'G', 'g':
			mult = 1 << 30
		}
		if mult > 1 {
			s = s[:len(s)-1]
		}
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || v < 0 || v*float64(mult) > 1<<50 {
		return 0, fmt.Errorf("want a byte rate such as 5M or 500K")
	}
	return int64(v * float64(mult)), nil
}
