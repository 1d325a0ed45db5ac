package api

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Anthropic's Messages API (POST /v1/messages) over the same Backend as
// the OpenAI endpoints: a thin adapter that maps the request to a
// GenerateRequest (validated by checkGen, as every shape is), runs it
// through the shared machinery (admit, startRun, logRun) and answers in
// Anthropic's shapes: the message object, its server-sent events and its
// error objects. docs/api.md lists what it accepts and refuses. The end
// of this file holds what the three adapters (Anthropic, Ollama,
// Responses) share: request objects whose errors name the field at fault
// (jobj), the generation driver (serveGen, drive) and event writers.

// anthropicRequest is a parsed /v1/messages body.
type anthropicRequest struct {
	gen    GenerateRequest
	stream bool
}

// anthropicNames are the Messages API's names of the fields checkGen checks.
var anthropicNames = FieldNames{Tools: "tools", ToolName: ".name", ToolParams: ".input_schema",
	ToolChoice: "tool_choice", Format: "output_config.format", TopLogprobs: "top_logprobs"}

// whyUnknown is the reason every unknown field is refused with.
const whyUnknown = "this gateway does not implement it (docs/api.md lists the supported fields)"

// parseAnthropic validates a /v1/messages body.
func parseAnthropic(body []byte) (*anthropicRequest, *Error) {
	o, e := bodyObject(body)
	if e != nil {
		return nil, e
	}
	if e := o.known(whyUnknown, "model", "max_tokens", "messages", "system", "stop_sequences", "temperature", "top_p",
		"top_k", "stream", "tools", "tool_choice", "metadata", "output_config", "thinking"); e != nil {
		return nil, e
	}
	for _, k := range []string{"model", "max_tokens", "messages"} {
		if !o.has(k) {
			return nil, BadRequest(k, "missing required field %q", k)
		}
	}
	r := &anthropicRequest{gen: GenerateRequest{Temperature: 1, TopP: 1, Seed: randomSeed(), ParallelToolCalls: true}}
	g := &r.gen
	if e := o.str("model", &g.Model, true); e != nil {
		return nil, e
	}
	if e := o.integer("max_tokens", &g.MaxTokens, 1, MaxTokensLimit); e != nil {
		return nil, e
	}
	for _, c := range []struct {
		name   string
		dst    *float32
		lo, hi float64
	}{{"temperature", &g.Temperature, 0, 1}, {"top_p", &g.TopP, 0, 1}} {
		if o.has(c.name) {
			if e := o.float(c.name, c.dst, c.lo, c.hi); e != nil {
				return nil, e
			}
		}
	}
	if o.has("top_k") {
		if e := o.integer("top_k", &g.TopK, 0, MaxTopK); e != nil {
			return nil, e
		}
	}
	if o.has("stream") {
		if e := o.boolean("stream", &r.stream); e != nil {
			return nil, e
		}
	}
	if o.has("stop_sequences") {
		if e := o.stops("stop_sequences", &g.Stops, false); e != nil {
			return nil, e
		}
	}
	if o.has("metadata") {
		m, e := subObject(o.raw("metadata"), "metadata")
		if e == nil {
			e = m.known("metadata carries user_id only", "user_id")
		}
		if e == nil && m.has("user_id") {
			var id string
			e = m.str("user_id", &id, false)
		}
		if e != nil {
			return nil, e
		}
	}
	if o.has("thinking") {
		t, e := subObject(o.raw("thinking"), "thinking")
		var typ string
		if e == nil {
			e = t.str("type", &typ, true)
		}
		if e != nil {
			return nil, e
		}
		if typ != "disabled" {
			return nil, unsupported("thinking", `extended thinking is not supported: only {"type": "disabled"}`)
		}
	}
	if o.has("output_config") {
		if e := parseAnthropicOutput(o, g); e != nil {
			return nil, e
		}
	}
	if o.has("system") {
		s, e := anthropicText(o.raw("system"), "system")
		if e != nil {
			return nil, e
		}
		if s != "" {
			g.Messages = append(g.Messages, Message{Role: "system", Content: s})
		}
	}
	if e := parseAnthropicMessages(o, g); e != nil {
		return nil, e
	}
	if o.has("tools") {
		if e := parseAnthropicTools(o, g); e != nil {
			return nil, e
		}
	}
	if o.has("tool_choice") {
		if e := parseAnthropicToolChoice(o, g); e != nil {
			return nil, e
		}
	}
	if e := checkGen(g, anthropicNames); e != nil {
		return nil, e
	}
	return r, nil
}

