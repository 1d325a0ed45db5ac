package api

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// OpenAI's Responses API (POST /v1/responses) over the same Backend: the
// input items become a GenerateRequest (validated by checkGen) and the
// answer is a response object with message and function_call output
// items, whole or as its typed server-sent events. Nothing is stored:
// store must be false or absent and previous_response_id is refused (send
// the whole conversation as input). docs/api.md lists what it accepts and
// refuses.

// responsesRequest is a parsed /v1/responses body.
type responsesRequest struct {
	gen    GenerateRequest
	stream bool
	echo   responseObject // the request's settings, as every response object repeats them
}

var responsesNames = FieldNames{Tools: "tools", ToolName: ".name", ToolParams: ".parameters",
	ToolChoice: "tool_choice", Format: "text.format", TopLogprobs: "top_logprobs"}

// parseResponses validates a /v1/responses body.
func parseResponses(body []byte) (*responsesRequest, *Error) {
	o, e := bodyObject(body, "model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "stream",
		"tools", "tool_choice", "parallel_tool_calls", "text", "store", "previous_response_id", "metadata", "user",
		"truncation", "background", "include")
	if e != nil {
		return nil, e
	}
	if e := o.need("model", "input"); e != nil {
		return nil, e
	}
	r := &responsesRequest{gen: GenerateRequest{Temperature: 1, TopP: 1, Seed: randomSeed(), ParallelToolCalls: true}}
	g := &r.gen
	if e := o.str("model", &g.Model, true); e != nil {
		return nil, e
	}
	for _, c := range []struct{ name, want, why string }{
		{"store", "false", "nothing is stored: only false (or absent)"},
		{"background", "false", "background responses are not supported"},
		{"include", "[]", "no additional output data is available"},
		{"truncation", `"disabled"`, `only "disabled": an input longer than the context is refused`},
	} {
		if o.has(c.name) && !jsonEqual(o.raw(c.name), c.want) {
			return nil, unsupported(c.name, c.why)
		}
	}
	if o.has("previous_response_id") {
		return nil, unsupported("previous_response_id", "nothing is stored: send the whole conversation as input")
	}
	// cmp.Or: the first error, the fields taken in this order.
	if e := cmp.Or(o.optBool("stream", &r.stream), o.optInt("max_output_tokens", &g.MaxTokens, 1, MaxTokensLimit),
		o.optFloat("temperature", &g.Temperature, 0, 2), o.optFloat("top_p", &g.TopP, 0, 1),
		o.optBool("parallel_tool_calls", &g.ParallelToolCalls)); e != nil {
		return nil, e
	}
	if o.has("max_output_tokens") {
		r.echo.MaxOutputTokens = g.MaxTokens
	}
	if o.has("user") {
		var u string
		if e := o.str("user", &u, false); e != nil {
			return nil, e
		}
		r.echo.User = u
	}
	r.echo.Metadata = map[string]string{}
	if o.has("metadata") && json.Unmarshal(o.raw("metadata"), &r.echo.Metadata) != nil {
		return nil, BadRequest("metadata", `"metadata" must be an object of strings`)
	}
	if len(r.echo.Metadata) > 16 {
		return nil, BadRequest("metadata", `"metadata" holds at most 16 pairs`)
	}
	if o.has("instructions") {
		var in string
		if e := o.str("instructions", &in, false); e != nil {
			return nil, e
		}
		r.echo.Instructions = in
		appendSystem(g, in)
	}
	if e := parseAll(o, g, parseResponsesInput, parseResponsesTools, parseResponsesToolChoice, parseResponsesText); e != nil {
		return nil, e
	}
	r.echo.ToolChoice = "auto"
	if o.has("tool_choice") {
		r.echo.ToolChoice = json.RawMessage(o.raw("tool_choice"))
	}
	if e := checkGen(g, responsesNames); e != nil {
		return nil, e
	}
	r.echo.fill(g)
	return r, nil
}

// parseResponsesInput maps input: a string (one user turn) or items:
// messages, function_call (an assistant's call; consecutive calls and
// the assistant text before them make one turn) and function_call_output
// (a tool message).
func parseResponsesInput(o jobj, g *GenerateRequest) *Error {
	if s, ok := o.strValue("input"); ok {
		if s == "" {
			return BadRequest("input", `"input" must not be empty`)
		}
		g.Messages = append(g.Messages, Message{Role: "user", Content: s})
		return nil
	}
	names := map[string]string{} // call_id → function name
	if e := o.objects("input", 1, MaxMessages, func(it jobj) *Error { return responsesItem(it, g, names) }); e != nil {
		return e
	}
	if len(g.Messages) > MaxMessages {
		return BadRequest("input", "at most %d messages, got %d", MaxMessages, len(g.Messages))
	}
	return nil
}

