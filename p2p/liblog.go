package p2p

import (
	"context"
	"log/slog"
)

// Library logs. gossipsub logs through the logger it is given, at its own
// levels: routine events ("pubsub processloop shutting down" on every
// close) at info, and a stream of per-message and per-peer lines at debug.
// Those are a library's internals, not the swarm's story, so its records
// go out four levels lower (slog's step): its info lines show with -v (as
// debug), its debug lines not at all.
const libLevelShift = 4

// demoted is a slog handler that lowers every record by shift levels.
type demoted struct {
	h     slog.Handler
	shift slog.Level
}

func demote(l *slog.Logger, shift slog.Level) *slog.Logger {
	return slog.New(demoted{h: l.Handler(), shift: shift})
}

func (d demoted) Enabled(ctx context.Context, lv slog.Level) bool {
	return d.h.Enabled(ctx, lv-d.shift)
}

func (d demoted) Handle(ctx context.Context, r slog.Record) error {
	r.Level -= d.shift
	return d.h.Handle(ctx, r)
}

func (d demoted) WithAttrs(as []slog.Attr) slog.Handler {
	return demoted{h: d.h.WithAttrs(as), shift: d.shift}
}

func (d demoted) WithGroup(name string) slog.Handler {
	return demoted{h: d.h.WithGroup(name), shift: d.shift}
}
