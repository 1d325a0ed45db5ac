package client

import "testing"

// The suggestion for a model nobody serves is the served name a typo away
// from it, and none when every name is far.
func TestNearestName(t *testing.T) {
	served := []string{"llama-3.1-8b-instruct", "qwen3-8b-q4_k_m", "stories260K"}
	for _, tc := range []struct{ want, near string }{
		{"storie260k", "stories260K"},
		{"STORIES260K", "stories260K"},
		{"stories", "stories260K"},
		{"qwen3-8b", "qwen3-8b-q4_k_m"},
		{"lama-3.1-8b-instruct", "llama-3.1-8b-instruct"},
		{"mistral-7b", ""},
		{"gpt-4", ""},
		{"x", ""},
	} {
		if got := nearestName(tc.want, served); got != tc.near {
			t.Errorf("nearestName(%q) = %q, want %q", tc.want, got, tc.near)
		}
	}
	if d := editDistance("kitten", "sitting"); d != 3 {
		t.Errorf("editDistance(kitten, sitting) = %d, want 3", d)
	}
}
