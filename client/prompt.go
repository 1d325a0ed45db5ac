package client

import (
	"context"
	"errors"
	"fmt"

	"github.com/neuron-tai/meshp2p/toolcall"
)

// Message is one chat turn: system, user, assistant (Content and/or
// ToolCalls) or tool (the result of the call ToolCallID, in Content).
type Message struct {
	Role       string
	Content    string
	ToolCalls  []ToolCall
	ToolCallID string
	Name       string
}

// Prompt is what a generation starts from: plain text (tokenized as is,
// BOS added) or, with Messages set, a chat rendered with the model's own
// chat template (special tokens in the rendering parsed as such, the
// assistant turn opened).
type Prompt struct {
	Text     string
	Messages []Message
	// Tools are shown to the model through its chat template (rendered by
	// chattmpl, the Jinja renderer, whenever tools, tool calls or tool
	// results are in the chat).
	Tools []Tool
}

// UserPrompt is text as the single user message of a chat (`generate
// --chat`).
func UserPrompt(text string) Prompt {
	return Prompt{Messages: []Message{{Role: "user", Content: text}}}
}

// Tokens renders and tokenizes p with v. Errors: ErrNoChatTemplate,
// ErrChatTemplate, ErrEmptyPrompt.
func (p Prompt) Tokens(v Vocab) ([]int32, error) {
	toks, _, err := p.render(context.Background(), v)
	return toks, err
}

// render is Tokens, also telling the tool-call syntax the rendering
// expects (toolcall.Generic when no tools are in play).
func (p Prompt) render(ctx context.Context, v Vocab) ([]int32, toolcall.Format, error) {
	var toks []int32
	var err error
	f := toolcall.Generic
	if p.Messages == nil {
		toks, err = v.Tokenize(p.Text, true, false)
	} else if p.needsJinja() {
		var text string
		var addBOS bool
		text, f, addBOS, err = renderTools(ctx, v, p)
		if err != nil {
			return nil, f, err
		}
		// A BOS the template wrote is parsed as the special token.
		toks, err = v.Tokenize(text, addBOS, true)
	} else {
		var text string
		text, err = v.ApplyChatTemplate(p.Messages, true)
		switch {
		case errors.Is(err, ErrNoChatTemplate):
			return nil, f, err
		case err != nil:
			return nil, f, fmt.Errorf("%w: %w", ErrChatTemplate, err)
		}
		toks, err = v.Tokenize(text, true, true)
	}
	if err != nil {
		return nil, f, fmt.Errorf("tokenize the prompt: %w", err)
	}
	if len(toks) == 0 {
		return nil, f, ErrEmptyPrompt
	}
	return toks, f, nil
}
