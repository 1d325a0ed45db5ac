package main

import (
	"strings"
	"testing"
	"time"
)

// The split/synth progress lines carry the rate and the time left once a
// second of work gives a rate, and the time taken at the end.
func TestProgressRateAndETA(t *testing.T) {
	const total = 1000 << 20
	var clock time.Time
	var b strings.Builder
	p := newProgress(&b, "split m.gguf")
	p.now = func() time.Time { return clock }
	clock = time.Unix(1000, 0)
	for _, step := range []struct {
		at   time.Duration
		done int64
		want string // "" : no line
	}{
		{0, 1 << 20, ""}, // lines from 10%
		{500 * time.Millisecond, 110 << 20, "split m.gguf 11% (110.0 MiB / 1000.0 MiB)\n"}, // no rate before a second
		{2 * time.Second, 200 << 20, "split m.gguf 20% (200.0 MiB / 1000.0 MiB, 100.0 MiB/s, 8s left)\n"},
		{10 * time.Second, total, "split m.gguf 100% (1000.0 MiB / 1000.0 MiB, 100.0 MiB/s, took 10s)\n"},
	} {
		b.Reset()
		clock = time.Unix(1000, 0).Add(step.at)
		p.update(step.done, total)
		if b.String() != step.want {
			t.Fatalf("at %v, %d done: %q, want %q", step.at, step.done, b.String(), step.want)
		}
	}
}
