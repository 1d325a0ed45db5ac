package api

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
)

// burst produces all of its deltas at once, before the handler reads any,
// so they reach the stream merged into one update: text, a call in two
// fragments, more text.
type burst struct{ scripted }

func (b *burst) Generate(ctx context.Context, req *GenerateRequest, onDelta func(Delta)) (*GenerateResult, error) {
	for _, d := range []Delta{{Text: "Sure. "}, {ToolCalls: []ToolCallDelta{{Index: 0, ID: "call_1", Name: "get_weather", Arguments: `{"city":`}}},
		{ToolCalls: []ToolCallDelta{{Index: 0, Arguments: `"Paris"}`}}}, {Text: " Done."}} {
		onDelta(d)
	}
	return &GenerateResult{Model: "tiny", PromptTokens: 3, CompletionTokens: 4, ToolCalls: []ToolCall{{ID: "call_1", Name: "get_weather", Arguments: `{"city":"Paris"}`}}}, nil
}

// Streams keep the order of what the backend produced even when it
// arrives merged: Anthropic's blocks are text, tool_use (whole input),
// text.
func TestStreamKeepsDeltaOrder(t *testing.T) {
	evs := postEvents(t, New(Config{Backend: &burst{}}), "/v1/messages",
		`{"model":"tiny","max_tokens":20,"stream":true,"messages":[{"role":"user","content":"hi"}],"tools":[{"name":"get_weather","input_schema":{"type":"object"}}]}`)
	var blocks []string
	input := map[int]string{}
	for _, e := range evs {
		var k struct {
			Type         string
			Index        int
			ContentBlock struct{ Type, Name string } `json:"content_block"`
			Delta        struct {
				Type        string
				PartialJSON string `json:"partial_json"`
			}
		}
		if json.Unmarshal([]byte(e.raw), &k) != nil {
			continue
		}
		switch k.Type {
		case "content_block_start":
			blocks = append(blocks, k.ContentBlock.Type+":"+k.ContentBlock.Name)
		case "content_block_delta":
			if k.Delta.Type == "input_json_delta" {
				input[k.Index] += k.Delta.PartialJSON
			}
		}
	}
	if strings.Join(blocks, ",") != "text:,tool_use:get_weather,text:" || input[1] != `{"city":"Paris"}` {
		t.Fatalf("blocks %v, inputs %v", blocks, input)
	}
}
