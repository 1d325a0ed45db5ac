package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
)

func TestResponses(t *testing.T) {
	b := &scripted{pieces: []string{"Hello", " there"}}
	s := New(Config{Backend: b})
	w := post(t, s, "/v1/responses", `{"model":"tiny","instructions":"be brief","input":"hi","max_output_tokens":50,"temperature":0.5,"top_p":0.9,
		"store":false,"metadata":{"k":"v"},"user":"u","truncation":"disabled","include":[],"text":{"format":{"type":"text"}}}`)
	if w.Code != 200 {
		t.Fatalf("status %d: %s", w.Code, w.Body.String())
	}
	m := decodeMap(t, w.Body.Bytes())
	if !strings.HasPrefix(m["id"].(string), "resp_") || m["object"] != "response" || m["status"] != "completed" || m["model"] != "tiny" ||
		m["incomplete_details"] != nil || m["error"] != nil || m["store"] != false || m["instructions"] != "be brief" ||
		m["max_output_tokens"] != 50.0 || m["temperature"] != 0.5 || dig(m, "metadata", "k") != "v" ||
		dig(m, "output", 0, "type") != "message" || dig(m, "output", 0, "role") != "assistant" || dig(m, "output", 0, "status") != "completed" ||
		!strings.HasPrefix(dig(m, "output", 0, "id").(string), "msg_") ||
		dig(m, "output", 0, "content", 0, "type") != "output_text" || dig(m, "output", 0, "content", 0, "text") != "Hello there" ||
		dig(m, "usage", "input_tokens") != 3.0 || dig(m, "usage", "output_tokens") != 2.0 || dig(m, "usage", "total_tokens") != 5.0 {
		t.Fatalf("response %s", w.Body.String())
	}
	g := b.seen.Load()
	if fmt.Sprint(g.Messages) != fmt.Sprint([]Message{{Role: "system", Content: "be brief"}, {Role: "user", Content: "hi"}}) ||
		g.MaxTokens != 50 || g.Temperature != 0.5 || g.TopP != 0.9 || !g.ParallelToolCalls {
		t.Fatalf("backend saw %+v", g)
	}
	w = post(t, s, "/v1/responses", `{"model":"tiny","input":[{"role":"developer","content":"sys"},{"type":"message","role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_text","text":"b"}]},
		{"type":"message","id":"msg_1","status":"completed","role":"assistant","content":[{"type":"output_text","text":"c","annotations":[]}]}],
		"max_output_tokens":2,"text":{"format":{"type":"json_schema","name":"x","schema":{"type":"object"},"strict":true}}}`)
	m = decodeMap(t, w.Body.Bytes())
	g = b.seen.Load()
	if w.Code != 200 || m["status"] != "incomplete" || dig(m, "incomplete_details", "reason") != "max_output_tokens" ||
		dig(m, "output", 0, "status") != "incomplete" || dig(m, "text", "format", "type") != "json_schema" ||
		fmt.Sprint(g.Messages) != fmt.Sprint([]Message{{Role: "system", Content: "sys"}, {Role: "user", Content: "a\nb"}, {Role: "assistant", Content: "c"}}) ||
		g.Temperature != 1 || g.TopP != 1 || g.Format.Type != FormatJSONSchema || g.Format.Name != "x" || !g.Format.Strict {
		t.Fatalf("%d %s; backend saw %+v", w.Code, w.Body.String(), g)
	}
}

// responsesEvents posts body and checks the stream's framing, event types
// and sequence numbers.
func responsesEvents(t *testing.T, s http.Handler, body string) []namedEvent {
	t.Helper()
	evs := postEvents(t, s, "/v1/responses", body)
	for i, e := range evs {
		if e.data["type"] != e.name || e.data["sequence_number"] != float64(i) {
			t.Fatalf("event %d %s: %s", i, e.name, e.raw)
		}
	}
	// openai-go's accumulator checks the events are consistent.
	var acc responses.ResponseAccumulator
	for _, e := range evs {
		var u responses.ResponsesServerEventUnion
		if err := json.Unmarshal([]byte(e.raw), &u); err != nil {
			t.Fatalf("event %s: %v", e.name, err)
		}
		if err := acc.AddEvent(u); err != nil {
			t.Fatalf("accumulator: event %s: %v", e.raw, err)
		}
	}
	if _, err := acc.ReconstructedResponse(); err != nil && evs[len(evs)-1].name != "response.failed" {
		t.Fatalf("accumulator: %v", err)
	}
	return evs
}

