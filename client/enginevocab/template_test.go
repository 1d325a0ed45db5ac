package enginevocab

import (
	"context"
	"errors"
	"testing"

	"github.com/neuron-tai/meshp2p/chattmpl"
	"github.com/neuron-tai/meshp2p/client"
	"github.com/neuron-tai/meshp2p/internal/testmodels"
	"github.com/neuron-tai/meshp2p/internal/testmodels/chatmodel"
)

// serve --chat-template: a model without a chat template renders chats
// with the one given (ChatML here); one with its own keeps its own.
func TestLoadWithTemplate(t *testing.T) {
	ctx := context.Background()
	bare := testmodels.Path(t, "stories260K.gguf")
	msgs := []client.Message{{Role: "user", Content: "Hi"}}
	plain, err := Load(ctx, bare)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if _, err := plain.ApplyChatTemplate(msgs, true); !errors.Is(err, client.ErrNoChatTemplate) {
		t.Fatalf("no template: %v, want ErrNoChatTemplate", err)
	}
	load, err := LoadWithTemplate(chattmpl.ChatML)
	if err != nil {
		t.Fatal(err)
	}
	v, err := load(ctx, bare)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	got, err := v.ApplyChatTemplate(msgs, true)
	if want := "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"; err != nil || got != want {
		t.Fatalf("given ChatML: %q, %v; want %q", got, err, want)
	}
	if src, _, _ := v.(client.GrammarVocab).TemplateSource(); src != chattmpl.ChatML {
		t.Fatalf("template source %q", src)
	}
	if p, err := (client.Prompt{Messages: msgs}).Tokens(v); err != nil || len(p) == 0 {
		t.Fatalf("chat prompt: %v, %d tokens", err, len(p))
	}
	other, err := LoadWithTemplate("{{ messages[0]['content'] }}")
	if err != nil {
		t.Fatal(err)
	}
	own, err := other(ctx, chatmodel.ChatStories(t))
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	if got, err := own.ApplyChatTemplate(msgs, true); err != nil || got != "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n" {
		t.Fatalf("a model's own template was replaced: %q, %v", got, err)
	}
	if _, err := LoadWithTemplate("{% for %}"); err == nil {
		t.Fatal("a template that does not parse was accepted")
	}
}
