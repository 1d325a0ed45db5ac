package p2p

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// A library's records go out four levels lower: its info at debug (shown
// with -v), its debug not even then, its warnings at info.
func TestDemotedLibraryLogs(t *testing.T) {
	cases := []struct {
		name   string
		level  slog.Level // the handler's
		logged func(*slog.Logger)
		want   string // "" for nothing
	}{
		{"info hidden by default", slog.LevelInfo, func(l *slog.Logger) { l.Info("processloop shutting down") }, ""},
		{"info as debug with -v", slog.LevelDebug, func(l *slog.Logger) { l.Info("processloop shutting down") }, "level=DEBUG"},
		{"debug hidden with -v", slog.LevelDebug, func(l *slog.Logger) { l.Debug("per-message detail") }, ""},
		{"warn as info", slog.LevelInfo, func(l *slog.Logger) { l.Warn("something odd") }, "level=INFO"},
		{"attrs kept", slog.LevelInfo, func(l *slog.Logger) { l.With("peer", "x").Error("bad") }, "peer=x"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			l := demote(slog.New(slog.NewTextHandler(&b, &slog.HandlerOptions{Level: tc.level})), libLevelShift)
			tc.logged(l)
			if got := b.String(); (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Fatalf("logged %q, want a line with %q", got, tc.want)
			}
		})
	}
}