// responsesItem maps an input item.
func responsesItem(it jobj, g *GenerateRequest, names map[string]string) *Error {
	typ := "message"
	if e := it.optStr("type", &typ, true); e != nil {
		return e
	}
	switch typ {
	case "message":
		m, e := responsesMessage(it)
		if e != nil {
			return e
		}
		g.Messages = append(g.Messages, m)
	case "function_call":
		if e := it.known("function_call items carry type, call_id, name, arguments, id and status",
			"type", "call_id", "name", "arguments", "id", "status"); e != nil {
			return e
		}
		var c ToolCall
		if e := it.need("call_id", "name", "arguments"); e != nil {
			return e
		}
		if e := it.toolCallID("call_id", &c.ID); e != nil {
			return e
		}
		if e := it.funcName("name", &c.Name); e != nil {
			return e
		}
		var args string
		if e := it.str("arguments", &args, false); e != nil {
			return e
		}
		text, e := argsText(json.RawMessage(args), it.k("arguments"))
		if e != nil {
			return e
		}
		c.Arguments = text
		names[c.ID] = c.Name
		if n := len(g.Messages); n > 0 && g.Messages[n-1].Role == "assistant" {
			g.Messages[n-1].ToolCalls = append(g.Messages[n-1].ToolCalls, c)
		} else {
			g.Messages = append(g.Messages, Message{Role: "assistant", ToolCalls: []ToolCall{c}})
		}
	case "function_call_output":
		if e := it.known("function_call_output items carry type, call_id, output, id and status",
			"type", "call_id", "output", "id", "status"); e != nil {
			return e
		}
		m, e := it.toolResult("call_id", names)
		if e == nil {
			e = it.need("output")
		}
		if e == nil {
			m.Content, e = responsesText(it.raw("output"), it.k("output"), "input_text")
		}
		if e != nil {
			return e
		}
		g.Messages = append(g.Messages, m)
	default:
		return unsupported(it.k("type"), fmt.Sprintf("input item type %q is not supported (message, function_call, function_call_output)", typ))
	}
	return nil
}

// responsesMessage is a message item: roles user, system, developer (as
// system) with input_text parts and assistant with output_text parts.
func responsesMessage(it jobj) (Message, *Error) {
	var m Message
	if e := it.known("message items carry type, role, content, id and status", "type", "role", "content", "id", "status"); e != nil {
		return m, e
	}
	if e := it.needStr("role", &m.Role, true); e != nil {
		return m, e
	}
	part := "input_text"
	switch m.Role {
	case "user", "system":
	case "developer":
		m.Role = "system"
	case "assistant":
		part = "output_text"
	default:
		return m, unsupported(it.k("role"), fmt.Sprintf("role %q is not supported (user, system, developer, assistant)", m.Role))
	}
	if e := it.need("content"); e != nil {
		return m, e
	}
	c, e := responsesText(it.raw("content"), it.k("content"), part)
	m.Content = c
	return m, e
}

// responsesText is a string or an array of text parts of type part
// (joined with \n).
func responsesText(raw json.RawMessage, p, part string) (string, *Error) {
	return textParts(raw, p, part+" parts", func(po jobj) (string, *Error) {
		var typ, text string
		if e := po.str("type", &typ, true); e != nil {
			return "", e
		}
		if typ != part {
			return "", unsupported(po.k("type"), fmt.Sprintf("content part type %q is not supported here (%s)", typ, part))
		}
		if e := po.known("text parts carry type, text, annotations and logprobs", "type", "text", "annotations", "logprobs"); e != nil {
			return "", e
		}
		if e := po.needStr("text", &text, false); e != nil {
			return "", e
		}
		return text, nil
	})
}

func parseResponsesTools(o jobj, g *GenerateRequest) *Error {
	// strict defaults to true in the Responses API.
	return o.tools(g, Tool{Strict: true}, func(to jobj, t *Tool) *Error {
		var typ string
		if e := to.needStr("type", &typ, true); e != nil {
			return e
		}
		if typ != "function" {
			return unsupported(to.k("type"), fmt.Sprintf("tool type %q is not supported: function tools only", typ))
		}
		if e := to.known("function tools carry type, name, description, parameters and strict",
			"type", "name", "description", "parameters", "strict"); e != nil {
			return e
		}
		return to.functionTool(t, "parameters", false)
	})
}