func TestResponsesStream(t *testing.T) {
	s := New(Config{Backend: &scripted{pieces: []string{"caf", "\xc3", "\xa9", " ok"}}})
	evs := responsesEvents(t, s, `{"model":"tiny","input":"hi","stream":true}`)
	names := eventNames(evs)
	want := "response.created,response.in_progress,response.output_item.added,response.content_part.added,response.output_text.delta"
	if strings.Join(names[:5], ",") != want || strings.Join(names[len(names)-4:], ",") !=
		"response.output_text.done,response.content_part.done,response.output_item.done,response.completed" {
		t.Fatalf("events %v", names)
	}
	text := ""
	for _, e := range evs {
		if e.name == "response.output_text.delta" {
			text += e.data["delta"].(string)
		}
	}
	last := evs[len(evs)-1].data
	if text != "café ok" || dig(evs[0].data, "response", "status") != "in_progress" || dig(evs[0].data, "response", "usage") != nil ||
		dig(evs[len(evs)-4].data, "text") != "café ok" || dig(last, "response", "status") != "completed" ||
		dig(last, "response", "output", 0, "content", 0, "text") != "café ok" || dig(last, "response", "usage", "output_tokens") != 4.0 {
		t.Fatalf("text %q, last %v", text, last)
	}
	evs = responsesEvents(t, s, `{"model":"tiny","input":"hi","stream":true,"max_output_tokens":2}`)
	if last := evs[len(evs)-1]; last.name != "response.incomplete" || dig(last.data, "response", "incomplete_details", "reason") != "max_output_tokens" {
		t.Fatalf("incomplete: %v", eventNames(evs))
	}
}

const responsesTools = `"tools":[{"type":"function","name":"get_weather","description":"weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}},
	{"type":"function","name":"get_time","parameters":{"type":"object"},"strict":false}]`

func TestResponsesToolCalls(t *testing.T) {
	for _, pieces := range [][]string{nil, {"Checking."}} {
		b := &scripted{pieces: pieces, calls: weatherCalls}
		s := New(Config{Backend: b})
		body := `{"model":"tiny","input":"weather?",` + responsesTools + `,"tool_choice":"required","parallel_tool_calls":false}`
		w := post(t, s, "/v1/responses", body)
		m := decodeMap(t, w.Body.Bytes())
		out := m["output"].([]any)
		if pieces != nil {
			if dig(out, 0, "type") != "message" || dig(out, 0, "content", 0, "text") != "Checking." {
				t.Fatalf("message: %s", w.Body.String())
			}
			out = out[1:]
		}
		if w.Code != 200 || m["status"] != "completed" || len(out) != 2 || dig(out, 0, "type") != "function_call" ||
			dig(out, 0, "call_id") != "toolu_1" || dig(out, 0, "name") != "get_weather" || dig(out, 0, "arguments") != `{"city":"Paris"}` ||
			!strings.HasPrefix(dig(out, 0, "id").(string), "fc_") || dig(out, 1, "arguments") != `{"tz":"CET"}` ||
			dig(m, "tool_choice") != "required" || dig(m, "tools", 0, "strict") != true || dig(m, "tools", 1, "strict") != false ||
			m["parallel_tool_calls"] != false {
			t.Fatalf("response %d %s", w.Code, w.Body.String())
		}
		g := b.seen.Load()
		if len(g.Tools) != 2 || !g.Tools[0].Strict || g.Tools[1].Strict || g.ToolChoice.Mode != ToolRequired || g.ParallelToolCalls {
			t.Fatalf("backend saw %+v", g)
		}

		evs := responsesEvents(t, s, strings.Replace(body, `"input"`, `"stream":true,"input"`, 1))
		type item struct{ typ, args, done string }
		var items []item
		for _, e := range evs {
			switch e.name {
			case "response.output_item.added":
				if int(e.data["output_index"].(float64)) != len(items) {
					t.Fatalf("item added at %v, %d before", e.data["output_index"], len(items))
				}
				items = append(items, item{typ: dig(e.data, "item", "type").(string)})
			case "response.function_call_arguments.delta":
				items[len(items)-1].args += e.data["delta"].(string)
			case "response.function_call_arguments.done":
				items[len(items)-1].done = e.data["arguments"].(string)
			}
		}
		if pieces != nil {
			if items[0].typ != "message" {
				t.Fatalf("items %v", items)
			}
			items = items[1:]
		}
		last := evs[len(evs)-1].data
		if len(items) != 2 || items[0] != (item{"function_call", `{"city":"Paris"}`, `{"city":"Paris"}`}) || items[1].done != `{"tz":"CET"}` ||
			dig(last, "response", "output", len(pieces)+1, "arguments") != `{"tz":"CET"}` {
			t.Fatalf("streamed items %v, last %v", items, last)
		}
	}
}

