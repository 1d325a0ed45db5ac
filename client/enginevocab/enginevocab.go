// Package enginevocab adapts the engine's model (llama.cpp, cgo) to
// client.Vocab. It is the only link between the client and the engine:
// the CLI and tests pass Load as client.Config.LoadVocab.
package enginevocab

import (
	"context"
	"errors"
	"fmt"

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
