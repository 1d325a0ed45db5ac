package client

import "testing"

// Text releases only what can no longer change: never inside a UTF-8
// character, never a possible start of a stop string; a stop string split
// over pieces is found and never released.
func TestTextStream(t *testing.T) {
	cases := []struct {
		pieces  []string
		stops   []string
		emitted []string // what next(false) returns after each piece
		final   string
		stop    string // the stop string that ended it
	}{
		{[]string{"ab", "c"}, nil, []string{"ab", "c"}, "abc", ""},
		{[]string{"he", "ll", "o"}, []string{"llo"}, []string{"he", "", ""}, "he", "llo"},
		{[]string{"x<", "/", "s>y"}, []string{"</s>"}, []string{"x", "", ""}, "x", "</s>"},
		{[]string{"a<", "b"}, []string{"</s>"}, []string{"a", "<b"}, "a<b", ""},
		{[]string{"\xe2", "\x82", "\xac!"}, nil, []string{"", "", "€!"}, "€!", ""},
		{[]string{"ok", "STOP", "more"}, []string{"STOP", "OK"}, []string{"ok", "", ""}, "ok", "STOP"},
		{[]string{"aXYb"}, []string{"YB", "XY", "X"}, []string{"a"}, "a", "XY"},
	}
	for i, tc := range cases {
		ts := NewText(tc.stops)
		for j, p := range tc.pieces {
			ts.Add(p)
			if got := ts.Next(false); got != tc.emitted[j] {
				t.Fatalf("case %d piece %d: emitted %q, want %q", i, j, got, tc.emitted[j])
			}
		}
		ts.Next(true)
		if ts.String() != tc.final || ts.Stop() != tc.stop {
			t.Fatalf("case %d: text %q stop %q, want %q and %q", i, ts.String(), ts.Stop(), tc.final, tc.stop)
		}
	}
}