// The round trip: function_call items (after the assistant's text) make
// one assistant turn, function_call_output items tool messages naming the
// call and its function.
func TestResponsesToolRoundTrip(t *testing.T) {
	b := &scripted{pieces: []string{"Sunny."}}
	s := New(Config{Backend: b})
	w := post(t, s, "/v1/responses", `{"model":"tiny",`+responsesTools+`,"tool_choice":{"type":"function","name":"get_time"},"input":[
		{"role":"user","content":"weather?"},
		{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Checking."}]},
		{"type":"function_call","id":"fc_1","call_id":"call_1","name":"get_weather","arguments":"{\"city\": \"Paris\"}","status":"completed"},
		{"type":"function_call","call_id":"call_2","name":"get_time","arguments":"{}"},
		{"type":"function_call_output","call_id":"call_1","output":"18C"},
		{"type":"function_call_output","call_id":"call_2","output":[{"type":"input_text","text":"noon"}]}]}`)
	if w.Code != 200 {
		t.Fatalf("status %d: %s", w.Code, w.Body.String())
	}
	g := b.seen.Load()
	want := []Message{{Role: "user", Content: "weather?"},
		{Role: "assistant", Content: "Checking.", ToolCalls: []ToolCall{{ID: "call_1", Name: "get_weather", Arguments: `{"city":"Paris"}`}, {ID: "call_2", Name: "get_time", Arguments: `{}`}}},
		{Role: "tool", Content: "18C", ToolCallID: "call_1", Name: "get_weather"},
		{Role: "tool", Content: "noon", ToolCallID: "call_2", Name: "get_time"}}
	if fmt.Sprint(g.Messages) != fmt.Sprint(want) || g.ToolChoice != (ToolChoice{Mode: ToolFunction, Name: "get_time"}) {
		t.Fatalf("backend saw %+v", g.Messages)
	}
}

