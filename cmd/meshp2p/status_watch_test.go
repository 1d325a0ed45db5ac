package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/neuron-tai/meshp2p/internal/testmodels"
)

// status --watch redraws the view until interrupted and then exits
// cleanly.
func TestStatusWatch(t *testing.T) {
	model := testmodels.Path(t, "stories260K.gguf")
	dir := t.TempDir()
	net := []string{"--network", "watchtest", "--listen", "/ip4/127.0.0.1/tcp/0"}
	boot, _ := startNode(t, filepath.Join(dir, "a"), append([]string{"--model", model, "--layers", "0-5"}, net...)...)
	var errb syncBuf
	// Each watch runs until it has drawn what the test reads (a fixed
	// window of a few seconds was too short for a busy machine's start).
	watch := func(out *syncBuf, enough func(string) bool, args ...string) error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		go func() {
			for ctx.Err() == nil && !enough(out.String()) {
				time.Sleep(50 * time.Millisecond)
			}
			cancel()
		}()
		return runStatus(ctx, out, &errb, append(append([]string{"--bootstrap", boot, "--watch", "300ms", "--wait", "5s"}, args...), net...))
	}
	const clear = "\x1b[H\x1b[2J"
	var out syncBuf
	if err := watch(&out, func(s string) bool { return strings.Count(s, clear) >= 4 }); err != nil {
		t.Fatalf("status --watch: %v\n%s", err, errb.String())
	}
	// The last redraw may be cut by the cancel: count the complete ones.
	s := out.String()
	s = s[:strings.LastIndex(s, clear)]
	if n := strings.Count(s, clear); n < 3 || strings.Count(s, "stories260K (llama, 5 layers)") != n || !strings.Contains(s, "coverage  11111") {
		t.Fatalf("%d redraws:\n%s", n, s)
	}
	// --json --watch prints one document per refresh.
	docsIn := func(s string) int {
		dec := json.NewDecoder(strings.NewReader(s))
		n := 0
		for dec.More() {
			var d map[string]any
			if dec.Decode(&d) != nil {
				break
			}
			n++
		}
		return n
	}
	var js syncBuf
	if err := watch(&js, func(s string) bool { return docsIn(s) >= 2 }, "--json"); err != nil {
		t.Fatal(err)
	}
	docs := docsIn(js.String())
	if docs < 2 {
		t.Fatalf("%d documents", docs)
	}
}
