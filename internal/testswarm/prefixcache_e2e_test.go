package testswarm_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/neuron-tai/meshp2p/api"
	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/internal/testmodels/chatmodel"
	"github.com/neuron-tai/meshp2p/internal/testswarm"
	"github.com/neuron-tai/meshp2p/node"
)

// A chat conversation through a gateway on a 3-node swarm with prefix
// caches: the second turn (OpenAI's SDK) and the third (Anthropic's
// Messages) report the prompt tokens every hop reused — OpenAI's
// usage.prompt_tokens_details.cached_tokens, Anthropic's
// cache_read_input_tokens — and answer exactly what a gateway that never
// saw the conversation (another origin: nothing to reuse) answers.
// (A gateway's users share its origin identity, hence its cache scope.)
func TestGatewayPrefixCache(t *testing.T) {
	model := chatmodel.ChatStories(t)
	tn := testswarm.New(t)
	for _, r := range gguf.EvenSplit(5, 3) {
		tn.Shard(model, &r, func(c *node.Config) { c.Engine.NCtx, c.Engine.PrefixCacheCells = 1024, 1024 })
	}
	gateway := func() (*openai.Client, string) {
		c := tn.Client()
		waitModel(t, c, "stories-chat")
		srv := httptest.NewServer(api.New(api.Config{Backend: api.NewSwarm(c, api.SwarmConfig{})}))
		t.Cleanup(srv.Close)
		cl := openai.NewClient(option.WithBaseURL(srv.URL+"/v1/"), option.WithMaxRetries(0))
		return &cl, srv.URL
	}
	talk, talkURL := gateway()
	fresh, _ := gateway()
	ctx := context.Background()
	msgs := []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Tell me a story about a cat and a dog who played in the park all day")}
	chat := func(c *openai.Client) *openai.ChatCompletion {
		t.Helper()
		resp, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "stories-chat", Messages: msgs, MaxTokens: openai.Int(48), Temperature: openai.Float(0)})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	if r := chat(talk); r.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Fatalf("first turn: %d cached tokens", r.Usage.PromptTokensDetails.CachedTokens)
	} else {
		msgs = append(msgs, openai.AssistantMessage(r.Choices[0].Message.Content), openai.UserMessage("What happened next?"))
	}
	got, want := chat(talk), chat(fresh)
	cached := got.Usage.PromptTokensDetails.CachedTokens
	t.Logf("second turn: %d prompt tokens, %d cached", got.Usage.PromptTokens, cached)
	if cached == 0 || cached >= got.Usage.PromptTokens || want.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Fatalf("second turn: %d of %d prompt tokens cached; another gateway's %d", cached, got.Usage.PromptTokens, want.Usage.PromptTokensDetails.CachedTokens)
	}
	if got.Choices[0].Message.Content != want.Choices[0].Message.Content {
		t.Fatalf("with the cache %q, without %q", got.Choices[0].Message.Content, want.Choices[0].Message.Content)
	}

	// The third turn in Anthropic's shape, on the same gateway.
	type anthropicReply struct {
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
		Usage struct {
			InputTokens          int `json:"input_tokens"`
			CacheReadInputTokens int `json:"cache_read_input_tokens"`
		} `json:"usage"`
	}
	turns := []map[string]string{{"role": "user", "content": "Tell me a story about a cat and a dog who played in the park all day"},
		{"role": "assistant", "content": msgs[1].OfAssistant.Content.OfString.Value}, {"role": "user", "content": "What happened next?"},
		{"role": "assistant", "content": got.Choices[0].Message.Content}, {"role": "user", "content": "And then?"}}
	messages := func(url string) anthropicReply {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"model": "stories-chat", "max_tokens": 32, "temperature": 0, "messages": turns})
		resp, err := http.Post(url+"/v1/messages", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var r anthropicReply
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || resp.StatusCode != 200 || len(r.Content) == 0 {
			t.Fatalf("messages: status %d, %v", resp.StatusCode, err)
		}
		return r
	}
	_, otherURL := gateway() // has seen none of the conversation
	a, b := messages(talkURL), messages(otherURL)
	t.Logf("third turn: %d input tokens, %d read from the cache", a.Usage.InputTokens, a.Usage.CacheReadInputTokens)
	if int64(a.Usage.CacheReadInputTokens) <= cached || b.Usage.CacheReadInputTokens != 0 || a.Usage.InputTokens+a.Usage.CacheReadInputTokens != b.Usage.InputTokens {
		t.Fatalf("third turn: %+v with the conversation's gateway, %+v with another", a.Usage, b.Usage)
	}
	if a.Content[0].Text != b.Content[0].Text {
		t.Fatalf("with the cache %q, without %q", a.Content[0].Text, b.Content[0].Text)
	}
}