func TestResponsesValidation(t *testing.T) {
	s := New(Config{Backend: &scripted{pieces: []string{"a"}}})
	body := func(extra string) string { return `{"model":"tiny","input":"hi"` + extra + `}` }
	for _, c := range []struct{ name, body, param string }{
		{"unknown", body(`,"frobnicate":1`), "frobnicate"},
		{"no input", `{"model":"tiny"}`, "input"},
		{"no model", `{"input":"hi"}`, "model"},
		{"empty input", `{"model":"tiny","input":""}`, "input"},
		{"empty items", `{"model":"tiny","input":[]}`, "input"},
		{"store", body(`,"store":true`), "store"},
		{"previous_response_id", body(`,"previous_response_id":"resp_1"`), "previous_response_id"},
		{"background", body(`,"background":true`), "background"},
		{"include", body(`,"include":["message.output_text.logprobs"]`), "include"},
		{"truncation", body(`,"truncation":"auto"`), "truncation"},
		{"reasoning", body(`,"reasoning":{"effort":"low"}`), "reasoning"},
		{"temperature", body(`,"temperature":3`), "temperature"},
		{"max_output_tokens", body(`,"max_output_tokens":0`), "max_output_tokens"},
		{"metadata", body(`,"metadata":{"k":1}`), "metadata"},
		{"item type", `{"model":"tiny","input":[{"type":"reasoning","summary":[]}]}`, "input[0].type"},
		{"role", `{"model":"tiny","input":[{"role":"tool","content":"x"}]}`, "input[0].role"},
		{"image", `{"model":"tiny","input":[{"role":"user","content":[{"type":"input_image","image_url":"x"}]}]}`, "input[0].content[0].type"},
		{"output_text from user", `{"model":"tiny","input":[{"role":"user","content":[{"type":"output_text","text":"x"}]}]}`, "input[0].content[0].type"},
		{"call arguments", `{"model":"tiny","input":[{"type":"function_call","call_id":"c","name":"f","arguments":"{nope"}]}`, "input[0].arguments"},
		{"call name", `{"model":"tiny","input":[{"type":"function_call","call_id":"c","name":"a b","arguments":"{}"}]}`, "input[0].name"},
		{"output without call_id", `{"model":"tiny","input":[{"type":"function_call_output","output":"x"}]}`, "input[0].call_id"},
		{"tool type", body(`,"tools":[{"type":"web_search"}]`), "tools[0].type"},
		{"tool field", body(`,"tools":[{"type":"function","name":"f","x":1}]`), "tools[0].x"},
		{"tool name", body(`,"tools":[{"type":"function","name":"a b"}]`), "tools[0].name"},
		{"tool params", body(`,"tools":[{"type":"function","name":"f","parameters":{"type":"string"}}]`), "tools[0].parameters"},
		{"tool_choice", body(`,"tool_choice":"sometimes"`), "tool_choice"},
		{"tool_choice type", body(`,"tool_choice":{"type":"web_search"}`), "tool_choice.type"},
		{"tool_choice missing", body(`,` + responsesTools + `,"tool_choice":{"type":"function","name":"nope"}`), "tool_choice"},
		{"format type", body(`,"text":{"format":{"type":"yaml"}}`), "text.format"},
		{"format schema", body(`,"text":{"format":{"type":"json_schema","name":"x"}}`), "text.format"},
		{"format field", body(`,"text":{"format":{"type":"text","schema":{}}}`), "text.format.schema"},
		{"verbosity", body(`,"text":{"verbosity":"low"}`), "text.verbosity"},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := post(t, s, "/v1/responses", c.body)
			if w.Code != 400 {
				t.Fatalf("status %d, want 400: %s", w.Code, w.Body.String())
			}
			e := decodeErr(t, w)
			if e.Error.Param != c.param || e.Error.Type != "invalid_request_error" {
				t.Fatalf("error %+v, want param %q", e.Error, c.param)
			}
		})
	}
}

func TestResponsesBackendErrors(t *testing.T) {
	backendErrors(t, "/v1/responses", `{"model":"nope","input":"hi","stream":%s}`,
		func(t *testing.T, w *httptest.ResponseRecorder) { decodeErr(t, w) })
	_, stream := lateFailure(t, "/v1/responses", `{"model":"tiny","input":"hi","stream":true}`)
	evs := namedEvents(t, strings.NewReader(stream))
	last := evs[len(evs)-1]
	if last.name != "response.failed" || dig(last.data, "response", "status") != "failed" ||
		dig(last.data, "response", "error", "code") != "generation_failed" {
		t.Fatalf("late failure: %v %s", eventNames(evs), last.raw)
	}
	s := New(Config{Backend: &scripted{}, APIKey: "k"})
	if w := post(t, s, "/v1/responses", `{"model":"tiny","input":"hi"}`); w.Code != 401 || decodeErr(t, w).Error.Code != "invalid_api_key" {
		t.Fatalf("no key: %d", w.Code)
	}
	if w := post(t, s, "/v1/responses", `{"model":"tiny","input":"hi"}`, "x-api-key", "k"); w.Code != 401 {
		t.Fatalf("x-api-key on /v1/responses: %d", w.Code)
	}
	if w := post(t, s, "/v1/responses", `{"model":"tiny","input":"hi"}`, "Authorization", "Bearer k"); w.Code != 200 {
		t.Fatalf("key: %d", w.Code)
	}
}

