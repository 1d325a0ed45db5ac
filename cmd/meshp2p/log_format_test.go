package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// --log-format json: every log line of a long-lived command is one JSON
// object; an unknown format is a usage error.
func TestLogFormatJSON(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	var logs syncBuf
	done := make(chan error, 1)
	go func() {
		done <- runTracker(ctx, &syncBuf{}, &logs, []string{"--network", "logfmt", "--listen", "/ip4/127.0.0.1/tcp/0", "--data-dir", dir, "--log-format", "json"})
	}()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(filepath.Join(dir, "node.json")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("tracker not ready:\n%s", logs.String())
		}
	}
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) < 2 {
		t.Fatalf("log: %q", logs.String())
	}
	for _, l := range lines {
		var rec map[string]any
		if err := json.Unmarshal([]byte(l), &rec); err != nil || rec["msg"] == nil || rec["level"] == nil {
			t.Fatalf("not a JSON log record: %q (%v)", l, err)
		}
	}
	err := runTracker(context.Background(), &syncBuf{}, &syncBuf{}, []string{"--data-dir", t.TempDir(), "--log-format", "xml"})
	if !errors.Is(err, errUsage) {
		t.Fatalf("--log-format xml: %v", err)
	}
}
