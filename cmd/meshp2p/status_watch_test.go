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
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	var out, errb syncBuf
	if err := runStatus(ctx, &out, &errb, append([]string{"--bootstrap", boot, "--watch", "300ms", "--wait", "2s"}, net...)); err != nil {
		t.Fatalf("status --watch: %v\n%s", err, errb.String())
	}
	s := out.String()
	if n := strings.Count(s, "\x1b[H\x1b[2J"); n < 3 || strings.Count(s, "stories260K (llama, 5 layers)") != n || !strings.Contains(s, "coverage  11111") {
		t.Fatalf("%d redraws:\n%s", n, s)
	}
	// --json --watch prints one document per refresh.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel2()
	var js syncBuf
	if err := runStatus(ctx2, &js, &errb, append([]string{"--bootstrap", boot, "--watch", "300ms", "--json", "--wait", "2s"}, net...)); err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(strings.NewReader(js.String()))
	docs := 0
	for dec.More() {
		var d map[string]any
		if err := dec.Decode(&d); err != nil {
			t.Fatal(err)
		}
		docs++
	}
	if docs < 2 {
		t.Fatalf("%d documents", docs)
	}
}
