package api

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// Test helpers shared by the Anthropic, Ollama and Responses tests.

// namedEvent is one server-sent event with an event: name.
type namedEvent struct {
	name string
	data map[string]any
	raw  string
}

// namedEvents reads a stream of named server-sent events, checking the
// framing: "event: NAME", "data: JSON", a blank line.
func namedEvents(t *testing.T, body io.Reader) []namedEvent {
	t.Helper()
	var out []namedEvent
	sc := bufio.NewScanner(body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		name, ok := strings.CutPrefix(sc.Text(), "event: ")
		if !ok {
			t.Fatalf("line %q is not an event: line", sc.Text())
		}
		if !sc.Scan() {
			t.Fatalf("event %s without data", name)
		}
		d, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			t.Fatalf("event %s: line %q is not a data line", name, sc.Text())
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(d), &m); err != nil {
			t.Fatalf("event %s: data %q: %v", name, d, err)
		}
		if !sc.Scan() || sc.Text() != "" {
			t.Fatalf("event %s not followed by a blank line", name)
		}
		out = append(out, namedEvent{name: name, data: m, raw: d})
	}
	return out
}

// postEvents posts body to path of a server over h and reads its stream
// of named server-sent events (status 200, text/event-stream).
func postEvents(t *testing.T, h http.Handler, path, body string) []namedEvent {
	t.Helper()
	srv := httptest.NewServer(h)
	defer srv.Close()
	resp, err := http.Post(srv.URL+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("status %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	return namedEvents(t, resp.Body)
}

func eventNames(evs []namedEvent) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.name
	}
	return out
}

// doReq sends a request with headers (name, value pairs) to h.
func doReq(t *testing.T, h http.Handler, method, path, body string, hdr ...string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(method, path, strings.NewReader(body))
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// dig digs a value out of decoded JSON by keys and indices.
func dig(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, _ := v.(map[string]any)
			v = m[k]
		case int:
			a, _ := v.([]any)
			if k >= len(a) {
				return nil
			}
			v = a[k]
		}
	}
	return v
}

func decodeMap(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("not a JSON object: %q: %v", b, err)
	}
	return m
}

// lateFail is a Backend that produces text, then, once released, fails:
// the error comes after the stream started.
type lateFail struct {
	scripted
	release chan struct{}
}

