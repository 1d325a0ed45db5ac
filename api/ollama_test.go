package api

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// ndjson reads a stream of JSON lines.
func ndjson(t *testing.T, body io.Reader) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(body)
	for sc.Scan() {
		out = append(out, decodeMap(t, sc.Bytes()))
	}
	return out
}

func decodeOllamaErr(t *testing.T, w *httptest.ResponseRecorder) string {
	t.Helper()
	m := decodeMap(t, w.Body.Bytes())
	msg, _ := m["error"].(string)
	if msg == "" || len(m) != 1 {
		t.Fatalf("status %d: not an Ollama error: %s", w.Code, w.Body.String())
	}
	return msg
}

func TestOllamaChat(t *testing.T) {
	b := &scripted{pieces: []string{"Hello", " there"}}
	s := New(Config{Backend: b})
	w := post(t, s, "/api/chat", `{"model":"tiny","stream":false,"keep_alive":"5m","think":false,
		"messages":[{"role":"system","content":"sys"},{"role":"user","content":"hi","images":[]},{"role":"assistant","content":"yo","thinking":""},{"role":"User","content":"again"}]}`)
	if w.Code != 200 || w.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("status %d: %s", w.Code, w.Body.String())
	}
	m := decodeMap(t, w.Body.Bytes())
	if m["model"] != "tiny" || m["done"] != true || m["done_reason"] != "stop" || dig(m, "message", "role") != "assistant" ||
		dig(m, "message", "content") != "Hello there" || m["prompt_eval_count"] != 3.0 || m["eval_count"] != 2.0 ||
		m["total_duration"] == nil || m["created_at"] == nil || dig(m, "message", "tool_calls") != nil {
		t.Fatalf("response %s", w.Body.String())
	}
	g := b.seen.Load()
	want := []Message{{Role: "system", Content: "sys"}, {Role: "user", Content: "hi"}, {Role: "assistant", Content: "yo"}, {Role: "user", Content: "again"}}
	// Ollama's defaults.
	if fmt.Sprint(g.Messages) != fmt.Sprint(want) || g.Temperature != 0.8 || g.TopK != 40 || g.TopP != 0.9 || g.RepeatPenalty != 1.1 ||
		g.MinP != 0 || g.MaxTokens != 0 {
		t.Fatalf("backend saw %+v", g)
	}
	w = post(t, s, "/api/chat", `{"model":"tiny","stream":false,"messages":[{"role":"user","content":"hi"}],
		"options":{"temperature":0,"top_k":5,"top_p":0.5,"min_p":0.1,"repeat_penalty":1,"seed":42,"num_predict":2,"stop":["x","y"],
		"presence_penalty":0.5,"frequency_penalty":-0.5},"format":"json"}`)
	g = b.seen.Load()
	if w.Code != 200 || g.Temperature != 0 || g.TopK != 5 || g.TopP != 0.5 || g.MinP != 0.1 || g.RepeatPenalty != 1 || g.Seed != 42 ||
		g.MaxTokens != 2 || fmt.Sprint(g.Stops) != "[x y]" || g.PresencePenalty != 0.5 || g.FrequencyPenalty != -0.5 ||
		g.Format.Type != FormatJSONObject {
		t.Fatalf("options: %d %+v", w.Code, g)
	}
	if m := decodeMap(t, w.Body.Bytes()); m["done_reason"] != "length" {
		t.Fatalf("num_predict reached: %s", w.Body.String())
	}
	w = post(t, s, "/api/chat", `{"model":"tiny","stream":false,"messages":[{"role":"user","content":"hi"}],
		"options":{"seed":-1,"num_predict":-1},"format":{"type":"object","properties":{"a":{"type":"string"}}}}`)
	g = b.seen.Load()
	if w.Code != 200 || g.MaxTokens != 0 || g.Format.Type != FormatJSONSchema || !strings.Contains(string(g.Format.Schema), `"a"`) {
		t.Fatalf("format schema: %d %+v", w.Code, g)
	}
}

