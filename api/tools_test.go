package api

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// Tool calls come back as OpenAI sends them: message.tool_calls (content
// null) with finish_reason tool_calls, or streamed as delta.tool_calls
// with index, id, type and name first and argument fragments after; the
// request's tools, choice and history reach the backend as parsed.
func TestToolCallsOpenAIShape(t *testing.T) {
	calls := []ToolCall{{ID: "call_1", Name: "get_weather", Arguments: `{"city":"Paris"}`}, {ID: "call_2", Name: "get_time", Arguments: `{"tz":"CET"}`}}
	b := &scripted{calls: calls}
	s := New(Config{Backend: b})
	body := `{"model":"tiny","messages":[{"role":"user","content":"weather?"},
		{"role":"assistant","content":null,"tool_calls":[{"id":"call_0","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Rome\"}"}}]},
		{"role":"tool","tool_call_id":"call_0","content":"sunny"}],
		"tools":[{"type":"function","function":{"name":"get_weather","description":"d","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}},
		         {"type":"function","function":{"name":"get_time","parameters":{"type":"object"}}}],
		"tool_choice":"required","parallel_tool_calls":true}`
	w := post(t, s, "/v1/chat/completions", body)
	if w.Code != http.StatusOK {
		t.Fatalf("status %d: %s", w.Code, w.Body.String())
	}
	var c struct {
		Choices []struct {
			Message struct {
				Content   *string `json:"content"`
				ToolCalls []struct {
					ID, Type string
					Function struct{ Name, Arguments string }
				} `json:"tool_calls"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &c); err != nil {
		t.Fatal(err)
	}
	m := c.Choices[0].Message
	if c.Choices[0].FinishReason != "tool_calls" || m.Content != nil || len(m.ToolCalls) != 2 ||
		m.ToolCalls[0].ID != "call_1" || m.ToolCalls[0].Type != "function" || m.ToolCalls[0].Function.Name != "get_weather" ||
		m.ToolCalls[0].Function.Arguments != `{"city":"Paris"}` || m.ToolCalls[1].Function.Arguments != `{"tz":"CET"}` {
		t.Fatalf("response %s", w.Body.String())
	}
	seen := b.seen.Load()
	if len(seen.Tools) != 2 || seen.Tools[0].Name != "get_weather" || seen.ToolChoice.Mode != ToolRequired || !seen.ParallelToolCalls ||
		len(seen.Messages) != 3 || seen.Messages[1].ToolCalls[0].Arguments != `{"city":"Rome"}` || seen.Messages[2].Role != "tool" ||
		seen.Messages[2].ToolCallID != "call_0" || seen.Messages[2].Content != "sunny" {
		t.Fatalf("backend saw %+v", seen)
	}

	srv := httptest.NewServer(s)
	defer srv.Close()
	resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(strings.Replace(body, `"tool_choice"`, `"stream":true,"tool_choice"`, 1)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	args := map[int]string{}
	var names []string
	var finish string
	for _, e := range sse(t, resp.Body) {
		if e == "[DONE]" {
			continue
		}
		var k struct {
			Choices []struct {
				Delta struct {
					Content   *string `json:"content"`
					ToolCalls []struct {
						Index    *int   `json:"index"`
						ID, Type string `json:",omitempty"`
						Function struct{ Name, Arguments string }
					} `json:"tool_calls"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(e), &k); err != nil {
			t.Fatal(err)
		}
		for _, tc := range k.Choices[0].Delta.ToolCalls {
			if tc.Index == nil {
				t.Fatalf("tool call delta without index: %s", e)
			}
			if tc.ID != "" {
				if tc.Type != "function" || tc.Function.Name == "" {
					t.Fatalf("first fragment %s", e)
				}
				names = append(names, tc.Function.Name)
			}
			args[*tc.Index] += tc.Function.Arguments
		}
		if k.Choices[0].FinishReason != nil {
			finish = *k.Choices[0].FinishReason
		}
	}
	if finish != "tool_calls" || len(names) != 2 || names[1] != "get_time" || args[0] != `{"city":"Paris"}` || args[1] != `{"tz":"CET"}` {
		t.Fatalf("stream: finish %q names %v args %v", finish, names, args)
	}
}

// logprobs come back per token on chat (content list with top_logprobs)
// and completions (parallel arrays), streamed and not.
func TestLogprobsOpenAIShape(t *testing.T) {
	s := New(Config{Backend: &scripted{pieces: []string{"Once", " upon"}}})
	w := post(t, s, "/v1/chat/completions", `{"model":"tiny","messages":[{"role":"user","content":"hi"}],"logprobs":true,"top_logprobs":3}`)
	var c struct {
		Choices []struct {
			Logprobs struct {
				Content []struct {
					Token       string
					Logprob     float32
					Bytes       []int
					TopLogprobs []struct {
						Token   string
						Logprob float32
					} `json:"top_logprobs"`
				}
			}
		}
	}
	if err := json.Unmarshal(w.Body.Bytes(), &c); err != nil || w.Code != 200 {
		t.Fatalf("%d %s %v", w.Code, w.Body.String(), err)
	}
	lc := c.Choices[0].Logprobs.Content
	if len(lc) != 2 || lc[0].Token != "Once" || lc[1].Token != " upon" || len(lc[0].TopLogprobs) != 3 || len(lc[0].Bytes) != 4 || lc[0].Logprob != -0.5 {
		t.Fatalf("chat logprobs %s", w.Body.String())
	}
	w = post(t, s, "/v1/completions", `{"model":"tiny","prompt":"x","logprobs":2}`)
	var k struct {
		Choices []struct {
			Logprobs struct {
				Tokens        []string
				TokenLogprobs []float32            `json:"token_logprobs"`
				TopLogprobs   []map[string]float32 `json:"top_logprobs"`
				TextOffset    []int                `json:"text_offset"`
			}
		}
	}
	if err := json.Unmarshal(w.Body.Bytes(), &k); err != nil {
		t.Fatal(err)
	}
	lp := k.Choices[0].Logprobs
	if len(lp.Tokens) != 2 || len(lp.TopLogprobs[1]) != 2 || lp.TextOffset[1] != 4 || lp.TokenLogprobs[0] != -0.5 {
		t.Fatalf("completion logprobs %s", w.Body.String())
	}
	// Without logprobs the field stays null.
	w = post(t, s, "/v1/chat/completions", `{"model":"tiny","messages":[{"role":"user","content":"hi"}]}`)
	if !strings.Contains(w.Body.String(), `"logprobs":null`) {
		t.Fatalf("no logprobs: %s", w.Body.String())
	}
}