func (b *lateFail) Generate(ctx context.Context, req *GenerateRequest, onDelta func(Delta)) (*GenerateResult, error) {
	onDelta(Delta{Text: "partial"})
	select {
	case <-b.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return nil, SwarmFailed("hop p2 failed and no re-route helped")
}

// lateFailure posts body to path of a server over lateFail, releasing the
// failure once the stream has carried the text, and returns the status
// and the whole stream.
func lateFailure(t *testing.T, path, body string) (int, string) {
	t.Helper()
	b := &lateFail{release: make(chan struct{})}
	srv := httptest.NewServer(New(Config{Backend: b}))
	defer srv.Close()
	resp, err := http.Post(srv.URL+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got []byte
	buf := make([]byte, 4096)
	for !strings.Contains(string(got), "partial") {
		n, err := resp.Body.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			t.Fatalf("stream ended before the text: %q (%v)", got, err)
		}
	}
	close(b.release)
	rest, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(append(got, rest...))
}

// backendErrors posts body (a format of its "stream" value, false and
// true) to path of a server whose backend fails with each of a few
// errors, checking the status each maps to; decode checks the error body.
func backendErrors(t *testing.T, path, body string, decode func(*testing.T, *httptest.ResponseRecorder)) {
	t.Helper()
	for _, c := range []struct {
		err    error
		status int
	}{{ModelNotFound("nope"), 404}, {Unavailable("no peer serves layers 2-4 of 5"), 503}, {errors.New("boom"), 500}} {
		for _, stream := range []string{"false", "true"} {
			s := New(Config{Backend: &scripted{err: c.err}})
			w := post(t, s, path, fmt.Sprintf(body, stream))
			if w.Code != c.status {
				t.Fatalf("%v stream=%s: %d", c.err, stream, w.Code)
			}
			decode(t, w)
		}
	}
}

var weatherCalls = []ToolCall{{ID: "toolu_1", Name: "get_weather", Arguments: `{"city":"Paris"}`},
	{ID: "toolu_2", Name: "get_time", Arguments: `{"tz":"CET"}`}}

const anthropicTools = `"tools":[{"name":"get_weather","description":"weather","input_schema":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}},
	{"name":"get_time","input_schema":{"type":"object"},"cache_control":{"type":"ephemeral"}}]`

func TestAnthropicMessages(t *testing.T) {
	b := &scripted{pieces: []string{"Hello", " world"}}
	s := New(Config{Backend: b})
	w := post(t, s, "/v1/messages", `{"model":"tiny","max_tokens":50,"system":[{"type":"text","text":"be brief","cache_control":{"type":"ephemeral"}}],
		"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"text","text":"yes?"}]},{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],
		"temperature":0.5,"top_p":0.9,"top_k":7,"stop_sequences":["END"],"metadata":{"user_id":"u1"},"thinking":{"type":"disabled"}}`,
		"anthropic-version", "2023-06-01", "anthropic-beta", "whatever-2025")
	if w.Code != 200 {
		t.Fatalf("status %d: %s", w.Code, w.Body.String())
	}
	m := decodeMap(t, w.Body.Bytes())
	if !strings.HasPrefix(m["id"].(string), "msg_") || m["type"] != "message" || m["role"] != "assistant" || m["model"] != "tiny" ||
		m["stop_reason"] != "end_turn" || m["stop_sequence"] != nil || dig(m, "content", 0, "type") != "text" ||
		dig(m, "content", 0, "text") != "Hello world" || len(m["content"].([]any)) != 1 ||
		dig(m, "usage", "input_tokens") != 3.0 || dig(m, "usage", "output_tokens") != 2.0 {
		t.Fatalf("response %s", w.Body.String())
	}
	g := b.seen.Load()
	want := []Message{{Role: "system", Content: "be brief"}, {Role: "user", Content: "hi"}, {Role: "assistant", Content: "yes?"}, {Role: "user", Content: "a\nb"}}
	if fmt.Sprint(g.Messages) != fmt.Sprint(want) || g.MaxTokens != 50 || g.Temperature != 0.5 || g.TopP != 0.9 || g.TopK != 7 ||
		fmt.Sprint(g.Stops) != "[END]" || len(g.Tools) != 0 || !g.ParallelToolCalls {
		t.Fatalf("backend saw %+v", g)
	}
	// Defaults: temperature 1, top_p and top_k off; max_tokens reached.
	w = post(t, s, "/v1/messages", `{"model":"tiny","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`)
	if m := decodeMap(t, w.Body.Bytes()); m["stop_reason"] != "max_tokens" {
		t.Fatalf("max_tokens: %s", w.Body.String())
	}
	if g := b.seen.Load(); g.Temperature != 1 || g.TopP != 1 || g.TopK != 0 {
		t.Fatalf("defaults %+v", g)
	}
	// A stop sequence that ended the text is reported as such.
	w = post(t, s, "/v1/messages", `{"model":"tiny","max_tokens":50,"stop_sequences":["x","wor"],"messages":[{"role":"user","content":"hi"}]}`)
	if m := decodeMap(t, w.Body.Bytes()); m["stop_reason"] != "stop_sequence" || m["stop_sequence"] != "wor" || dig(m, "content", 0, "text") != "Hello " {
		t.Fatalf("stop sequence: %s", w.Body.String())
	}
}

func TestAnthropicStream(t *testing.T) {
	b := &scripted{pieces: []string{"caf", "\xc3", "\xa9", " ok"}}
	evs := postEvents(t, New(Config{Backend: b}), "/v1/messages",
		`{"model":"tiny","max_tokens":20,"stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	names := eventNames(evs)
	if len(names) < 7 || strings.Join(names[:4], ",") != "message_start,ping,content_block_start,content_block_delta" ||
		strings.Join(names[len(names)-3:], ",") != "content_block_stop,message_delta,message_stop" {
		t.Fatalf("events %v", names)
	}
	text := ""
	for _, e := range evs {
		if e.data["type"] != e.name {
			t.Fatalf("event %s has type %v", e.name, e.data["type"])
		}
		if e.name == "content_block_delta" {
			if dig(e.data, "index") != 0.0 || dig(e.data, "delta", "type") != "text_delta" {
				t.Fatalf("delta %s", e.raw)
			}
			text += dig(e.data, "delta", "text").(string)
		}
	}
	start, md := evs[0].data, evs[len(evs)-2].data
	if text != "café ok" || dig(start, "message", "model") != "tiny" || dig(start, "message", "role") != "assistant" ||
		len(dig(start, "message", "content").([]any)) != 0 || dig(evs[2].data, "content_block", "type") != "text" ||
		dig(md, "delta", "stop_reason") != "end_turn" || dig(md, "usage", "output_tokens") != 4.0 || dig(md, "usage", "input_tokens") != 3.0 {
		t.Fatalf("text %q, start %v, message_delta %v", text, start, md)
	}
}

// Tool calls: tool_use blocks (after any text), stop_reason tool_use;
// streamed, each call is a block whose input arrives as input_json_delta.
func TestAnthropicToolCalls(t *testing.T) {
	body := `{"model":"tiny","max_tokens":50,"messages":[{"role":"user","content":"weather?"}],` + anthropicTools + `,"tool_choice":{"type":"any"}}`
	for _, pieces := range [][]string{nil, {"Let me", " check."}} {
		b := &scripted{pieces: pieces, calls: weatherCalls}
		s := New(Config{Backend: b})
		w := post(t, s, "/v1/messages", body)
		m := decodeMap(t, w.Body.Bytes())
		content := m["content"].([]any)
		calls := content
		if pieces != nil {
			if dig(content, 0, "type") != "text" || dig(content, 0, "text") != "Let me check." {
				t.Fatalf("text block: %s", w.Body.String())
			}
			calls = content[1:]
		}
		if w.Code != 200 || m["stop_reason"] != "tool_use" || len(calls) != 2 || dig(calls, 0, "type") != "tool_use" ||
			dig(calls, 0, "id") != "toolu_1" || dig(calls, 0, "name") != "get_weather" || dig(calls, 0, "input", "city") != "Paris" ||
			dig(calls, 1, "input", "tz") != "CET" {
			t.Fatalf("response %s", w.Body.String())
		}
		g := b.seen.Load()
		if len(g.Tools) != 2 || g.Tools[0].Name != "get_weather" || !strings.Contains(string(g.Tools[0].Parameters), `"city"`) ||
			g.Tools[0].Description != "weather" || g.ToolChoice.Mode != ToolRequired {
			t.Fatalf("backend saw %+v", g)
		}

		srv := httptest.NewServer(s)
		resp, err := http.Post(srv.URL+"/v1/messages", "application/json", strings.NewReader(strings.Replace(body, `"max_tokens"`, `"stream":true,"max_tokens"`, 1)))
		if err != nil {
			t.Fatal(err)
		}
		evs := namedEvents(t, resp.Body)
		resp.Body.Close()
		srv.Close()
		blocks := map[int]map[string]any{}
		args := map[int]string{}
		var open []int
		for _, e := range evs {
			switch e.name {
			case "content_block_start":
				i := int(e.data["index"].(float64))
				if len(open) != 0 || i != len(blocks) {
					t.Fatalf("block %d started while %v open: %v", i, open, eventNames(evs))
				}
				blocks[i], open = e.data["content_block"].(map[string]any), []int{i}
			case "content_block_delta":
				i := int(e.data["index"].(float64))
				if len(open) != 1 || open[0] != i {
					t.Fatalf("delta for block %d, open %v", i, open)
				}
				switch dig(e.data, "delta", "type") {
				case "text_delta":
					args[i] += dig(e.data, "delta", "text").(string)
				case "input_json_delta":
					args[i] += dig(e.data, "delta", "partial_json").(string)
				}
			case "content_block_stop":
				open = nil
			}
		}
		first := 0
		if pieces != nil {
			if blocks[0]["type"] != "text" || args[0] != "Let me check." {
				t.Fatalf("streamed text block %v %q", blocks[0], args[0])
			}
			first = 1
		}
		md := evs[len(evs)-2].data
		if len(blocks) != first+2 || blocks[first]["type"] != "tool_use" || blocks[first]["id"] != "toolu_1" || blocks[first]["name"] != "get_weather" ||
			args[first] != `{"city":"Paris"}` || blocks[first+1]["name"] != "get_time" || args[first+1] != `{"tz":"CET"}` ||
			dig(md, "delta", "stop_reason") != "tool_use" {
			t.Fatalf("streamed blocks %v args %v, message_delta %v", blocks, args, md)
		}
	}
}

// A tool round trip: the assistant's tool_use and the user's tool_result
// reach the backend as an assistant turn with ToolCalls and a tool
// message naming the call (and its function); tool_choice maps.
func TestAnthropicToolRoundTrip(t *testing.T) {
	b := &scripted{pieces: []string{"Sunny."}}
	s := New(Config{Backend: b})
	w := post(t, s, "/v1/messages", `{"model":"tiny","max_tokens":50,"system":"sys",`+anthropicTools+`,
		"tool_choice":{"type":"tool","name":"get_weather","disable_parallel_tool_use":true},
		"messages":[{"role":"user","content":"weather in Paris?"},
		{"role":"assistant","content":[{"type":"text","text":"Checking."},{"type":"tool_use","id":"toolu_9","name":"get_weather","input":{"city": "Paris"}}]},
		{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_9","content":[{"type":"text","text":"18C"},{"type":"text","text":"sunny"}]},
			{"type":"tool_result","tool_use_id":"toolu_8","content":"boom","is_error":true},{"type":"text","text":"thanks"}]}]}`)
	if w.Code != 200 {
		t.Fatalf("status %d: %s", w.Code, w.Body.String())
	}
	g := b.seen.Load()
	want := []Message{{Role: "system", Content: "sys"}, {Role: "user", Content: "weather in Paris?"},
		{Role: "assistant", Content: "Checking.", ToolCalls: []ToolCall{{ID: "toolu_9", Name: "get_weather", Arguments: `{"city":"Paris"}`}}},
		{Role: "tool", Content: "18C\nsunny", ToolCallID: "toolu_9", Name: "get_weather"},
		{Role: "tool", Content: "Error: boom", ToolCallID: "toolu_8"},
		{Role: "user", Content: "thanks"}}
	if fmt.Sprint(g.Messages) != fmt.Sprint(want) || g.ToolChoice != (ToolChoice{Mode: ToolFunction, Name: "get_weather"}) || g.ParallelToolCalls {
		t.Fatalf("backend saw %+v\nwant %+v", g.Messages, want)
	}
	for _, c := range []struct {
		choice string
		want   ToolChoice
	}{{`{"type":"auto"}`, ToolChoice{Mode: ToolAuto}}, {`{"type":"none"}`, ToolChoice{Mode: ToolNone}}} {
		w := post(t, s, "/v1/messages", `{"model":"tiny","max_tokens":5,"messages":[{"role":"user","content":"x"}],`+anthropicTools+`,"tool_choice":`+c.choice+`}`)
		if g := b.seen.Load(); w.Code != 200 || g.ToolChoice != c.want || !g.ParallelToolCalls {
			t.Fatalf("%s: %d %+v", c.choice, w.Code, g.ToolChoice)
		}
	}
	w = post(t, s, "/v1/messages", `{"model":"tiny","max_tokens":5,"messages":[{"role":"user","content":"x"}],
		"output_config":{"format":{"type":"json_schema","schema":{"type":"object"}}}}`)
	if g := b.seen.Load(); w.Code != 200 || g.Format.Type != FormatJSONSchema || string(g.Format.Schema) != `{"type":"object"}` {
		t.Fatalf("output_config: %d %+v", w.Code, g.Format)
	}
}

func decodeAnthropicErr(t *testing.T, w *httptest.ResponseRecorder) (typ, msg string) {
	t.Helper()
	var e struct {
		Type  string
		Error struct{ Type, Message string }
	}
	if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || e.Type != "error" || e.Error.Type == "" || e.Error.Message == "" {
		t.Fatalf("status %d: not an Anthropic error object: %s", w.Code, w.Body.String())
	}
	return e.Error.Type, e.Error.Message
}

// Every invalid or unsupported field is a 400 in Anthropic's shape whose
// message names it.
func TestAnthropicValidation(t *testing.T) {
	s := New(Config{Backend: &scripted{pieces: []string{"a"}}})
	const msgs = `"messages":[{"role":"user","content":"hi"}]`
	body := func(extra string) string { return `{"model":"tiny","max_tokens":5,` + msgs + extra + `}` }
	for _, c := range []struct{ name, body, field string }{
		{"unknown", body(`,"frobnicate":1`), "frobnicate"},
		{"no max_tokens", `{"model":"tiny",` + msgs + `}`, "max_tokens"},
		{"no model", `{"max_tokens":5,` + msgs + `}`, "model"},
		{"no messages", `{"model":"tiny","max_tokens":5}`, "messages"},
		{"empty messages", `{"model":"tiny","max_tokens":5,"messages":[]}`, "messages"},
		{"max_tokens range", `{"model":"tiny","max_tokens":0,` + msgs + `}`, "max_tokens"},
		{"temperature range", body(`,"temperature":1.5`), "temperature"},
		{"top_k type", body(`,"top_k":"x"`), "top_k"},
		{"stop_sequences count", body(`,"stop_sequences":["a","b","c","d","e"]`), "stop_sequences"},
		{"stop_sequences type", body(`,"stop_sequences":"a"`), "stop_sequences"},
		{"system role", `{"model":"tiny","max_tokens":5,"messages":[{"role":"system","content":"x"}]}`, "messages[0].role"},
		{"message field", `{"model":"tiny","max_tokens":5,"messages":[{"role":"user","content":"x","name":"bob"}]}`, "messages[0].name"},
		{"image block", `{"model":"tiny","max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{}}]}]}`, "messages[0].content[0].type"},
		{"tool_use in user", `{"model":"tiny","max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_use","id":"a","name":"f","input":{}}]}]}`, "messages[0].content[0].type"},
		{"tool_use input", `{"model":"tiny","max_tokens":5,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"a","name":"f","input":[1]}]}]}`, "messages[0].content[0].input"},
		{"tool_use name", `{"model":"tiny","max_tokens":5,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"a","name":"no spaces","input":{}}]}]}`, "messages[0].content[0].name"},
		{"tool_result image", `{"model":"tiny","max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"a","content":[{"type":"image"}]}]}]}`, "messages[0].content[0].content[0].type"},
		{"thinking", body(`,"thinking":{"type":"enabled","budget_tokens":1024}`), "thinking"},
		{"metadata field", body(`,"metadata":{"x":1}`), "metadata.x"},
		{"tool type", body(`,"tools":[{"type":"web_search_20250305","name":"web_search"}]`), "tools[0].type"},
		{"tool name", body(`,"tools":[{"name":"a b","input_schema":{"type":"object"}}]`), "tools[0].name"},
		{"tool schema", body(`,"tools":[{"name":"f","input_schema":{"type":"string"}}]`), "tools[0].input_schema"},
		{"tool no schema", body(`,"tools":[{"name":"f"}]`), "tools[0].input_schema"},
		{"tool_choice type", body(`,"tool_choice":{"type":"sometimes"}`), "tool_choice.type"},
		{"tool_choice missing tool", body(`,` + anthropicTools + `,"tool_choice":{"type":"tool","name":"nope"}`), "tool_choice"},
		{"tool_choice any without tools", body(`,"tool_choice":{"type":"any"}`), "tool_choice"},
		{"output_config effort", body(`,"output_config":{"effort":"high"}`), "output_config.effort"},
		{"format with forced tools", body(`,` + anthropicTools + `,"tool_choice":{"type":"any"},"output_config":{"format":{"type":"json_schema","schema":{"type":"object"}}}`), "output_config.format"},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := post(t, s, "/v1/messages", c.body)
			typ, msg := decodeAnthropicErr(t, w)
			if w.Code != 400 || typ != "invalid_request_error" || !strings.Contains(msg, c.field) {
				t.Fatalf("%d %s %q, want 400 naming %s", w.Code, typ, msg, c.field)
			}
		})
	}
	for _, b := range []string{`not json`, `[1]`, `{"model":"tiny"} {}`} {
		if w := post(t, s, "/v1/messages", b); w.Code != 400 {
			t.Fatalf("body %q: %d", b, w.Code)
		}
		decodeAnthropicErr(t, post(t, s, "/v1/messages", b))
	}
	if w := doReq(t, s, "GET", "/v1/messages", ""); w.Code != 405 {
		t.Fatalf("GET: %d", w.Code)
	}
	w := post(t, s, "/v1/messages/count_tokens", body(""))
	if typ, _ := decodeAnthropicErr(t, w); w.Code != 404 || typ != "not_found_error" {
		t.Fatalf("count_tokens: %d %s", w.Code, typ)
	}
	big := New(Config{Backend: &scripted{}, MaxBody: 64})
	w = post(t, big, "/v1/messages", body(`,"system":"`+strings.Repeat("x", 100)+`"`))
	if typ, _ := decodeAnthropicErr(t, w); w.Code != 413 || typ != "request_too_large" {
		t.Fatalf("big body: %d %s", w.Code, typ)
	}
}

