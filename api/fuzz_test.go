package api

import (
	"testing"
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
			if g.Model == "" || len(g.Stops) > MaxStops || g.MaxTokens < 0 || g.MaxTokens > MaxTokensLimit ||
				!(g.Temperature >= 0 && g.Temperature <= 2) || !(g.TopP >= 0 && g.TopP <= 1) || len(g.Messages) > MaxMessages ||
				(g.Messages == nil && g.Prompt == "") {
				t.Fatalf("accepted out of bounds: %+v stops %q", g, g.Stops)
			}
			for _, m := range g.Messages {
				if m.Role != "system" && m.Role != "user" && m.Role != "assistant" {
					t.Fatalf("role %q accepted", m.Role)
				}
			}
		}
	})
}
