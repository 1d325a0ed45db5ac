package main

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
)

// logFormat is --log-format text|json for the long-lived commands (start,
// tracker, serve): json writes one JSON object per line for log shippers.
// go-libp2p's own loggers (warnings and errors of its subsystems) follow
// their GOLOG_LOG_FORMAT=json environment variable instead.
type logFormat struct{ format string }

func (f *logFormat) register(fs *flag.FlagSet) {
	fs.StringVar(&f.format, "log-format", "text", "log format: text, or json (one JSON object per line, for log shippers; set GOLOG_LOG_FORMAT=json too for go-libp2p's own messages)")
}

// logger logs at info (debug with verbose) in the chosen format.
func (f *logFormat) logger(w io.Writer, verbose bool) (*slog.Logger, error) {
	level := slog.LevelInfo
	if verbose {
		level = slog.LevelDebug
	}
	opts := &slog.HandlerOptions{Level: level}
	switch f.format {
	case "", "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("%w: --log-format %q: want text or json", errUsage, f.format)
}
