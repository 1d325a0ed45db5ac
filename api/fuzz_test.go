package api

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// Request bodies come from anyone who reaches the API: parsing never
// panics, and what it accepts respects the documented bounds.
func FuzzParseRequest(f *testing.F) {
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"stop":["a","b"],"max_tokens":5,"seed":-3}`))
	f.Add([]byte(`{"model":"m","prompt":["x"],"stream":true,"stream_options":{"include_usage":true},"temperature":0}`))
	f.Add([]byte(`{"model":"m","messages":[{"role":"assistant","refusal":null}],"n":1,"logprobs":false}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, parse := range []func([]byte) (*request, *Error){parseChat, parseCompletion} {
			r, e := parse(body)
			if (r == nil) == (e == nil) {
				t.Fatalf("request %v, error %v", r, e)
			}
			if e != nil {
				if e.Status != 400 || e.Message == "" {
					t.Fatalf("error %+v", e)
				}
				continue
			}
			g := r.gen
			if g.Model == "" || len(r.stops) > MaxStops || g.MaxTokens < 0 || g.MaxTokens > MaxTokensLimit ||
				!(g.Temperature >= 0 && g.Temperature <= 2) || !(g.TopP >= 0 && g.TopP <= 1) || len(g.Messages) > MaxMessages ||
				(g.Messages == nil && g.Prompt == "") {
				t.Fatalf("accepted out of bounds: %+v stops %q", g, r.stops)
			}
			for _, m := range g.Messages {
				if m.Role != "system" && m.Role != "user" && m.Role != "assistant" {
					t.Fatalf("role %q accepted", m.Role)
				}
			}
		}
	})
}

// Whatever the pieces and stop strings, the released text is a prefix of
// the final text, never holds a stop string, and only ends inside a UTF-8
// character when the pieces themselves were not valid UTF-8.
func FuzzTextStream(f *testing.F) {
	f.Add("ab|c\xe2|\x82\xac|END|x", "END")
	f.Add("h|e|l|l|o", "ll")
	f.Fuzz(func(t *testing.T, pieces, stop string) {
		var stops []string
		if stop != "" && len(stop) <= MaxStopBytes {
			stops = []string{stop}
		}
		ts := textStream{stops: stops}
		released := ""
		for _, p := range strings.Split(pieces, "|") {
			stopped := ts.add(p)
			d := ts.next(false)
			if utf8.ValidString(pieces) && !utf8.ValidString(d) && !stopped {
				t.Fatalf("delta %q splits a character", d)
			}
			released += d
			if stopped {
				break
			}
		}
		released += ts.next(true)
		if released != ts.text() {
			t.Fatalf("released %q, text %q", released, ts.text())
		}
		if stop != "" && len(stops) > 0 && strings.Contains(released, stop) {
			t.Fatalf("stop %q emitted in %q", stop, released)
		}
	})
}
