package client

import "time"

// Finish reasons: why a generation ended.
const (
	FinishStop   = "stop"       // a stop string appeared
	FinishEOS    = "eos"        // the model's end-of-generation token
	FinishLength = "max_tokens" // max_tokens reached
)

// Stream turns one generation's tokens into text: each token's piece
// (nothing for end-of-generation tokens) through a Text, the text that
// became final handed to onText after every token. Generate uses one; so
// does `generate --local`, which runs the engine in-process.
type Stream struct {
	v      Vocab
	text   *Text
	onText func(delta string)
	toks   []int32
	first  time.Time
	// special renders control tokens' text too (a tool-call marker that
	// is one, e.g. Mistral's [TOOL_CALLS]).
	special bool
}

// NewStream returns a stream that ends at the first of stops; onText
// (nil: none) gets the final text after every token ("" when nothing
// became final) and the rest at End.
func NewStream(v Vocab, stops []string, onText func(delta string)) *Stream {
	if onText == nil {
		onText = func(string) {}
	}
	return &Stream{v: v, text: NewText(stops), onText: onText}
}

// Token records tok; it reports whether a stop string appeared (the
// generation should stop).
func (s *Stream) Token(tok int32) bool {
	if s.first.IsZero() {
		s.first = time.Now()
	}
	s.toks = append(s.toks, tok)
	if s.text.Stopped() {
		return true
	}
	if !s.v.IsEOG(tok) {
		if piece, err := s.v.TokenPiece(tok, s.special); err == nil {
			s.text.Add(piece)
		}
	}
	s.onText(s.text.Next(false))
	return s.text.Stopped()
}

// End hands out the text held back (an incomplete UTF-8 character, the
// start of a stop string that never completed).
func (s *Stream) End() {
	if d := s.text.Next(true); d != "" {
		s.onText(d)
	}
}

// Text is the generation's text (up to a stop string).
func (s *Stream) Text() string { return s.text.String() }

// Stop is the stop string that ended the text ("" when none did).
func (s *Stream) Stop() string { return s.text.Stop() }

// Stopped reports whether a stop string ended the text.
func (s *Stream) Stopped() bool { return s.text.Stopped() }

// Tokens are the tokens recorded.
func (s *Stream) Tokens() []int32 { return s.toks }

// FirstToken is when the first token arrived (zero: none yet).
func (s *Stream) FirstToken() time.Time { return s.first }

// Finish is why the generation ended, given its max_tokens.
func (s *Stream) Finish(maxTokens int) string {
	switch {
	case s.text.Stopped():
		return FinishStop
	case len(s.toks) > 0 && s.v.IsEOG(s.toks[len(s.toks)-1]):
		return FinishEOS
	case len(s.toks) >= maxTokens:
		return FinishLength
	}
	return FinishStop
}