// Streaming is Ollama's default: JSON lines, the last with done: true.
func TestOllamaStream(t *testing.T) {
	b := &scripted{pieces: []string{"caf", "\xc3", "\xa9", " ok"}}
	srv := httptest.NewServer(New(Config{Backend: b}))
	defer srv.Close()
	for _, c := range []struct{ path, body, field string }{
		{"/api/chat", `{"model":"tiny","messages":[{"role":"user","content":"hi"}]}`, "message"},
		{"/api/generate", `{"model":"tiny","prompt":"hi"}`, "response"},
	} {
		resp, err := http.Post(srv.URL+c.path, "application/json", strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		lines := ndjson(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/x-ndjson" || len(lines) < 2 {
			t.Fatalf("%s: %d %q %v", c.path, resp.StatusCode, resp.Header.Get("Content-Type"), lines)
		}
		text := ""
		for i, l := range lines {
			if l["model"] != "tiny" || l["done"] != (i == len(lines)-1) {
				t.Fatalf("%s: line %d %v", c.path, i, l)
			}
			if c.field == "message" {
				if dig(l, "message", "role") != "assistant" {
					t.Fatalf("line %v", l)
				}
				text += dig(l, "message", "content").(string)
			} else {
				text += l["response"].(string)
			}
		}
		last := lines[len(lines)-1]
		if text != "café ok" || last["done_reason"] != "stop" || last["eval_count"] != 4.0 || last["prompt_eval_count"] != 3.0 ||
			last["total_duration"] == nil || last["eval_duration"] == nil {
			t.Fatalf("%s: text %q, last %v", c.path, text, last)
		}
	}
}

func TestOllamaGenerate(t *testing.T) {
	b := &scripted{pieces: []string{"4"}}
	s := New(Config{Backend: b})
	w := post(t, s, "/api/generate", `{"model":"tiny","prompt":"2+2?","system":"math","stream":false,"images":[],"context":[],"suffix":"","options":{"temperature":0.1}}`)
	m := decodeMap(t, w.Body.Bytes())
	g := b.seen.Load()
	if w.Code != 200 || m["response"] != "4" || m["done"] != true || m["message"] != nil ||
		fmt.Sprint(g.Messages) != fmt.Sprint([]Message{{Role: "system", Content: "math"}, {Role: "user", Content: "2+2?"}}) ||
		g.Prompt != "" || g.Temperature != 0.1 {
		t.Fatalf("%d %s; backend saw %+v", w.Code, w.Body.String(), g)
	}
	w = post(t, s, "/api/generate", `{"model":"tiny","prompt":"raw text","raw":true,"stream":false}`)
	if g := b.seen.Load(); w.Code != 200 || g.Prompt != "raw text" || g.Messages != nil {
		t.Fatalf("raw: %d %+v", w.Code, g)
	}
	// An empty prompt (or no messages) loads the model: answered at once.
	b.seen.Store(nil)
	for _, c := range []struct{ path, body string }{
		{"/api/generate", `{"model":"tiny","stream":false}`},
		{"/api/chat", `{"model":"tiny","messages":[],"stream":false}`},
		{"/api/generate", `{"model":"tiny"}`},
	} {
		w := post(t, s, c.path, c.body)
		m := decodeMap(t, w.Body.Bytes())
		if w.Code != 200 || m["done"] != true || m["done_reason"] != "load" || m["model"] != "tiny" || b.seen.Load() != nil {
			t.Fatalf("%s %s: %d %s", c.path, c.body, w.Code, w.Body.String())
		}
	}
	w = post(t, s, "/api/generate", `{"model":"nope","stream":false}`)
	if msg := decodeOllamaErr(t, w); w.Code != 404 || !strings.Contains(msg, "nope") {
		t.Fatalf("load of an unknown model: %d %q", w.Code, msg)
	}
}

// Tool calls come in Ollama's shape (function.arguments an object), and
// a streamed call arrives whole, in one line.
func TestOllamaToolCalls(t *testing.T) {
	for _, pieces := range [][]string{nil, {"Checking."}} {
		b := &scripted{pieces: pieces, calls: weatherCalls}
		s := New(Config{Backend: b})
		body := `{"model":"tiny","messages":[{"role":"user","content":"weather?"},
			{"role":"assistant","content":"","tool_calls":[{"function":{"name":"get_weather","arguments":{"city":"Rome"}}},{"id":"c2","type":"function","function":{"index":1,"name":"get_time","arguments":"{\"tz\":\"UTC\"}"}}]},
			{"role":"tool","content":"sunny","tool_name":"get_weather"},{"role":"tool","content":"noon","tool_name":"get_time","tool_call_id":"c2"}],
			"tools":[{"type":"function","function":{"name":"get_weather","description":"d","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}},
			{"type":"function","function":{"name":"get_time","parameters":{"type":"object"}}}]`
		w := post(t, s, "/api/chat", body+`,"stream":false}`)
		m := decodeMap(t, w.Body.Bytes())
		calls, _ := dig(m, "message", "tool_calls").([]any)
		if w.Code != 200 || len(calls) != 2 || dig(calls, 0, "function", "name") != "get_weather" || dig(calls, 0, "function", "arguments", "city") != "Paris" ||
			dig(calls, 0, "id") != "toolu_1" || dig(calls, 1, "function", "index") != 1.0 || dig(calls, 1, "function", "arguments", "tz") != "CET" ||
			dig(m, "message", "content") != strings.Join(pieces, "") || m["done_reason"] != "stop" {
			t.Fatalf("response %d %s", w.Code, w.Body.String())
		}
		g := b.seen.Load()
		want := []Message{{Role: "user", Content: "weather?"},
			{Role: "assistant", ToolCalls: []ToolCall{{Name: "get_weather", Arguments: `{"city":"Rome"}`}, {ID: "c2", Name: "get_time", Arguments: `{"tz":"UTC"}`}}},
			{Role: "tool", Content: "sunny", Name: "get_weather"}, {Role: "tool", Content: "noon", Name: "get_time", ToolCallID: "c2"}}
		if fmt.Sprint(g.Messages) != fmt.Sprint(want) || len(g.Tools) != 2 || g.Tools[0].Description != "d" || g.ToolChoice.Mode != "" {
			t.Fatalf("backend saw %+v", g)
		}

		w = post(t, s, "/api/chat", body+`}`)
		lines := ndjson(t, w.Body)
		var got []any
		text := ""
		for _, l := range lines {
			text += dig(l, "message", "content").(string)
			if c, ok := dig(l, "message", "tool_calls").([]any); ok {
				if len(c) != 1 {
					t.Fatalf("a line carries %d calls: %v", len(c), l)
				}
				got = append(got, c[0])
			}
		}
		if len(got) != 2 || dig(got, 0, "function", "arguments", "city") != "Paris" || dig(got, 1, "function", "arguments", "tz") != "CET" ||
			dig(got, 1, "function", "index") != 1.0 || text != strings.Join(pieces, "") || lines[len(lines)-1]["done"] != true {
			t.Fatalf("streamed %v", lines)
		}
	}
}

func TestOllamaLogprobs(t *testing.T) {
	s := New(Config{Backend: &scripted{pieces: []string{"a", "b"}}})
	w := post(t, s, "/api/generate", `{"model":"tiny","prompt":"x","stream":false,"logprobs":true,"top_logprobs":2}`)
	m := decodeMap(t, w.Body.Bytes())
	lps, _ := m["logprobs"].([]any)
	if w.Code != 200 || len(lps) != 2 || dig(lps, 0, "token") != "a" || dig(lps, 0, "logprob") != -0.5 ||
		len(dig(lps, 0, "top_logprobs").([]any)) != 2 || dig(lps, 1, "bytes", 0) != 98.0 {
		t.Fatalf("%d %s", w.Code, w.Body.String())
	}
}

func TestOllamaModels(t *testing.T) {
	s := New(Config{Backend: &scripted{}, OllamaVersion: "9.9.9"})
	w := doReq(t, s, "GET", "/api/tags", "")
	m := decodeMap(t, w.Body.Bytes())
	if w.Code != 200 || dig(m, "models", 0, "name") != "tiny" || dig(m, "models", 0, "model") != "tiny" ||
		dig(m, "models", 0, "digest") != strings.Repeat("ab", 32) || dig(m, "models", 0, "modified_at") != "2023-11-14T22:13:20Z" ||
		dig(m, "models", 0, "details", "format") != "gguf" {
		t.Fatalf("tags: %d %s", w.Code, w.Body.String())
	}
	for _, body := range []string{`{"model":"tiny"}`, `{"name":"tiny"}`, `{"model":"` + strings.Repeat("ab", 8) + `","verbose":true}`} {
		w = post(t, s, "/api/show", body)
		m = decodeMap(t, w.Body.Bytes())
		if w.Code != 200 || dig(m, "model_info", "meshp2p.n_layer") != 5.0 || dig(m, "details", "format") != "gguf" ||
			!strings.Contains(m["modelfile"].(string), "FROM tiny") || dig(m, "capabilities", 0) != "completion" {
			t.Fatalf("show %s: %d %s", body, w.Code, w.Body.String())
		}
	}
	w = post(t, s, "/api/show", `{"model":"nope"}`)
	if decodeOllamaErr(t, w); w.Code != 404 {
		t.Fatalf("show nope: %d", w.Code)
	}
	w = doReq(t, s, "GET", "/api/version", "")
	if m := decodeMap(t, w.Body.Bytes()); w.Code != 200 || m["version"] != "9.9.9" {
		t.Fatalf("version: %d %s", w.Code, w.Body.String())
	}
	w = doReq(t, New(Config{Backend: &scripted{}}), "GET", "/api/version", "")
	if m := decodeMap(t, w.Body.Bytes()); m["version"] != DefaultOllamaVersion {
		t.Fatalf("default version: %s", w.Body.String())
	}
	for _, c := range []struct{ method, path string }{{"POST", "/api/tags"}, {"GET", "/api/chat"}, {"GET", "/api/show"}, {"POST", "/api/version"}} {
		if w := doReq(t, s, c.method, c.path, ""); w.Code != 405 || decodeOllamaErr(t, w) == "" {
			t.Fatalf("%s %s: %d", c.method, c.path, w.Code)
		}
	}
	if w := post(t, s, "/api/pull", `{"model":"x"}`); w.Code != 501 || !strings.Contains(decodeOllamaErr(t, w), "/api/tags") {
		t.Fatalf("pull: %d %s", w.Code, w.Body.String())
	}
}

func TestOllamaValidation(t *testing.T) {
	s := New(Config{Backend: &scripted{pieces: []string{"a"}}})
	chat := func(extra string) string {
		return `{"model":"tiny","messages":[{"role":"user","content":"hi"}]` + extra + `}`
	}
	gen := func(extra string) string { return `{"model":"tiny","prompt":"hi"` + extra + `}` }
	for _, c := range []struct{ name, path, body, field string }{
		{"unknown", "/api/chat", chat(`,"frobnicate":1`), "frobnicate"},
		{"no model", "/api/chat", `{"messages":[]}`, "model"},
		{"no messages", "/api/chat", `{"model":"tiny"}`, "messages"},
		{"think", "/api/chat", chat(`,"think":true`), "think"},
		{"think level", "/api/chat", chat(`,"think":"high"`), "think"},
		{"keep_alive", "/api/chat", chat(`,"keep_alive":[1]`), "keep_alive"},
		{"option", "/api/chat", chat(`,"options":{"num_ctx":4096}`), "options.num_ctx"},
		{"temperature", "/api/chat", chat(`,"options":{"temperature":3}`), "options.temperature"},
		{"num_predict", "/api/chat", chat(`,"options":{"num_predict":0}`), "options.num_predict"},
		{"num_predict -2", "/api/chat", chat(`,"options":{"num_predict":-2}`), "options.num_predict"},
		{"seed", "/api/chat", chat(`,"options":{"seed":"x"}`), "options.seed"},
		{"stop", "/api/chat", chat(`,"options":{"stop":["a","b","c","d","e"]}`), "options.stop"},
		{"format", "/api/chat", chat(`,"format":"yaml"`), "format"},
		{"format schema", "/api/chat", chat(`,"format":{"type":"object","properties":` + strings.Repeat(`{"a":`, 40) + `1` + strings.Repeat(`}`, 40) + `}`), "format"},
		{"role", "/api/chat", `{"model":"tiny","messages":[{"role":"function","content":"x"}]}`, "messages[0].role"},
		{"images", "/api/chat", `{"model":"tiny","messages":[{"role":"user","content":"x","images":["aGk="]}]}`, "messages[0].images"},
		{"tool_calls on user", "/api/chat", `{"model":"tiny","messages":[{"role":"user","content":"x","tool_calls":[]}]}`, "messages[0].tool_calls"},
		{"tool call args", "/api/chat", `{"model":"tiny","messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":[1]}}]}]}`, "messages[0].tool_calls[0].function.arguments"},
		{"tool call name", "/api/chat", `{"model":"tiny","messages":[{"role":"assistant","tool_calls":[{"function":{"name":"a b"}}]}]}`, "messages[0].tool_calls[0].function.name"},
		{"tool_name on user", "/api/chat", `{"model":"tiny","messages":[{"role":"user","content":"x","tool_name":"f"}]}`, "messages[0].tool_name"},
		{"tool type", "/api/chat", chat(`,"tools":[{"type":"retrieval"}]`), "tools[0].type"},
		{"tool name", "/api/chat", chat(`,"tools":[{"type":"function","function":{"name":"a b"}}]`), "tools[0].function.name"},
		{"tool params", "/api/chat", chat(`,"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"array"}}}]`), "tools[0].function.parameters"},
		{"tools with format", "/api/chat", chat(`,"tools":[{"type":"function","function":{"name":"f"}}],"format":"json"`), "format"},
		{"top_logprobs", "/api/chat", chat(`,"top_logprobs":3`), "top_logprobs"},
		{"images gen", "/api/generate", gen(`,"images":["aGk="]`), "images"},
		{"context", "/api/generate", gen(`,"context":[1,2]`), "context"},
		{"suffix", "/api/generate", gen(`,"suffix":"end"`), "suffix"},
		{"template", "/api/generate", gen(`,"template":"{{ .Prompt }}"`), "template"},
		{"raw system", "/api/generate", gen(`,"raw":true,"system":"s"`), "system"},
		{"messages on generate", "/api/generate", gen(`,"messages":[]`), "messages"},
		{"show field", "/api/show", `{"model":"tiny","x":1}`, "x"},
		{"show model", "/api/show", `{}`, "model"},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := post(t, s, c.path, c.body)
			if msg := decodeOllamaErr(t, w); w.Code != 400 || !strings.Contains(msg, c.field) {
				t.Fatalf("%d %q, want 400 naming %s", w.Code, msg, c.field)
			}
		})
	}
}