// parseAnthropicOutput accepts output_config.format (structured outputs:
// {"type": "json_schema", "schema": {…}}).
func parseAnthropicOutput(o jobj, g *GenerateRequest) *Error {
	oc, e := subObject(o.raw("output_config"), "output_config")
	if e != nil {
		return e
	}
	if e := oc.known("output_config carries format only (no effort)", "format"); e != nil {
		return e
	}
	if !oc.has("format") {
		return nil
	}
	f, e := subObject(oc.raw("format"), "output_config.format")
	if e != nil {
		return e
	}
	if e := f.known(whyUnknown, "type", "schema"); e != nil {
		return e
	}
	var typ string
	if e := f.str("type", &typ, true); e != nil {
		return e
	}
	if typ != "json_schema" {
		return unsupported("output_config.format.type", fmt.Sprintf("format type %q is not supported (json_schema)", typ))
	}
	if !f.has("schema") {
		return BadRequest("output_config.format.schema", "json_schema needs a schema")
	}
	g.Format = ResponseFormat{Type: FormatJSONSchema, Schema: f.raw("schema"), Strict: true}
	return nil
}

// anthropicText is a string or an array of text blocks (joined with \n),
// as system prompts and tool results carry them.
func anthropicText(raw json.RawMessage, p string) (string, *Error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var blocks []json.RawMessage
	if json.Unmarshal(raw, &blocks) != nil {
		return "", BadRequest(p, "%q must be a string or an array of text blocks", p)
	}
	texts := make([]string, 0, len(blocks))
	for j, b := range blocks {
		bp := fmt.Sprintf("%s[%d]", p, j)
		bo, e := subObject(b, bp)
		if e != nil {
			return "", e
		}
		var typ string
		if e := bo.str("type", &typ, true); e != nil {
			return "", e
		}
		if typ != "text" {
			return "", unsupported(bp+".type", fmt.Sprintf("block type %q is not supported here (text only)", typ))
		}
		t, e := anthropicTextBlock(bo)
		if e != nil {
			return "", e
		}
		texts = append(texts, t)
	}
	return strings.Join(texts, "\n"), nil
}

// anthropicTextBlock is a text block's text; cache_control is accepted
// and ignored (nothing is cached), citations only empty.
func anthropicTextBlock(bo jobj) (string, *Error) {
	if e := bo.known("text blocks carry type, text and cache_control", "type", "text", "cache_control", "citations"); e != nil {
		return "", e
	}
	if e := bo.cacheControl(); e != nil {
		return "", e
	}
	if bo.has("citations") {
		var c []json.RawMessage
		if json.Unmarshal(bo.raw("citations"), &c) != nil || len(c) > 0 {
			return "", unsupported(bo.k("citations"), "citations are not supported")
		}
	}
	var t string
	if !bo.has("text") {
		return "", BadRequest(bo.k("text"), "missing text")
	}
	if e := bo.str("text", &t, false); e != nil {
		return "", e
	}
	return t, nil
}

