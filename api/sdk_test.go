package api

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/neuron-tai/meshp2p/internal/sdktest"
)

// sdkBackend stands in for the swarm under the SDK scripts: the text of
// text, or the calls of tools when the request forces a call (tool_choice
// required or a named function) or offers tools without a choice (Ollama's
// shape has none) and the conversation does not end in a tool result;
// ModelNotFound for any model but tiny.
type sdkBackend struct{ text, tools *scripted }

func (b *sdkBackend) Models(ctx context.Context) ([]Model, error) { return b.text.Models(ctx) }

func (b *sdkBackend) Generate(ctx context.Context, req *GenerateRequest, onDelta func(Delta)) (*GenerateResult, error) {
	if req.Model != "tiny" {
		return nil, ModelNotFound(req.Model)
	}
	n := len(req.Messages)
	forced := req.ToolChoice.Mode == ToolRequired || req.ToolChoice.Mode == ToolFunction
	offered := len(req.Tools) > 0 && req.ToolChoice.Mode == "" && n > 0 && req.Messages[n-1].Role != "tool"
	if forced || offered {
		return b.tools.Generate(ctx, req, onDelta)
	}
	return b.text.Generate(ctx, req, onDelta)
}

// The official Anthropic and Ollama SDKs (Node.js, pinned in
// api/testdata/sdk/package-lock.json) get what they expect from the API:
// text, streams, tool calls and errors, with the key each sends.
func TestOfficialSDKsAgainstScripted(t *testing.T) {
	if err := sdktest.Available(); err != nil {
		t.Skip(err) // it names sh scripts/node-deps.sh
	}
	b := &sdkBackend{text: &scripted{pieces: []string{"Hello", " from", " the", " swarm."}},
		tools: &scripted{calls: []ToolCall{{ID: "toolu_w1", Name: "get_weather", Arguments: `{"city":"Paris"}`}}}}
	srv := httptest.NewServer(New(Config{Backend: b, APIKey: "sdk-key"}))
	defer srv.Close()
	env := map[string]string{sdktest.EnvBaseURL: srv.URL, sdktest.EnvAPIKey: "sdk-key", sdktest.EnvModel: "tiny"}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const text = "Hello from the swarm."

	t.Run("anthropic", func(t *testing.T) {
		sum, err := sdktest.Run(ctx, sdktest.Anthropic, env)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			path []any
			want any
		}{
			{[]any{"create", "text"}, text},
			{[]any{"create", "stop_reason"}, "end_turn"},
			{[]any{"create", "usage", "output_tokens"}, 4.0},
			{[]any{"create", "usage", "input_tokens"}, 3.0},
			{[]any{"create", "model"}, "tiny"},
			{[]any{"stream", "text"}, text},
			{[]any{"stream", "usage", "output_tokens"}, 4.0},
			{[]any{"tools", "tool_use", "name"}, "get_weather"},
			{[]any{"tools", "tool_use", "id"}, "toolu_w1"},
			{[]any{"tools", "tool_use", "input", "city"}, "Paris"},
			{[]any{"tools", "stop_reason"}, "tool_use"},
			{[]any{"tools", "answer"}, text},
			{[]any{"stream_tools", "input", "city"}, "Paris"},
			{[]any{"stream_tools", "stop_reason"}, "tool_use"},
			{[]any{"bad_request", "status"}, 400.0},
			{[]any{"bad_request", "type"}, "invalid_request_error"},
			{[]any{"not_found", "status"}, 404.0},
			{[]any{"not_found", "type"}, "not_found_error"},
		} {
			if got := dig(sum, c.path...); got != c.want {
				t.Errorf("%v = %v, want %v", c.path, got, c.want)
			}
		}
		if msg, _ := dig(sum, "bad_request", "message").(string); !strings.Contains(msg, "top_k") {
			t.Errorf("the 400 does not name top_k: %q", msg)
		}
		// The tool result reached the backend as a tool message.
		if g := b.text.seen.Load(); len(g.Messages) != 3 || g.Messages[2].Role != "tool" || g.Messages[2].ToolCallID != "toolu_w1" ||
			g.Messages[2].Name != "get_weather" || g.Messages[1].ToolCalls[0].Arguments != `{"city":"Paris"}` {
			t.Errorf("the round trip's last request: %+v", g.Messages)
		}
		t.Logf("summary: %v", sum)
	})

	t.Run("ollama", func(t *testing.T) {
		sum, err := sdktest.Run(ctx, sdktest.Ollama, env)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			path []any
			want any
		}{
			{[]any{"chat", "text"}, text},
			{[]any{"chat", "done_reason"}, "stop"},
			{[]any{"chat", "eval_count"}, 4.0},
			{[]any{"chat", "prompt_eval_count"}, 3.0},
			{[]any{"chat", "model"}, "tiny"},
			{[]any{"chat_stream", "text"}, text},
			{[]any{"generate", "text"}, text},
			{[]any{"generate_stream", "text"}, text},
			{[]any{"list", "models", 0}, "tiny"},
			{[]any{"list", "format"}, "gguf"},
			{[]any{"show", "capabilities", 1}, "tools"},
			{[]any{"version"}, DefaultOllamaVersion},
			{[]any{"tools", "name"}, "get_weather"},
			{[]any{"tools", "arguments", "city"}, "Paris"},
			{[]any{"tools", "calls"}, 1.0},
			{[]any{"tools", "answer"}, text},
			{[]any{"stream_tools", "calls", 0, "arguments", "city"}, "Paris"},
			{[]any{"not_found", "status"}, 404.0},
		} {
			if got := dig(sum, c.path...); got != c.want {
				t.Errorf("%v = %v, want %v", c.path, got, c.want)
			}
		}
		// Text and the final line at least (the scripted pieces may
		// arrive together).
		if n, _ := dig(sum, "chat_stream", "parts").(float64); n < 2 {
			t.Errorf("the chat stream had %v lines", n)
		}
		if g := b.text.seen.Load(); g.Temperature != 0 || g.MaxTokens != 32 {
			t.Errorf("options did not reach the backend: %+v", g)
		}
		t.Logf("summary: %v", sum)
	})
}