// OpenAI's Go SDK reads the Responses API: text, streamed text and
// function calls.
func TestResponsesOpenAISDK(t *testing.T) {
	b := &scripted{pieces: []string{"Hello", " SDK"}}
	srv := httptest.NewServer(New(Config{Backend: b, APIKey: "k"}))
	defer srv.Close()
	client := openai.NewClient(option.WithBaseURL(srv.URL+"/v1/"), option.WithAPIKey("k"), option.WithMaxRetries(0))
	ctx := context.Background()
	params := responses.ResponseNewParams{Model: "tiny", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")},
		Instructions: openai.String("be brief"), MaxOutputTokens: openai.Int(20)}
	resp, err := client.Responses.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if resp.OutputText() != "Hello SDK" || resp.Status != "completed" || resp.Usage.OutputTokens != 2 || resp.Model != "tiny" {
		t.Fatalf("response %+v", resp)
	}
	st := client.Responses.NewStreaming(ctx, params)
	text, final := "", ""
	for st.Next() {
		ev := st.Current()
		switch ev.Type {
		case "response.output_text.delta":
			text += ev.Delta
		case "response.completed":
			final = ev.Response.OutputText()
		}
	}
	if err := st.Err(); err != nil || text != "Hello SDK" || final != "Hello SDK" {
		t.Fatalf("stream: %q %q %v", text, final, err)
	}

	b.pieces, b.calls = nil, weatherCalls
	params.Tools = []responses.ToolUnionParam{responses.ToolParamOfFunction("get_weather", map[string]any{"type": "object"}, true),
		responses.ToolParamOfFunction("get_time", map[string]any{"type": "object"}, false)}
	params.ToolChoice = responses.ResponseNewParamsToolChoiceUnion{OfFunctionTool: &responses.ToolChoiceFunctionParam{Name: "get_weather"}}
	resp, err = client.Responses.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Output) != 2 || resp.Output[0].Type != "function_call" || resp.Output[0].CallID != "toolu_1" || resp.Output[0].Name != "get_weather" ||
		resp.Output[0].Arguments.OfString != `{"city":"Paris"}` {
		t.Fatalf("calls %s", resp.RawJSON())
	}
	if g := b.seen.Load(); g.ToolChoice != (ToolChoice{Mode: ToolFunction, Name: "get_weather"}) || !g.Tools[0].Strict || g.Tools[1].Strict {
		t.Fatalf("backend saw %+v", g)
	}
	// The results go back as input items.
	b.pieces, b.calls = []string{"Sunny."}, nil
	params.ToolChoice = responses.ResponseNewParamsToolChoiceUnion{}
	params.Input = responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{
		responses.ResponseInputItemParamOfMessage("weather?", responses.EasyInputMessageRoleUser),
		responses.ResponseInputItemParamOfFunctionCall(`{"city":"Paris"}`, "toolu_1", "get_weather"),
		{OfFunctionCallOutput: &responses.ResponseInputItemFunctionCallOutputParam{CallID: openai.String("toolu_1"),
			Output: responses.ResponseInputItemFunctionCallOutputOutputUnionParam{OfString: openai.String("18C")}}},
	}}
	resp, err = client.Responses.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	g := b.seen.Load()
	if resp.OutputText() != "Sunny." || len(g.Messages) != 4 || g.Messages[2].ToolCalls[0].Name != "get_weather" ||
		g.Messages[3].Role != "tool" || g.Messages[3].Content != "18C" || g.Messages[3].Name != "get_weather" {
		t.Fatalf("round trip: %q, backend saw %+v", resp.OutputText(), g.Messages)
	}
}