// parseAnthropicMessages maps messages: a user turn's tool_result blocks
// become tool messages (in order, before the turn's text), an assistant
// turn's tool_use blocks its ToolCalls.
func parseAnthropicMessages(o jobj, g *GenerateRequest) *Error {
	items, e := o.array("messages", 1, MaxMessages)
	if e != nil {
		return e
	}
	names := map[string]string{} // tool_use id → function name
	for i, raw := range items {
		p := fmt.Sprintf("messages[%d]", i)
		m, e := subObject(raw, p)
		if e != nil {
			return e
		}
		if e := m.known("messages carry role and content only", "role", "content"); e != nil {
			return e
		}
		var role string
		if !m.has("role") {
			return BadRequest(p+".role", "missing role")
		}
		if e := m.str("role", &role, true); e != nil {
			return e
		}
		if role != "user" && role != "assistant" {
			return unsupported(p+".role", fmt.Sprintf(`role %q is not supported (user, assistant; the system prompt is the top-level "system")`, role))
		}
		if !m.has("content") {
			return BadRequest(p+".content", "missing content")
		}
		var s string
		if json.Unmarshal(m.raw("content"), &s) == nil {
			g.Messages = append(g.Messages, Message{Role: role, Content: s})
			continue
		}
		var blocks []json.RawMessage
		if json.Unmarshal(m.raw("content"), &blocks) != nil {
			return BadRequest(p+".content", "content must be a string or an array of content blocks")
		}
		var texts []string
		var calls []ToolCall
		var results []Message
		for j, b := range blocks {
			bp := fmt.Sprintf("%s.content[%d]", p, j)
			bo, e := subObject(b, bp)
			if e != nil {
				return e
			}
			var typ string
			if e := bo.str("type", &typ, true); e != nil {
				return e
			}
			switch typ {
			case "text":
				t, e := anthropicTextBlock(bo)
				if e != nil {
					return e
				}
				texts = append(texts, t)
			case "tool_use":
				if role != "assistant" {
					return BadRequest(bp+".type", "tool_use blocks belong in assistant messages")
				}
				c, e := anthropicToolUse(bo)
				if e != nil {
					return e
				}
				names[c.ID] = c.Name
				calls = append(calls, c)
			case "tool_result":
				if role != "user" {
					return BadRequest(bp+".type", "tool_result blocks belong in user messages")
				}
				tm, e := anthropicToolResult(bo, names)
				if e != nil {
					return e
				}
				results = append(results, tm)
			default:
				return unsupported(bp+".type", fmt.Sprintf("content block type %q is not supported (text, tool_use, tool_result)", typ))
			}
		}
		g.Messages = append(g.Messages, results...)
		if role == "assistant" {
			g.Messages = append(g.Messages, Message{Role: role, Content: strings.Join(texts, "\n"), ToolCalls: calls})
		} else if len(texts) > 0 || len(results) == 0 {
			g.Messages = append(g.Messages, Message{Role: role, Content: strings.Join(texts, "\n")})
		}
	}
	if len(g.Messages) > MaxMessages {
		return BadRequest("messages", "at most %d messages (tool results count one each), got %d", MaxMessages, len(g.Messages))
	}
	return nil
}

func anthropicToolUse(bo jobj) (ToolCall, *Error) {
	var c ToolCall
	if e := bo.known("tool_use blocks carry type, id, name, input and cache_control", "type", "id", "name", "input", "cache_control"); e != nil {
		return c, e
	}
	if e := bo.cacheControl(); e != nil {
		return c, e
	}
	for _, k := range []string{"id", "name", "input"} {
		if !bo.has(k) {
			return c, BadRequest(bo.k(k), "missing %s", k)
		}
	}
	if e := bo.toolCallID("id", &c.ID); e != nil {
		return c, e
	}
	if e := bo.funcName("name", &c.Name); e != nil {
		return c, e
	}
	args, e := argsText(bo.raw("input"), bo.k("input"))
	c.Arguments = args
	return c, e
}

func anthropicToolResult(bo jobj, names map[string]string) (Message, *Error) {
	m := Message{Role: "tool"}
	if e := bo.known("tool_result blocks carry type, tool_use_id, content, is_error and cache_control",
		"type", "tool_use_id", "content", "is_error", "cache_control"); e != nil {
		return m, e
	}
	if e := bo.cacheControl(); e != nil {
		return m, e
	}
	if !bo.has("tool_use_id") {
		return m, BadRequest(bo.k("tool_use_id"), "missing tool_use_id")
	}
	if e := bo.toolCallID("tool_use_id", &m.ToolCallID); e != nil {
		return m, e
	}
	m.Name = names[m.ToolCallID]
	if bo.has("content") {
		t, e := anthropicText(bo.raw("content"), bo.k("content"))
		if e != nil {
			return m, e
		}
		m.Content = t
	}
	var isErr bool
	if bo.has("is_error") {
		if e := bo.boolean("is_error", &isErr); e != nil {
			return m, e
		}
	}
	if isErr {
		m.Content = "Error: " + m.Content
	}
	return m, nil
}

