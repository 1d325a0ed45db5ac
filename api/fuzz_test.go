package api

import (
	"encoding/json"
	"testing"
)

// Request bodies come from anyone who reaches the API: parsing never
// panics, and what it accepts respects the documented bounds.
func FuzzParseRequest(f *testing.F) {
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"stop":["a","b"],"max_tokens":5,"seed":-3}`))
	f.Add([]byte(`{"model":"m","prompt":["x"],"stream":true,"stream_options":{"include_usage":true},"temperature":0}`))
	f.Add([]byte(`{"model":"m","messages":[{"role":"assistant","refusal":null}],"n":1,"logprobs":false}`))
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":"w?"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},{"role":"tool","tool_call_id":"c1","content":"ok"}],"tools":[{"type":"function","function":{"name":"f","description":"d","parameters":{"type":"object","properties":{"a":{"type":"integer"}}},"strict":true}}],"tool_choice":{"type":"function","function":{"name":"f"}},"parallel_tool_calls":false}`))
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"name":"s","schema":{"type":"object","properties":{"b":{"enum":[1,2]}}},"strict":true}},"logprobs":true,"top_logprobs":20}`))
	f.Add([]byte(`{"model":"m","prompt":"x","logprobs":5}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, parse := range []func([]byte) (*request, *Error){parseChat, parseCompletion} {
			r, e := parse(body)
			if (r == nil) == (e == nil) {
				t.Fatalf("request %v, error %v", r, e)
			}
			if e != nil {
				if e.Status != 400 || e.Message == "" {
					t.Fatalf("error %+v", e)
				}
				continue
			}
			g := r.gen
			if g.Model == "" || len(g.Stops) > MaxStops || g.MaxTokens < 0 || g.MaxTokens > MaxTokensLimit ||
				!(g.Temperature >= 0 && g.Temperature <= 2) || !(g.TopP >= 0 && g.TopP <= 1) || len(g.Messages) > MaxMessages ||
				(g.Messages == nil && g.Prompt == "") {
				t.Fatalf("accepted out of bounds: %+v stops %q", g, g.Stops)
			}
			for _, m := range g.Messages {
				if m.Role != "system" && m.Role != "user" && m.Role != "assistant" && m.Role != "tool" {
					t.Fatalf("role %q accepted", m.Role)
				}
				if len(m.ToolCalls) > MaxToolCallsTurn || (m.Role == "tool" && m.ToolCallID == "") {
					t.Fatalf("message accepted out of bounds: %+v", m)
				}
			}
			if len(g.Tools) > MaxTools || g.TopLogprobs < 0 || g.TopLogprobs > MaxTopLogprobs || len(g.Format.Schema) > MaxSchemaBytes {
				t.Fatalf("accepted out of bounds: %+v", g)
			}
			for _, tl := range g.Tools {
				if !toolName.MatchString(tl.Name) || len(tl.Parameters) > MaxSchemaBytes {
					t.Fatalf("tool accepted out of bounds: %+v", tl)
				}
			}
			if (g.ToolChoice.Mode == ToolRequired || g.ToolChoice.Mode == ToolFunction) && len(g.Tools) == 0 {
				t.Fatalf("a forced call without tools accepted: %+v", g)
			}
		}
	})
}

// checkAdapted checks what an adapter (Anthropic, Ollama, Responses)
// accepted: the shared bounds hold and every message is well formed.
func checkAdapted(t *testing.T, g *GenerateRequest, e *Error, promptOK bool) {
	t.Helper()
	if e != nil {
		if e.Status != 400 || e.Message == "" {
			t.Fatalf("error %+v", e)
		}
		return
	}
	if g.Model == "" || len(g.Stops) > MaxStops || g.MaxTokens < 0 || g.MaxTokens > MaxTokensLimit ||
		!(g.Temperature >= 0 && g.Temperature <= 2) || !(g.TopP >= 0 && g.TopP <= 1) || g.TopK < 0 || g.TopK > MaxTopK ||
		len(g.Messages) > MaxMessages+1 || (g.Messages == nil && !promptOK) || len(g.Tools) > MaxTools ||
		g.TopLogprobs < 0 || g.TopLogprobs > MaxTopLogprobs {
		t.Fatalf("accepted out of bounds: %+v", g)
	}
	for _, s := range g.Stops {
		if s == "" || len(s) > MaxStopBytes {
			t.Fatalf("stop %q accepted", s)
		}
	}
	for _, m := range g.Messages {
		switch m.Role {
		case "system", "user", "assistant", "tool":
		default:
			t.Fatalf("role %q accepted", m.Role)
		}
		for _, c := range m.ToolCalls {
			if !json.Valid([]byte(c.Arguments)) || !toolName.MatchString(c.Name) || len(c.ID) > MaxToolCallIDSize {
				t.Fatalf("tool call %+v accepted", c)
			}
		}
	}
}

func FuzzParseAnthropic(f *testing.F) {
	f.Add([]byte(`{"model":"m","max_tokens":5,"system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":"hi"},
		{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"f","input":{"a":1}}]},
		{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"r"}],"is_error":true}]}],
		"tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"tool","name":"f"},"stop_sequences":["x"],"stream":true}`))
	f.Add([]byte(`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"text","text":"a","cache_control":{"type":"ephemeral"}}]}],"temperature":1,"top_k":3}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		r, e := parseAnthropic(body)
		if (r == nil) == (e == nil) {
			t.Fatalf("request %v, error %v", r, e)
		}
		var g *GenerateRequest
		if r != nil {
			g = &r.gen
			if g.Temperature > 1 || g.MaxTokens < 1 {
				t.Fatalf("accepted %+v", g)
			}
		}
		checkAdapted(t, g, e, false)
	})
}

func FuzzParseOllama(f *testing.F) {
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":{"a":1}}}]},
		{"role":"tool","content":"r","tool_name":"f"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],
		"options":{"temperature":0.1,"seed":-1,"num_predict":-1,"stop":["x"]},"format":"json","stream":false,"keep_alive":"5m"}`))
	f.Add([]byte(`{"model":"m","prompt":"p","system":"s","raw":false,"format":{"type":"object"},"options":{"top_k":1},"logprobs":true,"top_logprobs":2}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, chat := range []bool{true, false} {
			r, e := parseOllama(body, chat)
			if (r == nil) == (e == nil) {
				t.Fatalf("request %v, error %v", r, e)
			}
			var g *GenerateRequest
			if r != nil {
				g = &r.gen
			}
			checkAdapted(t, g, e, !chat || (r != nil && r.load))
		}
	})
}

func FuzzParseResponses(f *testing.F) {
	f.Add([]byte(`{"model":"m","instructions":"i","input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]},
		{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"r"}],
		"tools":[{"type":"function","name":"f","parameters":{"type":"object"}}],"tool_choice":{"type":"function","name":"f"},
		"text":{"format":{"type":"json_schema","name":"n","schema":{"type":"object"}}},"store":false,"max_output_tokens":9}`))
	f.Add([]byte(`{"model":"m","input":"hi","stream":true,"temperature":0,"metadata":{"a":"b"}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		r, e := parseResponses(body)
		if (r == nil) == (e == nil) {
			t.Fatalf("request %v, error %v", r, e)
		}
		var g *GenerateRequest
		if r != nil {
			g = &r.gen
		}
		checkAdapted(t, g, e, false)
	})
}
