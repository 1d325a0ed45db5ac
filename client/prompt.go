package client

import (
	"errors"
	"fmt"
)

// Message is one chat turn.
type Message struct {
	Role    string // system, user, assistant
	Content string
}

// Prompt is what a generation starts from: plain text (tokenized as is,
// BOS added) or, with Messages set, a chat rendered with the model's own
// chat template (special tokens in the rendering parsed as such, the
// assistant turn opened).
type Prompt struct {
	Text     string
	Messages []Message
}

// UserPrompt is text as the single user message of a chat (`generate
// --chat`).
func UserPrompt(text string) Prompt {
	return Prompt{Messages: []Message{{Role: "user", Content: text}}}
}

// Tokens renders and tokenizes p with v. Errors: ErrNoChatTemplate,
// ErrChatTemplate, ErrEmptyPrompt.
func (p Prompt) Tokens(v Vocab) ([]int32, error) {
	var toks []int32
	var err error
	if p.Messages == nil {
		toks, err = v.Tokenize(p.Text, true, false)
	} else {
		var text string
		text, err = v.ApplyChatTemplate(p.Messages, true)
		switch {
		case errors.Is(err, ErrNoChatTemplate):
			return nil, err
		case err != nil:
			return nil, fmt.Errorf("%w: %w", ErrChatTemplate, err)
		}
		toks, err = v.Tokenize(text, true, true)
	}
	if err != nil {
		return nil, fmt.Errorf("tokenize the prompt: %w", err)
	}
	if len(toks) == 0 {
		return nil, ErrEmptyPrompt
	}
	return toks, nil
}
