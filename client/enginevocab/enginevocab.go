// Package enginevocab adapts the engine's model (llama.cpp, cgo) to
// client.Vocab. It is the only link between the client and the engine:
// the CLI and tests pass Load as client.Config.LoadVocab.
package enginevocab

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/neuron-tai/meshp2p/chattmpl"
	"github.com/neuron-tai/meshp2p/client"
	"github.com/neuron-tai/meshp2p/engine"
)

// Vocab is an engine model seen as a client.Vocab.
type Vocab struct{ *engine.Model }

var (
	_ client.Vocab        = Vocab{}
	_ client.GrammarVocab = Vocab{}
)

// SchemaToGrammar converts a JSON schema to GBNF (llama.cpp's converter),
// after client.CheckSchema: the converter is not written for hostile
// input.
func (Vocab) SchemaToGrammar(schema []byte) (string, error) {
	if err := client.CheckSchema(schema); err != nil {
		return "", err
	}
	return engine.SchemaToGrammar(schema)
}

// TemplateSource is the model's Jinja chat template and its BOS and EOS
// tokens' text.
func (v Vocab) TemplateSource() (src, bos, eos string) {
	bos, _ = v.TokenPiece(v.BOS(), true)
	eos, _ = v.TokenPiece(v.EOS(), true)
	return v.ChatTemplate(), bos, eos
}

// Load loads the vocabulary of the GGUF file at path (no weights).
func Load(ctx context.Context, path string) (client.Vocab, error) {
	m, err := engine.LoadModel(ctx, path, engine.LoadOptions{VocabOnly: true})
	if err != nil {
		return nil, err
	}
	return Vocab{m}, nil
}

// ApplyChatTemplate renders msgs with the model's chat template.
func (v Vocab) ApplyChatTemplate(msgs []client.Message, addAssistant bool) (string, error) {
	em := make([]engine.ChatMessage, len(msgs))
	for i, m := range msgs {
		em[i] = engine.ChatMessage{Role: m.Role, Content: m.Content} // tools go through client's Jinja renderer
	}
	s, err := v.Model.ApplyChatTemplate(em, addAssistant)
	if errors.Is(err, engine.ErrNoChatTemplate) {
		return "", fmt.Errorf("%w: %w", client.ErrNoChatTemplate, err)
	}
	return s, err
}

// LoadWithTemplate is Load for a client that gives models without a chat
// template of their own the template src (Jinja; serve --chat-template):
// chats with them render through src instead of failing with
// client.ErrNoChatTemplate. A model with its own template keeps it.
func LoadWithTemplate(src string) (client.VocabLoader, error) {
	t, err := chattmpl.Parse(src)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, path string) (client.Vocab, error) {
		v, err := Load(ctx, path)
		if err != nil {
			return nil, err
		}
		if ev := v.(Vocab); ev.ChatTemplate() == "" {
			return templated{Vocab: ev, src: src, t: t}, nil
		}
		return v, nil
	}, nil
}

// templated is a Vocab whose model has no chat template, given one.
type templated struct {
	Vocab
	src string
	t   *chattmpl.Template
}

var _ client.GrammarVocab = templated{}

// TemplateSource is the given template and the model's BOS and EOS text.
func (v templated) TemplateSource() (src, bos, eos string) {
	_, bos, eos = v.Vocab.TemplateSource()
	return v.src, bos, eos
}

// ApplyChatTemplate renders msgs with the given template.
func (v templated) ApplyChatTemplate(msgs []client.Message, addAssistant bool) (string, error) {
	_, bos, eos := v.Vocab.TemplateSource()
	cm := make([]chattmpl.Message, len(msgs))
	for i, m := range msgs {
		cm[i] = chattmpl.Message(m)
	}
	ctx, cancel := context.WithTimeout(context.Background(), client.RenderTimeout)
	defer cancel()
	return v.t.Render(ctx, chattmpl.Input{Messages: cm, AddGenerationPrompt: addAssistant, BOS: bos, EOS: eos, Now: time.Now()})
}