func parseAnthropicTools(o jobj, g *GenerateRequest) *Error {
	items, e := o.array("tools", 0, MaxTools)
	if e != nil {
		return e
	}
	for i, raw := range items {
		p := fmt.Sprintf("tools[%d]", i)
		to, e := subObject(raw, p)
		if e != nil {
			return e
		}
		if e := to.known("tools carry name, description, input_schema, strict, type and cache_control",
			"name", "description", "input_schema", "strict", "type", "cache_control"); e != nil {
			return e
		}
		if e := to.cacheControl(); e != nil {
			return e
		}
		if to.has("type") {
			var typ string
			if e := to.str("type", &typ, true); e != nil {
				return e
			}
			if typ != "custom" {
				return unsupported(p+".type", fmt.Sprintf("tool type %q is not supported: client tools (custom) only", typ))
			}
		}
		t := Tool{}
		if !to.has("name") {
			return BadRequest(p+".name", "missing name")
		}
		if e := to.str("name", &t.Name, true); e != nil {
			return e
		}
		if to.has("description") {
			if e := to.str("description", &t.Description, false); e != nil {
				return e
			}
		}
		if !to.has("input_schema") {
			return BadRequest(p+".input_schema", "missing input_schema")
		}
		t.Parameters = to.raw("input_schema")
		if to.has("strict") {
			if e := to.boolean("strict", &t.Strict); e != nil {
				return e
			}
		}
		g.Tools = append(g.Tools, t)
	}
	return nil
}

// parseAnthropicToolChoice maps tool_choice: auto, any (a call of some
// tool: required), tool (a call of name) and none.
func parseAnthropicToolChoice(o jobj, g *GenerateRequest) *Error {
	tc, e := subObject(o.raw("tool_choice"), "tool_choice")
	if e != nil {
		return e
	}
	if e := tc.known(whyUnknown, "type", "name", "disable_parallel_tool_use"); e != nil {
		return e
	}
	var typ string
	if !tc.has("type") {
		return BadRequest("tool_choice.type", "missing type")
	}
	if e := tc.str("type", &typ, true); e != nil {
		return e
	}
	switch typ {
	case "auto":
		g.ToolChoice = ToolChoice{Mode: ToolAuto}
	case "any":
		g.ToolChoice = ToolChoice{Mode: ToolRequired}
	case "none":
		g.ToolChoice = ToolChoice{Mode: ToolNone}
	case "tool":
		g.ToolChoice = ToolChoice{Mode: ToolFunction}
		if !tc.has("name") {
			return BadRequest("tool_choice.name", `tool_choice of type "tool" needs a name`)
		}
		if e := tc.str("name", &g.ToolChoice.Name, true); e != nil {
			return e
		}
	default:
		return BadRequest("tool_choice.type", "unknown tool_choice type %q (auto, any, tool, none)", typ)
	}
	if tc.has("name") && typ != "tool" {
		return BadRequest("tool_choice.name", `name is only for tool_choice of type "tool"`)
	}
	if tc.has("disable_parallel_tool_use") {
		var d bool
		if e := tc.boolean("disable_parallel_tool_use", &d); e != nil {
			return e
		}
		g.ParallelToolCalls = !d
	}
	return nil
}

// Responses.

type anthropicMessage struct {
	ID           string           `json:"id"`
	Type         string           `json:"type"`
	Role         string           `json:"role"`
	Model        string           `json:"model"`
	Content      []anthropicBlock `json:"content"`
	StopReason   *string          `json:"stop_reason"`
	StopSequence *string          `json:"stop_sequence"`
	Usage        anthropicUsage   `json:"usage"`
	Meshp2p      *extension       `json:"meshp2p,omitempty"`
}

// anthropicBlock is a text block (Text set, possibly "") or a tool_use
// block.
type anthropicBlock struct {
	Type  string          `json:"type"`
	Text  *string         `json:"text,omitempty"`
	ID    string          `json:"id,omitempty"`
	Name  string          `json:"name,omitempty"`
	Input json.RawMessage `json:"input,omitempty"`
}

type anthropicUsage struct {
	InputTokens  int `json:"input_tokens"`
	OutputTokens int `json:"output_tokens"`
}

// anthropicStop is a finished generation's stop_reason.
func anthropicStop(res *GenerateResult) string {
	switch {
	case len(res.ToolCalls) > 0:
		return "tool_use"
	case res.Length:
		return "max_tokens"
	case res.Stop != "":
		return "stop_sequence"
	}
	return "end_turn"
}

