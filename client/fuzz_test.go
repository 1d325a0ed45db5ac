package client

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// Whatever the pieces and stop strings, the released text is a prefix of
// the final text, never holds a stop string, and only ends inside a UTF-8
// character when the pieces themselves were not valid UTF-8.
func FuzzText(f *testing.F) {
	f.Add("ab|c\xe2|\x82\xac|END|x", "END")
	f.Add("h|e|l|l|o", "ll")
	f.Fuzz(func(t *testing.T, pieces, stop string) {
		var stops []string
		if stop != "" && len(stop) <= 256 {
			stops = []string{stop}
		}
		ts := NewText(stops)
		released := ""
		for _, p := range strings.Split(pieces, "|") {
			stopped := ts.Add(p)
			d := ts.Next(false)
			if utf8.ValidString(pieces) && !utf8.ValidString(d) && !stopped {
				t.Fatalf("delta %q splits a character", d)
			}
			released += d
			if stopped {
				break
			}
		}
		released += ts.Next(true)
		if released != ts.String() {
			t.Fatalf("released %q, text %q", released, ts.String())
		}
		if stop != "" && len(stops) > 0 && strings.Contains(released, stop) {
			t.Fatalf("stop %q emitted in %q", stop, released)
		}
	})
}