// Backend errors keep their status in Anthropic's shape, streamed or not;
// after the stream started they are an error event.
func TestAnthropicBackendErrors(t *testing.T) {
	for _, c := range []struct {
		err    error
		status int
		typ    string
	}{
		{ModelNotFound("nope"), 404, "not_found_error"},
		{fmt.Errorf("wrapped: %w", Unavailable("no peer serves layers 2-4 of 5")), 503, "overloaded_error"},
		{BadRequest("max_tokens", "too long"), 400, "invalid_request_error"},
		{errors.New("boom"), 500, "api_error"},
	} {
		for _, stream := range []string{"false", "true"} {
			s := New(Config{Backend: &scripted{err: c.err}})
			w := post(t, s, "/v1/messages", `{"model":"nope","max_tokens":5,"stream":`+stream+`,"messages":[{"role":"user","content":"hi"}]}`)
			if typ, _ := decodeAnthropicErr(t, w); w.Code != c.status || typ != c.typ {
				t.Fatalf("%v stream=%s: %d %s", c.err, stream, w.Code, typ)
			}
		}
	}
	status, stream := lateFailure(t, "/v1/messages", `{"model":"tiny","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	evs := namedEvents(t, strings.NewReader(stream))
	last := evs[len(evs)-1]
	if status != 200 || last.name != "error" || last.data["type"] != "error" || dig(last.data, "error", "type") != "overloaded_error" ||
		!strings.Contains(dig(last.data, "error", "message").(string), "no re-route") {
		t.Fatalf("late failure: %d %v", status, eventNames(evs))
	}
}

// The key is accepted as x-api-key or Bearer on /v1/messages, Bearer only
// elsewhere; 401s come in each path's shape.
func TestAnthropicAuth(t *testing.T) {
	s := New(Config{Backend: &scripted{pieces: []string{"a"}}, APIKey: "s3cret"})
	body := `{"model":"tiny","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`
	for _, hdr := range [][]string{nil, {"x-api-key", "wrong"}, {"Authorization", "Bearer wrong"}, {"x-api-key", ""},
		{"Authorization", "s3cret"}, {"x-api-key", "wrong", "Authorization", "Bearer wrong2"}} {
		w := post(t, s, "/v1/messages", body, hdr...)
		if typ, _ := decodeAnthropicErr(t, w); w.Code != 401 || typ != "authentication_error" {
			t.Fatalf("%v: %d %s", hdr, w.Code, typ)
		}
		w = post(t, s, "/v1/messages/count_tokens", body, hdr...)
		if typ, _ := decodeAnthropicErr(t, w); w.Code != 401 || typ != "authentication_error" {
			t.Fatalf("count_tokens %v: %d %s", hdr, w.Code, typ)
		}
	}
	for _, hdr := range [][]string{{"x-api-key", "s3cret"}, {"Authorization", "Bearer s3cret"},
		{"x-api-key", "wrong", "Authorization", "Bearer s3cret"}, {"x-api-key", "s3cret", "Authorization", "Bearer wrong"}} {
		if w := post(t, s, "/v1/messages", body, hdr...); w.Code != 200 {
			t.Fatalf("%v: %d %s", hdr, w.Code, w.Body.String())
		}
	}
	// x-api-key is Anthropic's header: the OpenAI endpoints want Bearer.
	w := post(t, s, "/v1/chat/completions", `{"model":"tiny","messages":[{"role":"user","content":"hi"}]}`, "x-api-key", "s3cret")
	if w.Code != 401 || decodeErr(t, w).Error.Code != "invalid_api_key" {
		t.Fatalf("chat with x-api-key: %d", w.Code)
	}
}

func TestCORSAnthropicHeaders(t *testing.T) {
	s := New(Config{Backend: &scripted{}, CORSOrigins: []string{"*"}})
	r := httptest.NewRequest(http.MethodOptions, "/v1/messages", nil)
	r.Header.Set("Origin", "http://app.example")
	r.Header.Set("Access-Control-Request-Method", "POST")
	r.Header.Set("Access-Control-Request-Headers", "x-api-key, anthropic-version, x-stainless-os, x-stainless-retry-count, x-evil header")
	w := httptest.NewRecorder()
	s.ServeHTTP(w, r)
	allow := strings.ToLower(w.Header().Get("Access-Control-Allow-Headers"))
	for _, h := range []string{"authorization", "content-type", "x-api-key", "anthropic-version", "anthropic-beta", "x-stainless-os", "x-stainless-retry-count"} {
		if !strings.Contains(allow, h) {
			t.Fatalf("allow-headers %q lacks %s", allow, h)
		}
	}
	if w.Code != 204 || strings.Contains(allow, "evil") {
		t.Fatalf("preflight %d %q", w.Code, allow)
	}
}