// parseResponsesToolChoice maps tool_choice: "auto", "none", "required"
// or {"type": "function", "name": …}.
func parseResponsesToolChoice(o jobj, g *GenerateRequest) *Error {
	if !o.has("tool_choice") {
		return nil
	}
	if s, ok := o.strValue("tool_choice"); ok {
		switch s {
		case "auto", "none", "required":
			g.ToolChoice = ToolChoice{Mode: s}
			return nil
		}
		return BadRequest("tool_choice", `unknown tool_choice %q (auto, none, required, or {"type": "function", "name": …})`, s)
	}
	tc, e := o.object("tool_choice")
	if e != nil {
		return BadRequest("tool_choice", `"tool_choice" must be auto, none, required, or {"type": "function", "name": …}`)
	}
	if !jsonEqual(tc.raw("type"), `"function"`) {
		return unsupported("tool_choice.type", `only {"type": "function", "name": …} names a tool`)
	}
	if e := tc.known(whyUnknown, "type", "name"); e != nil {
		return e
	}
	g.ToolChoice = ToolChoice{Mode: ToolFunction}
	return tc.needStr("name", &g.ToolChoice.Name, true)
}

// parseResponsesText maps text.format: text, json_object or json_schema
// {name, schema, strict, description}.
func parseResponsesText(o jobj, g *GenerateRequest) *Error {
	f, found, e := o.nested("text", "format", whyUnknown)
	if !found {
		return e
	}
	if e := f.known(whyUnknown, "type", "name", "schema", "strict", "description"); e != nil {
		return e
	}
	if e := f.needStr("type", &g.Format.Type, true); e != nil {
		return e
	}
	if g.Format.Type != FormatJSONSchema {
		for _, k := range []string{"name", "schema", "strict", "description"} {
			if f.has(k) {
				return BadRequest(f.k(k), "%s is only for json_schema formats", k)
			}
		}
		return nil
	}
	var d string
	if e := cmp.Or(f.optStr("name", &g.Format.Name, false), f.optStr("description", &d, false),
		f.optBool("strict", &g.Format.Strict)); e != nil {
		return e
	}
	g.Format.Schema = f.raw("schema")
	return nil
}

// Responses.

// responseObject is the Responses API's response object.
type responseObject struct {
	ID                 string            `json:"id"`
	Object             string            `json:"object"`
	CreatedAt          int64             `json:"created_at"`
	Status             string            `json:"status"`
	Error              *responseError    `json:"error"`
	IncompleteDetails  *incomplete       `json:"incomplete_details"`
	Instructions       any               `json:"instructions"`
	MaxOutputTokens    any               `json:"max_output_tokens"`
	Model              string            `json:"model"`
	Output             []any             `json:"output"`
	ParallelToolCalls  bool              `json:"parallel_tool_calls"`
	PreviousResponseID any               `json:"previous_response_id"`
	Reasoning          map[string]any    `json:"reasoning"`
	Store              bool              `json:"store"`
	Temperature        float32           `json:"temperature"`
	Text               map[string]any    `json:"text"`
	ToolChoice         any               `json:"tool_choice"`
	Tools              []any             `json:"tools"`
	TopP               float32           `json:"top_p"`
	Truncation         string            `json:"truncation"`
	Usage              *responseUsage    `json:"usage"`
	User               any               `json:"user"`
	Metadata           map[string]string `json:"metadata"`
	Meshp2p            *extension        `json:"meshp2p,omitempty"`
}

type responseError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

type incomplete struct {
	Reason string `json:"reason"`
}

type responseUsage struct {
	InputTokens         int            `json:"input_tokens"`
	InputTokensDetails  map[string]int `json:"input_tokens_details"`
	OutputTokens        int            `json:"output_tokens"`
	OutputTokensDetails map[string]int `json:"output_tokens_details"`
	TotalTokens         int            `json:"total_tokens"`
}

type responseMessage struct {
	Type    string         `json:"type"`
	ID      string         `json:"id"`
	Status  string         `json:"status"`
	Role    string         `json:"role"`
	Content []responseText `json:"content"`
}

type responseText struct {
	Type        string `json:"type"`
	Text        string `json:"text"`
	Annotations []any  `json:"annotations"`
	Logprobs    []any  `json:"logprobs"`
}

