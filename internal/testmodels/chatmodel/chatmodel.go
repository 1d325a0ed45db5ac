// Package chatmodel makes test models with a chat template (the shared
// fixtures have none). It is apart from testmodels, which engine/gguf's own
// tests import.
package chatmodel

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/internal/testmodels"
)

// ChatStories writes stories260K with a ChatML chat template added to its
// metadata (the fixture has none) as stories-chat.gguf in a temporary
// directory, for tests of chat templating (the OpenAI-compatible API).
func ChatStories(t testing.TB) string {
	t.Helper()
	return WithTemplate(t, "stories-chat", "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
}

// WithTemplate writes stories260K with tmpl as its chat template, as
// name.gguf in a temporary directory (e.g. a published tool-calling
// template, for the agent API's tests: the model does not know it, but
// grammar-forced calls and round trips go through it).
func WithTemplate(t testing.TB, name, tmpl string) string {
	t.Helper()
	ctx := context.Background()
	f, err := gguf.Open(testmodels.Path(t, "stories260K.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	md := f.Metadata.Clone()
	md.Set("tokenizer.chat_template", tmpl)
	var tensors []gguf.WriteTensor
	for i := range f.Tensors {
		ti := &f.Tensors[i]
		tensors = append(tensors, gguf.WriteTensor{Name: ti.Name, Type: ti.Type, Shape: ti.Shape, Data: f.TensorData(ti)})
	}
	out := filepath.Join(t.TempDir(), name+".gguf")
	if err := gguf.WriteFile(ctx, out, md, tensors, nil); err != nil {
		t.Fatal(err)
	}
	return out
}