// anthropicStopSequence is the stop sequence that ended the text (nil:
// none did).
func anthropicStopSequence(res *GenerateResult) *string {
	if res.Stop == "" || len(res.ToolCalls) > 0 || res.Length {
		return nil
	}
	s := res.Stop
	return &s
}

func textBlock(s string) anthropicBlock { return anthropicBlock{Type: "text", Text: &s} }

func (s *Server) anthropicMessages(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		writeAnthropicError(w, methodNotAllowed(r, "POST"))
		return
	}
	body, e := s.readBody(w, r)
	var req *anthropicRequest
	if e == nil {
		req, e = parseAnthropic(body)
	}
	if e != nil {
		writeAnthropicError(w, e)
		return
	}
	base := anthropicMessage{ID: "msg_" + randomID(), Type: "message", Role: "assistant", Model: req.gen.Model, Content: []anthropicBlock{}}
	s.serveGen(w, r, &req.gen, req.stream, shape{
		writeErr: writeAnthropicError,
		respond: func(u update) any {
			m := base
			if u.Res.Model != "" {
				m.Model = u.Res.Model
			}
			if u.Text != "" || len(u.Res.ToolCalls) == 0 {
				m.Content = append(m.Content, textBlock(u.Text))
			}
			for _, c := range u.Res.ToolCalls {
				id := c.ID
				if id == "" {
					id = "toolu_" + randomID()
				}
				m.Content = append(m.Content, anthropicBlock{Type: "tool_use", ID: id, Name: c.Name, Input: argsObject(c.Arguments)})
			}
			stop := anthropicStop(u.Res)
			m.StopReason, m.StopSequence = &stop, anthropicStopSequence(u.Res)
			m.Usage = anthropicUsage{u.Res.PromptTokens, u.Res.CompletionTokens}
			m.Meshp2p = final(u.Res)
			return m
		},
		stream: func(ew *eventWriter) streamer { return &anthropicStream{ew: ew, msg: base} },
	})
}

// anthropicStream writes a message as Anthropic's server-sent events:
// message_start, ping, per content block content_block_start, its
// content_block_deltas (text_delta, input_json_delta) and
// content_block_stop, then message_delta (stop_reason, usage) and
// message_stop.
type anthropicStream struct {
	ew    *eventWriter
	msg   anthropicMessage
	open  string // the open block's type ("": none)
	index int    // the open block's index
	count int    // blocks started
	call  int    // the open tool_use block's ToolCallDelta.Index
}

func (a *anthropicStream) start(u update) bool {
	if u.Route.Model != "" {
		a.msg.Model = u.Route.Model
	}
	a.ew.open("text/event-stream")
	return a.ew.event("message_start", map[string]any{"type": "message_start", "message": a.msg}) &&
		a.ew.event("ping", map[string]string{"type": "ping"})
}

func (a *anthropicStream) openBlock(b anthropicBlock) bool {
	if !a.closeBlock() {
		return false
	}
	a.index, a.count, a.open = a.count, a.count+1, b.Type
	return a.ew.event("content_block_start", map[string]any{"type": "content_block_start", "index": a.index, "content_block": b})
}

func (a *anthropicStream) closeBlock() bool {
	if a.open == "" {
		return true
	}
	a.open = ""
	return a.ew.event("content_block_stop", map[string]any{"type": "content_block_stop", "index": a.index})
}

func (a *anthropicStream) blockDelta(d map[string]string) bool {
	return a.ew.event("content_block_delta", map[string]any{"type": "content_block_delta", "index": a.index, "delta": d})
}

func (a *anthropicStream) delta(u update) bool {
	if u.Text != "" {
		if a.open != "text" && !a.openBlock(textBlock("")) {
			return false
		}
		if !a.blockDelta(map[string]string{"type": "text_delta", "text": u.Text}) {
			return false
		}
	}
	for _, d := range u.ToolCalls {
		if a.open != "tool_use" || d.Index != a.call {
			id := d.ID
			if id == "" {
				id = "toolu_" + randomID()
			}
			if !a.openBlock(anthropicBlock{Type: "tool_use", ID: id, Name: d.Name, Input: json.RawMessage("{}")}) {
				return false
			}
			a.call = d.Index
		}
		if d.Arguments != "" && !a.blockDelta(map[string]string{"type": "input_json_delta", "partial_json": d.Arguments}) {
			return false
		}
	}
	return true
}