func outputText(s string) responseText {
	return responseText{Type: "output_text", Text: s, Annotations: []any{}, Logprobs: []any{}}
}

type responseCall struct {
	Type      string `json:"type"`
	ID        string `json:"id"`
	CallID    string `json:"call_id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
	Status    string `json:"status"`
}

// fill sets the echoed settings from the validated request.
func (r *responseObject) fill(g *GenerateRequest) {
	r.Object, r.Status, r.Output, r.Truncation = "response", "in_progress", []any{}, "disabled"
	r.Model, r.Temperature, r.TopP, r.ParallelToolCalls = g.Model, g.Temperature, g.TopP, g.ParallelToolCalls
	r.Reasoning = map[string]any{"effort": nil, "summary": nil}
	format := map[string]any{"type": FormatText}
	switch g.Format.Type {
	case FormatJSONObject:
		format["type"] = FormatJSONObject
	case FormatJSONSchema:
		format = map[string]any{"type": FormatJSONSchema, "name": g.Format.Name, "schema": g.Format.Schema, "strict": g.Format.Strict}
	}
	r.Text = map[string]any{"format": format}
	r.Tools = []any{}
	for _, t := range g.Tools {
		params := t.Parameters
		if params == nil {
			params = json.RawMessage("null")
		}
		r.Tools = append(r.Tools, map[string]any{"type": "function", "name": t.Name, "description": t.Description,
			"parameters": params, "strict": t.Strict})
	}
}

// done sets what a finished generation reports: status, usage and the
// extension.
func (r *responseObject) done(res *GenerateResult) {
	r.Status = "completed"
	if res.Length && len(res.ToolCalls) == 0 {
		r.Status, r.IncompleteDetails = "incomplete", &incomplete{Reason: "max_output_tokens"}
	}
	r.Usage = &responseUsage{InputTokens: res.PromptTokens, InputTokensDetails: map[string]int{"cached_tokens": res.CachedTokens},
		OutputTokens: res.CompletionTokens, OutputTokensDetails: map[string]int{"reasoning_tokens": 0},
		TotalTokens: res.PromptTokens + res.CompletionTokens}
	r.Model = modelOr(res.Model, r.Model)
	r.Meshp2p = final(res)
}

func (s *Server) responses(w http.ResponseWriter, r *http.Request) {
	req, ok := readRequest(s, w, r, writeError, parseResponses)
	if !ok {
		return
	}
	base := req.echo
	base.ID, base.CreatedAt = "resp_"+randomID(), time.Now().Unix()
	s.serveGen(w, r, &req.gen, req.stream, shape{
		writeErr: writeError,
		respond: func(u update) any {
			resp := base
			resp.done(u.Res)
			resp.Output = []any{}
			if u.Text != "" || len(u.Res.ToolCalls) == 0 {
				status := "completed"
				if resp.Status == "incomplete" {
					status = "incomplete"
				}
				resp.Output = append(resp.Output, responseMessage{Type: "message", ID: "msg_" + randomID(), Status: status,
					Role: "assistant", Content: []responseText{outputText(u.Text)}})
			}
			for _, c := range u.Res.ToolCalls {
				resp.Output = append(resp.Output, responseCall{Type: "function_call", ID: "fc_" + randomID(), CallID: idOr(c.ID, "call_"),
					Name: c.Name, Arguments: c.Arguments, Status: "completed"})
			}
			return resp
		},
		stream: func(ew *eventWriter) streamer { return &responsesStream{ew: ew, resp: base} },
	})
}

// responsesStream writes the Responses API's events: response.created,
// response.in_progress; per output item response.output_item.added, for
// a message response.content_part.added, response.output_text.delta…,
// response.output_text.done and response.content_part.done, for a call
// response.function_call_arguments.delta… and .done, then
// response.output_item.done; finally response.completed (or
// response.incomplete at max_output_tokens, response.failed on an error).
// Every event carries a sequence_number.
type responsesStream struct {
	ew   *eventWriter
	resp responseObject
	seq  int
	msg  *responseMessage // the open message item
	call *responseCall    // the open function_call item
	idx  int              // the open call's ToolCallDelta.Index
	text strings.Builder  // the open message's text
}

func (rs *responsesStream) send(typ string, ev map[string]any) bool {
	ev["type"], ev["sequence_number"] = typ, rs.seq
	rs.seq++
	return rs.ew.event(typ, ev)
}

func (rs *responsesStream) start(u update) bool {
	rs.resp.Model = modelOr(u.Route.Model, rs.resp.Model)
	rs.ew.open("text/event-stream")
	return rs.send("response.created", map[string]any{"response": rs.resp}) &&
		rs.send("response.in_progress", map[string]any{"response": rs.resp})
}

func (rs *responsesStream) openMessage() bool {
	if !rs.closeCall() {
		return false
	}
	rs.msg = &responseMessage{Type: "message", ID: "msg_" + randomID(), Status: "in_progress", Role: "assistant", Content: []responseText{}}
	rs.text.Reset()
	i := len(rs.resp.Output)
	return rs.send("response.output_item.added", map[string]any{"output_index": i, "item": rs.msg}) &&
		rs.send("response.content_part.added", map[string]any{"item_id": rs.msg.ID, "output_index": i, "content_index": 0,
			"part": outputText("")})
}

func (rs *responsesStream) closeMessage(status string) bool {
	if rs.msg == nil {
		return true
	}
	m, i, text := rs.msg, len(rs.resp.Output), rs.text.String()
	rs.msg = nil
	m.Status, m.Content = status, []responseText{outputText(text)}
	rs.resp.Output = append(rs.resp.Output, *m)
	return rs.send("response.output_text.done", map[string]any{"item_id": m.ID, "output_index": i, "content_index": 0,
		"text": text, "logprobs": []any{}}) &&
		rs.send("response.content_part.done", map[string]any{"item_id": m.ID, "output_index": i, "content_index": 0,
			"part": m.Content[0]}) &&
		rs.send("response.output_item.done", map[string]any{"output_index": i, "item": m})
}

func (rs *responsesStream) closeCall() bool {
	if rs.call == nil {
		return true
	}
	c, i := rs.call, len(rs.resp.Output)
	rs.call = nil
	c.Status = "completed"
	rs.resp.Output = append(rs.resp.Output, *c)
	return rs.send("response.function_call_arguments.done", map[string]any{"item_id": c.ID, "output_index": i,
		"name": c.Name, "arguments": c.Arguments}) &&
		rs.send("response.output_item.done", map[string]any{"output_index": i, "item": c})
}

func (rs *responsesStream) delta(u update) bool { return u.each(rs.piece) }

// piece writes one delta.
func (rs *responsesStream) piece(u update) bool {
	if u.Text != "" {
		if rs.msg == nil && !rs.openMessage() {
			return false
		}
		rs.text.WriteString(u.Text)
		if !rs.send("response.output_text.delta", map[string]any{"item_id": rs.msg.ID, "output_index": len(rs.resp.Output),
			"content_index": 0, "delta": u.Text, "logprobs": []any{}}) {
			return false
		}
	}
	for _, d := range u.ToolCalls {
		if rs.call == nil || d.Index != rs.idx {
			if !rs.closeMessage("completed") || !rs.closeCall() {
				return false
			}
			rs.call = &responseCall{Type: "function_call", ID: "fc_" + randomID(), CallID: idOr(d.ID, "call_"), Name: d.Name, Status: "in_progress"}
			rs.idx = d.Index
			if !rs.send("response.output_item.added", map[string]any{"output_index": len(rs.resp.Output), "item": rs.call}) {
				return false
			}
		}
		if d.Arguments != "" {
			rs.call.Arguments += d.Arguments
			if !rs.send("response.function_call_arguments.delta", map[string]any{"item_id": rs.call.ID,
				"output_index": len(rs.resp.Output), "delta": d.Arguments}) {
				return false
			}
		}
	}
	return true
}

func (rs *responsesStream) finish(res *GenerateResult) {
	rs.resp.done(res)
	status := "completed"
	if rs.resp.Status == "incomplete" {
		status = "incomplete"
	}
	if len(rs.resp.Output) == 0 && rs.msg == nil && rs.call == nil && !rs.openMessage() {
		return
	}
	if !rs.closeMessage(status) || !rs.closeCall() {
		return
	}
	ev := "response.completed"
	if rs.resp.Status == "incomplete" {
		ev = "response.incomplete"
	}
	rs.send(ev, map[string]any{"response": rs.resp})
}

func (rs *responsesStream) fail(e *Error) {
	rs.resp.Status = "failed"
	code, _ := e.Code.(string)
	if code == "" {
		code = "server_error"
	}
	rs.resp.Error = &responseError{Code: code, Message: e.Message}
	rs.send("response.failed", map[string]any{"response": rs.resp})
}