func TestOllamaBackendErrors(t *testing.T) {
	backendErrors(t, "/api/chat", `{"model":"nope","stream":%s,"messages":[{"role":"user","content":"hi"}]}`,
		func(t *testing.T, w *httptest.ResponseRecorder) { decodeOllamaErr(t, w) })
	status, stream := lateFailure(t, "/api/chat", `{"model":"tiny","messages":[{"role":"user","content":"hi"}]}`)
	lines := ndjson(t, strings.NewReader(stream))
	if status != 200 || len(lines) != 2 || dig(lines[0], "message", "content") != "partial" || !strings.Contains(lines[1]["error"].(string), "no re-route") {
		t.Fatalf("late failure: %d %v", status, lines)
	}
}

// The key guards every Ollama model endpoint (Bearer), not /api/version
// nor what is mounted beside; Handle refuses the API's paths.
func TestOllamaAuth(t *testing.T) {
	s := New(Config{Backend: &scripted{pieces: []string{"a"}}, APIKey: "s3cret"})
	s.Handle("GET /api/status", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "up") }))
	s.Handle("/", http.NotFoundHandler())
	calls := []struct{ method, path, body string }{
		{"POST", "/api/chat", `{"model":"tiny","stream":false,"messages":[{"role":"user","content":"hi"}]}`},
		{"POST", "/api/generate", `{"model":"tiny","stream":false,"prompt":"hi"}`},
		{"GET", "/api/tags", ""},
		{"POST", "/api/show", `{"model":"tiny"}`},
	}
	for _, c := range calls {
		for _, hdr := range [][]string{nil, {"Authorization", "Bearer wrong"}, {"x-api-key", "s3cret"}} {
			w := doReq(t, s, c.method, c.path, c.body, hdr...)
			if msg := decodeOllamaErr(t, w); w.Code != 401 || !strings.Contains(msg, "API key") {
				t.Fatalf("%s %v: %d %q", c.path, hdr, w.Code, msg)
			}
		}
		if w := doReq(t, s, c.method, c.path, c.body, "Authorization", "Bearer s3cret"); w.Code != 200 {
			t.Fatalf("%s with the key: %d %s", c.path, w.Code, w.Body.String())
		}
	}
	if w := doReq(t, s, "GET", "/api/version", ""); w.Code != 200 {
		t.Fatalf("version: %d", w.Code)
	}
	if w := doReq(t, s, "GET", "/api/status", ""); w.Code != 200 || w.Body.String() != "up" {
		t.Fatalf("mounted /api/status: %d", w.Code)
	}
	for _, p := range []string{"/api/chat", "POST /api/generate", "GET /api/tags", "/api/show", "/api/version", "/api/pull",
		"example.com/api/chat", "/v1/messages", "/v1", "GET /v1/models"} {
		func() {
			defer func() {
				if recover() == nil {
					t.Fatalf("mounting %q did not panic", p)
				}
			}()
			s.Handle(p, http.NotFoundHandler())
		}()
	}
}