func (a *anthropicStream) finish(res *GenerateResult) {
	if a.count == 0 && !a.openBlock(textBlock("")) {
		return
	}
	if !a.closeBlock() {
		return
	}
	if !a.ew.event("message_delta", map[string]any{"type": "message_delta",
		"delta":   map[string]any{"stop_reason": anthropicStop(res), "stop_sequence": anthropicStopSequence(res)},
		"usage":   anthropicUsage{res.PromptTokens, res.CompletionTokens},
		"meshp2p": final(res)}) {
		return
	}
	a.ew.event("message_stop", map[string]string{"type": "message_stop"})
}

func (a *anthropicStream) fail(e *Error) { a.ew.event("error", anthropicErrorBody(e)) }

// Errors.

var errUnauthorizedAnthropic = newError(http.StatusUnauthorized, "invalid_request_error", "invalid_api_key", "",
	"missing or incorrect API key: send x-api-key: <key> or Authorization: Bearer <key>")

// anthropicErrorType is Anthropic's error type for e's status.
func anthropicErrorType(e *Error) string {
	switch e.Status {
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusServiceUnavailable, 529:
		return "overloaded_error"
	}
	if e.Status >= 500 {
		return "api_error"
	}
	return "invalid_request_error"
}

func anthropicErrorBody(e *Error) map[string]any {
	return map[string]any{"type": "error", "error": map[string]string{"type": anthropicErrorType(e), "message": messageNaming(e)}}
}

// writeAnthropicError writes e as Anthropic's error object with e's status.
func writeAnthropicError(w http.ResponseWriter, e *Error) {
	errorHeaders(w, e)
	writeJSON(w, e.Status, anthropicErrorBody(e))
}

func (s *Server) anthropicNotFound(w http.ResponseWriter, r *http.Request) {
	writeAnthropicError(w, newError(http.StatusNotFound, "invalid_request_error", "unknown_url", "",
		"unknown endpoint %s %s (POST /v1/messages is the Messages API; docs/api.md lists the endpoints)", r.Method, r.URL.Path))
}

// What the Anthropic, Ollama and Responses adapters share: request
// objects whose errors name the field at fault, one generation driver for
// their streams and answers, event writers and tool-call arguments.

// jobj is a JSON object of a request, its fields keyed by their full path
// ("messages[2].content"), so that every error names the field at fault.
// JSON null counts as absent.
type jobj struct {
	path string
	f    fields
}

// bodyObject parses a request body (a JSON object).
func bodyObject(body []byte) (jobj, *Error) {
	f, e := parseFields(body)
	if e != nil {
		return jobj{}, e
	}
	return jobj{f: f}, nil
}

// subObject parses raw, the JSON object at path.
func subObject(raw json.RawMessage, path string) (jobj, *Error) {
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil || m == nil {
		return jobj{}, BadRequest(path, "%q must be an object", path)
	}
	o := jobj{path: path, f: fields{}}
	for k, v := range m {
		if string(v) != "null" {
			o.f[o.k(k)] = v
		}
	}
	return o, nil
}

// k is the full path of field n.
func (o jobj) k(n string) string {
	if o.path == "" {
		return n
	}
	return o.path + "." + n
}

func (o jobj) has(n string) bool { _, ok := o.f[o.k(n)]; return ok }

func (o jobj) raw(n string) json.RawMessage { return o.f[o.k(n)] }

// known refuses the first field (in sorted order, so the error is stable)
// that is not among names.
func (o jobj) known(why string, names ...string) *Error {
	var bad []string
	for k := range o.f {
		if !slices.Contains(names, k[len(o.k("")):]) {
			bad = append(bad, k)
		}
	}
	if len(bad) == 0 {
		return nil
	}
	sort.Strings(bad)
	return unsupported(bad[0], why)
}

func (o jobj) str(n string, dst *string, nonEmpty bool) *Error { return o.f.str(o.k(n), dst, nonEmpty) }
func (o jobj) boolean(n string, dst *bool) *Error              { return o.f.boolean(o.k(n), dst) }
func (o jobj) float(n string, dst *float32, lo, hi float64) *Error {
	return o.f.float(o.k(n), dst, lo, hi)
}
func (o jobj) integer(n string, dst *int, lo, hi int) *Error { return o.f.integer(o.k(n), dst, lo, hi) }

