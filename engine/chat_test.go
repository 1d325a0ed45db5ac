package engine

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/internal/testmodels"
)

// The chat template comes from the model (llama_chat_apply_template);
// a model without one says so instead of inventing a format.
func TestChatTemplate(t *testing.T) {
	src := testmodels.Path(t, "stories260K.gguf")
	ctx := context.Background()
	plain, err := LoadModel(ctx, src, LoadOptions{VocabOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if _, err := plain.ApplyChatTemplate([]ChatMessage{{Role: "user", Content: "hi"}}, true); !errors.Is(err, ErrNoChatTemplate) {
		t.Fatalf("model without template: %v", err)
	}

	// Same model with a ChatML template added to its metadata.
	f, err := gguf.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	md := f.Metadata.Clone()
	md.Set("tokenizer.chat_template", "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
	var tensors []gguf.WriteTensor
	for i := range f.Tensors {
		ti := &f.Tensors[i]
		tensors = append(tensors, gguf.WriteTensor{Name: ti.Name, Type: ti.Type, Shape: ti.Shape, Data: f.TensorData(ti)})
	}
	out := filepath.Join(t.TempDir(), "chat.gguf")
	err = gguf.WriteFile(ctx, out, md, tensors, nil)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	m, err := LoadModel(ctx, out, LoadOptions{VocabOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	got, err := m.ApplyChatTemplate([]ChatMessage{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Tell a story"}}, true)
	if err != nil {
		t.Fatal(err)
	}
	want := "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nTell a story<|im_end|>\n<|im_start|>assistant\n"
	if got != want {
		t.Fatalf("template output %q, want %q", got, want)
	}
	if _, err := m.ApplyChatTemplate(nil, true); err == nil || !strings.Contains(err.Error(), "no messages") {
		t.Fatalf("empty conversation: %v", err)
	}
}
