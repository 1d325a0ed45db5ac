package client

import (
	"strings"
	"unicode/utf8"
)

// Text assembles token pieces into the text a user sees. Text is released
// only up to a point where it can no longer change: never inside a UTF-8
// character, never while its end could be the start of a stop string. A
// stop string is found across token boundaries and is never emitted; the
// text ends where it begins. The zero value has no stop strings; a Text is
// not safe for concurrent use.
type Text struct {
	stops    []string
	buf      strings.Builder
	released int // bytes handed out by next
	scanned  int // bytes already searched for complete stop strings
	stopped  bool
	stopStr  string // the stop string that ended the text
}

// NewText returns a Text that ends at the first of stops.
func NewText(stops []string) *Text { return &Text{stops: stops} }

// Add appends a token's piece; it reports whether a stop string appeared
// (then and afterwards: nothing more is added).
func (t *Text) Add(piece string) bool {
	if t.stopped {
		return true
	}
	t.buf.WriteString(piece)
	s := t.buf.String()
	cut := -1
	for _, st := range t.stops {
		from := max(0, t.scanned-len(st)+1)
		if i := strings.Index(s[from:], st); i >= 0 && (cut < 0 || from+i < cut) {
			cut, t.stopStr = from+i, st
		}
	}
	t.scanned = len(s)
	if cut >= 0 {
		t.buf.Reset()
		t.buf.WriteString(s[:cut])
		t.stopped = true
	}
	return t.stopped
}

// Next returns the text that became final since the last call. With end,
// everything left is final (the generation is over).
func (t *Text) Next(end bool) string {
	s := t.buf.String()
	safe := len(s)
	if !end && !t.stopped {
		// Hold back what could still grow into a stop string.
		for _, st := range t.stops {
			for k := min(len(st)-1, len(s)); k > 0; k-- {
				if strings.HasSuffix(s, st[:k]) {
					safe = min(safe, len(s)-k)
					break
				}
			}
		}
		// Hold back an incomplete UTF-8 character.
		for k := 1; k <= min(utf8.UTFMax-1, safe); k++ {
			if b := s[safe-k]; b&0xC0 != 0x80 { // the start of the last character
				if !utf8.FullRuneInString(s[safe-k : safe]) {
					safe -= k
				}
				break
			}
		}
	}
	if safe <= t.released {
		return ""
	}
	out := s[t.released:safe]
	t.released = safe
	return out
}

// String is everything assembled so far (up to a stop string).
func (t *Text) String() string { return t.buf.String() }

// Stopped reports whether a stop string appeared.
func (t *Text) Stopped() bool { return t.stopped }

// Stop is the stop string that ended the text ("" when none did; the
// first in the text, the earlier-listed on a tie at one position).
func (t *Text) Stop() string {
	if !t.stopped {
		return ""
	}
	return t.stopStr
}