// array is field n as an array of lo to hi elements.
func (o jobj) array(n string, lo, hi int) ([]json.RawMessage, *Error) {
	var a []json.RawMessage
	if json.Unmarshal(o.raw(n), &a) != nil {
		return nil, BadRequest(o.k(n), "%q must be an array", o.k(n))
	}
	if len(a) < lo || len(a) > hi {
		return nil, BadRequest(o.k(n), "%q must hold %d to %d elements, got %d", o.k(n), lo, hi, len(a))
	}
	return a, nil
}

// stops parses stop strings: an array of up to MaxStops strings of 1 to
// MaxStopBytes bytes (or one string, with one).
func (o jobj) stops(n string, dst *[]string, one bool) *Error {
	p := o.k(n)
	var s string
	if one && json.Unmarshal(o.raw(n), &s) == nil {
		*dst = []string{s}
	} else if json.Unmarshal(o.raw(n), dst) != nil {
		return BadRequest(p, "%q must be an array of strings", p)
	}
	if len(*dst) > MaxStops {
		return BadRequest(p, "at most %d stop strings in %q", MaxStops, p)
	}
	for _, s := range *dst {
		if s == "" || len(s) > MaxStopBytes {
			return BadRequest(p, "%q: stop strings must be 1 to %d bytes", p, MaxStopBytes)
		}
	}
	return nil
}

// cacheControl accepts an Anthropic cache_control object and ignores it:
// nothing is cached, the output is the same.
func (o jobj) cacheControl() *Error {
	if !o.has("cache_control") {
		return nil
	}
	_, e := subObject(o.raw("cache_control"), o.k("cache_control"))
	return e
}

// toolCallID parses a tool call's id (1 to MaxToolCallIDSize bytes).
func (o jobj) toolCallID(n string, dst *string) *Error {
	if e := o.str(n, dst, true); e != nil {
		return e
	}
	if len(*dst) > MaxToolCallIDSize {
		return BadRequest(o.k(n), "%q: tool call ids are at most %d bytes", o.k(n), MaxToolCallIDSize)
	}
	return nil
}

// funcName parses a function's name in a tool call.
func (o jobj) funcName(n string, dst *string) *Error {
	if e := o.str(n, dst, true); e != nil {
		return e
	}
	if !toolName.MatchString(*dst) {
		return BadRequest(o.k(n), "%q: function name %q must be 1 to %d characters of a-z, A-Z, 0-9, _ and -", o.k(n), *dst, MaxToolNameBytes)
	}
	return nil
}

// argsText is a tool call's arguments, a JSON object, as compact JSON
// text (keys in the client's order).
func argsText(raw json.RawMessage, p string) (string, *Error) {
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil || m == nil {
		return "", BadRequest(p, "%q must be a JSON object", p)
	}
	var b bytes.Buffer
	if json.Compact(&b, raw) != nil {
		return "", BadRequest(p, "%q must be a JSON object", p)
	}
	return b.String(), nil
}

// argsObject is a call's arguments (JSON text) as the JSON object the
// Anthropic and Ollama shapes carry; {} when the text is not an object
// (the backend's calls always are: a grammar or parser made them).
func argsObject(s string) json.RawMessage {
	var m map[string]json.RawMessage
	if json.Unmarshal([]byte(s), &m) != nil || m == nil {
		return json.RawMessage("{}")
	}
	var b bytes.Buffer
	if json.Compact(&b, []byte(s)) != nil {
		return json.RawMessage("{}")
	}
	return b.Bytes()
}

func randomSeed() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:])
}

// messageNaming is e's message, led by the field at fault when the message
// does not name it (for shapes whose errors have no param).
func messageNaming(e *Error) string {
	if p, ok := e.Param.(string); ok && p != "" && !strings.Contains(e.Message, p) {
		return p + ": " + e.Message
	}
	return e.Message
}

// errorHeaders sets the headers every error response carries, whatever
// its shape.
func errorHeaders(w http.ResponseWriter, e *Error) {
	if e.Status == http.StatusTooManyRequests {
		w.Header().Set("Retry-After", "1")
	}
	if e.Status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="meshp2p"`)
	}
}

func methodNotAllowed(r *http.Request, allow string) *Error {
	return newError(http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed", "",
		"%s %s: method not allowed (use %s)", r.Method, r.URL.Path, allow)
}

// shape is how an API shape answers a generation: its error writer, the
// whole answer built from everything the run produced, and the writer of
// its stream.
type shape struct {
	writeErr func(http.ResponseWriter, *Error)
	respond  func(u update) any // u.Res is set
	stream   func(ew *eventWriter) streamer
}

// streamer writes one shape's stream. start is called once the first
// token arrived (or the generation ended without one), with the headers
// not yet written; a false return means the client is gone.
type streamer interface {
	start(u update) bool
	delta(u update) bool
	finish(res *GenerateResult)
	fail(e *Error) // after start: the status is already 200
}

// serveGen runs gen (admitted, logged) and answers it in sh's shape,
// streamed or not.
func (s *Server) serveGen(w http.ResponseWriter, r *http.Request, gen *GenerateRequest, stream bool, sh shape) {
	release, ok := s.admit(w, r, sh.writeErr)
	if !ok {
		return
	}
	defer release()
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	g := s.startRun(ctx, gen)
	var status int
	if stream {
		status = drive(ctx, cancel, w, g, sh)
	} else {
		status = http.StatusOK
		u := g.wait()
		switch {
		case u.Err != nil && r.Context().Err() != nil:
			status = 0 // the client left
		case u.Err != nil:
			e := asError(u.Err)
			sh.writeErr(w, e)
			status = e.Status
		default:
			if u.Res == nil {
				u.Res = &GenerateResult{}
			}
			w.Header().Set("X-Meshp2p-Reroutes", strconv.Itoa(u.Res.Reroutes))
			writeJSON(w, http.StatusOK, sh.respond(u))
		}
	}
	s.logRun(r, gen.Model, stream, status, g)
}

// drive streams g: nothing is written before the first token (or the end),
// so errors before it keep their HTTP status; a failed write (the client
// left) cancels the generation, which frees every hop.
func drive(ctx context.Context, cancel context.CancelFunc, w http.ResponseWriter, g *run, sh shape) int {
	st := sh.stream(&eventWriter{w: w, rc: http.NewResponseController(w)})
	started := false
	for {
		u, ok := g.next(ctx)
		if !ok {
			return 0
		}
		if u.Done && u.Err != nil {
			if ctx.Err() != nil {
				return 0
			}
			e := asError(u.Err)
			if !started {
				sh.writeErr(w, e)
				return e.Status
			}
			st.fail(e)
			return http.StatusOK
		}
		if !started && (u.Tokens > 0 || u.Done) {
			started = true
			if !st.start(u) {
				cancel()
				continue
			}
		}
		if !started {
			continue
		}
		if !st.delta(u) {
			cancel()
			continue
		}
		if u.Done {
			if u.Res == nil {
				u.Res = &GenerateResult{}
			}
			st.finish(u.Res)
			return http.StatusOK
		}
	}
}

// eventWriter writes a stream's events: server-sent events with event
// names (Anthropic, Responses) or JSON lines (Ollama).
type eventWriter struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

// open writes the headers of a stream of contentType.
func (e *eventWriter) open(contentType string) {
	h := e.w.Header()
	h.Set("Content-Type", contentType)
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	e.w.WriteHeader(http.StatusOK)
}

// write writes and flushes b; false when the client is gone.
func (e *eventWriter) write(b []byte) bool {
	_ = e.rc.SetWriteDeadline(time.Now().Add(WriteTimeout))
	if _, err := e.w.Write(b); err != nil {
		return false
	}
	return e.rc.Flush() == nil
}

// event writes one server-sent event named name.
func (e *eventWriter) event(name string, v any) bool {
	b, err := json.Marshal(v)
	if err != nil {
		return false
	}
	return e.write(fmt.Appendf(nil, "event: %s\ndata: %s\n\n", name, b))
}

// line writes v as one JSON line.
func (e *eventWriter) line(v any) bool {
	b, err := json.Marshal(v)
	if err != nil {
		return false
	}
	return e.write(append(b, '\n'))
}
