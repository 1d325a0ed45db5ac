package api

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// Anthropic's Messages API (POST /v1/messages) over the same Backend as
// the OpenAI endpoints: a thin adapter that maps the request to a
// GenerateRequest (validated by checkGen, as every shape is), runs it
// through the shared machinery (serveGen, drive) and answers in
// Anthropic's shapes: the message object, its server-sent events and its
// error objects. docs/api.md lists what it accepts and refuses. What every
// shape (OpenAI's included) shares is in shapes.go: request objects whose
// errors name the field at fault (jobj), the generation driver (serveGen,
// drive) and event writers.

// anthropicRequest is a parsed /v1/messages body.
type anthropicRequest struct {
	gen    GenerateRequest
	stream bool
}

// anthropicNames are the Messages API's names of the fields checkGen checks.
var anthropicNames = FieldNames{Tools: "tools", ToolName: ".name", ToolParams: ".input_schema",
	ToolChoice: "tool_choice", Format: "output_config.format", TopLogprobs: "top_logprobs"}

// parseAnthropic validates a /v1/messages body.
func parseAnthropic(body []byte) (*anthropicRequest, *Error) {
	o, e := bodyObject(body, "model", "max_tokens", "messages", "system", "stop_sequences", "temperature", "top_p",
		"top_k", "stream", "tools", "tool_choice", "metadata", "output_config", "thinking")
	if e != nil {
		return nil, e
	}
	if e := o.need("model", "max_tokens", "messages"); e != nil {
		return nil, e
	}
	r := &anthropicRequest{gen: GenerateRequest{Temperature: 1, TopP: 1, Seed: randomSeed(), ParallelToolCalls: true}}
	g := &r.gen
	// cmp.Or: the first error, the fields taken in this order.
	if e := cmp.Or(o.str("model", &g.Model, true), o.integer("max_tokens", &g.MaxTokens, 1, MaxTokensLimit),
		o.optFloat("temperature", &g.Temperature, 0, 1), o.optFloat("top_p", &g.TopP, 0, 1),
		o.optInt("top_k", &g.TopK, 0, MaxTopK), o.optBool("stream", &r.stream),
		o.optStops("stop_sequences", &g.Stops, false)); e != nil {
		return nil, e
	}
	if e := parseAll(o, g, parseAnthropicMetadata, parseAnthropicThinking, parseAnthropicOutput, parseAnthropicSystem,
		parseAnthropicMessages, parseAnthropicTools, parseAnthropicToolChoice); e != nil {
		return nil, e
	}
	if e := checkGen(g, anthropicNames); e != nil {
		return nil, e
	}
	return r, nil
}

// parseAnthropicMetadata accepts metadata.user_id (and ignores it).
func parseAnthropicMetadata(o jobj, _ *GenerateRequest) *Error {
	m, found, e := o.optObject("metadata")
	if !found {
		return e
	}
	if e := m.known("metadata carries user_id only", "user_id"); e != nil {
		return e
	}
	var id string
	return m.optStr("user_id", &id, false)
}

// parseAnthropicThinking accepts thinking {"type": "disabled"} only.
func parseAnthropicThinking(o jobj, _ *GenerateRequest) *Error {
	t, found, e := o.optObject("thinking")
	if !found {
		return e
	}
	var typ string
	if e := t.str("type", &typ, true); e != nil {
		return e
	}
	if typ != "disabled" {
		return unsupported("thinking", `extended thinking is not supported: only {"type": "disabled"}`)
	}
	return nil
}

// parseAnthropicOutput accepts output_config.format (structured outputs:
// {"type": "json_schema", "schema": {…}}).
func parseAnthropicOutput(o jobj, g *GenerateRequest) *Error {
	f, found, e := o.nested("output_config", "format", "output_config carries format only (no effort)")
	if !found {
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

// parseAnthropicSystem maps the system prompt to a leading system message.
func parseAnthropicSystem(o jobj, g *GenerateRequest) *Error {
	if !o.has("system") {
		return nil
	}
	s, e := anthropicText(o.raw("system"), "system")
	if e == nil {
		appendSystem(g, s)
	}
	return e
}

// anthropicText is a string or an array of text blocks (joined with \n),
// as system prompts and tool results carry them.
func anthropicText(raw json.RawMessage, p string) (string, *Error) {
	return textParts(raw, p, "text blocks", func(bo jobj) (string, *Error) {
		var typ string
		if e := bo.str("type", &typ, true); e != nil {
			return "", e
		}
		if typ != "text" {
			return "", unsupported(bo.k("type"), fmt.Sprintf("block type %q is not supported here (text only)", typ))
		}
		return anthropicTextBlock(bo)
	})
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
	e := bo.needStr("text", &t, false)
	return t, e
}

// parseAnthropicMessages maps messages: a user turn's tool_result blocks
// become tool messages (in order, before the turn's text), an assistant
// turn's tool_use blocks its ToolCalls.
func parseAnthropicMessages(o jobj, g *GenerateRequest) *Error {
	names := map[string]string{} // tool_use id → function name
	if e := o.objects("messages", 1, MaxMessages, func(m jobj) *Error {
		if e := m.known("messages carry role and content only", "role", "content"); e != nil {
			return e
		}
		var role string
		if e := m.needStr("role", &role, true); e != nil {
			return e
		}
		if role != "user" && role != "assistant" {
			return unsupported(m.k("role"), fmt.Sprintf(`role %q is not supported (user, assistant; the system prompt is the top-level "system")`, role))
		}
		if e := m.need("content"); e != nil {
			return e
		}
		if s, ok := m.strValue("content"); ok {
			g.Messages = append(g.Messages, Message{Role: role, Content: s})
			return nil
		}
		var blocks []json.RawMessage
		if json.Unmarshal(m.raw("content"), &blocks) != nil {
			return BadRequest(m.k("content"), "content must be a string or an array of content blocks")
		}
		t := anthropicTurn{role: role, names: names}
		if e := eachObject(blocks, m.k("content"), t.block); e != nil {
			return e
		}
		g.Messages = append(g.Messages, t.results...)
		if role == "assistant" {
			g.Messages = append(g.Messages, Message{Role: role, Content: strings.Join(t.texts, "\n"), ToolCalls: t.calls})
		} else if len(t.texts) > 0 || len(t.results) == 0 {
			g.Messages = append(g.Messages, Message{Role: role, Content: strings.Join(t.texts, "\n")})
		}
		return nil
	}); e != nil {
		return e
	}
	if len(g.Messages) > MaxMessages {
		return BadRequest("messages", "at most %d messages (tool results count one each), got %d", MaxMessages, len(g.Messages))
	}
	return nil
}

// anthropicTurn collects the content blocks of a message of role.
type anthropicTurn struct {
	role    string
	names   map[string]string // tool_use id → function name
	texts   []string
	calls   []ToolCall
	results []Message
}

func (t *anthropicTurn) block(bo jobj) *Error {
	var typ string
	if e := bo.str("type", &typ, true); e != nil {
		return e
	}
	switch typ {
	case "text":
		s, e := anthropicTextBlock(bo)
		if e != nil {
			return e
		}
		t.texts = append(t.texts, s)
	case "tool_use":
		if t.role != "assistant" {
			return BadRequest(bo.k("type"), "tool_use blocks belong in assistant messages")
		}
		c, e := anthropicToolUse(bo)
		if e != nil {
			return e
		}
		t.names[c.ID] = c.Name
		t.calls = append(t.calls, c)
	case "tool_result":
		if t.role != "user" {
			return BadRequest(bo.k("type"), "tool_result blocks belong in user messages")
		}
		tm, e := anthropicToolResult(bo, t.names)
		if e != nil {
			return e
		}
		t.results = append(t.results, tm)
	default:
		return unsupported(bo.k("type"), fmt.Sprintf("content block type %q is not supported (text, tool_use, tool_result)", typ))
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
	if e := bo.need("id", "name", "input"); e != nil {
		return c, e
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
	if e := bo.known("tool_result blocks carry type, tool_use_id, content, is_error and cache_control",
		"type", "tool_use_id", "content", "is_error", "cache_control"); e != nil {
		return Message{}, e
	}
	if e := bo.cacheControl(); e != nil {
		return Message{}, e
	}
	m, e := bo.toolResult("tool_use_id", names)
	if e != nil {
		return m, e
	}
	if bo.has("content") {
		t, e := anthropicText(bo.raw("content"), bo.k("content"))
		if e != nil {
			return m, e
		}
		m.Content = t
	}
	var isErr bool
	if e := bo.optBool("is_error", &isErr); e != nil {
		return m, e
	}
	if isErr {
		m.Content = "Error: " + m.Content
	}
	return m, nil
}

func parseAnthropicTools(o jobj, g *GenerateRequest) *Error {
	return o.tools(g, Tool{}, func(to jobj, t *Tool) *Error {
		if e := to.known("tools carry name, description, input_schema, strict, type and cache_control",
			"name", "description", "input_schema", "strict", "type", "cache_control"); e != nil {
			return e
		}
		if e := to.cacheControl(); e != nil {
			return e
		}
		var typ string
		if e := to.optStr("type", &typ, true); e != nil {
			return e
		}
		if to.has("type") && typ != "custom" {
			return unsupported(to.k("type"), fmt.Sprintf("tool type %q is not supported: client tools (custom) only", typ))
		}
		return to.functionTool(t, "input_schema", true)
	})
}

// parseAnthropicToolChoice maps tool_choice: auto, any (a call of some
// tool: required), tool (a call of name) and none.
func parseAnthropicToolChoice(o jobj, g *GenerateRequest) *Error {
	tc, found, e := o.optObject("tool_choice")
	if !found {
		return e
	}
	if e := tc.known(whyUnknown, "type", "name", "disable_parallel_tool_use"); e != nil {
		return e
	}
	var typ string
	if e := tc.needStr("type", &typ, true); e != nil {
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

// anthropicUsage: as Anthropic counts, input_tokens are the prompt tokens
// not read from a cache and cache_read_input_tokens those the hops reused
// from their prefix caches.
type anthropicUsage struct {
	InputTokens          int `json:"input_tokens"`
	OutputTokens         int `json:"output_tokens"`
	CacheReadInputTokens int `json:"cache_read_input_tokens"`
}

func anthropicUsageOf(res *GenerateResult) anthropicUsage {
	return anthropicUsage{res.PromptTokens - res.CachedTokens, res.CompletionTokens, res.CachedTokens}
}

// anthropicStop is a finished generation's stop_reason.
func anthropicStop(res *GenerateResult) string {
	switch {
	case res.Length: // cut off, also inside a call (as OpenAI's length)
		return "max_tokens"
	case len(res.ToolCalls) > 0:
		return "tool_use"
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
	req, ok := readRequest(s, w, r, writeAnthropicError, parseAnthropic)
	if !ok {
		return
	}
	base := anthropicMessage{ID: "msg_" + randomID(), Type: "message", Role: "assistant", Model: req.gen.Model, Content: []anthropicBlock{}}
	s.serveGen(w, r, &req.gen, req.stream, shape{
		writeErr: writeAnthropicError,
		respond: func(u update) any {
			m := base
			m.Model = modelOr(u.Res.Model, m.Model)
			if u.Text != "" || len(u.Res.ToolCalls) == 0 {
				m.Content = append(m.Content, textBlock(u.Text))
			}
			for _, c := range u.Res.ToolCalls {
				m.Content = append(m.Content, anthropicBlock{Type: "tool_use", ID: idOr(c.ID, "toolu_"), Name: c.Name, Input: argsObject(c.Arguments)})
			}
			stop := anthropicStop(u.Res)
			m.StopReason, m.StopSequence = &stop, anthropicStopSequence(u.Res)
			m.Usage = anthropicUsageOf(u.Res)
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
	a.msg.Model = modelOr(u.Route.Model, a.msg.Model)
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

func (a *anthropicStream) delta(u update) bool { return u.each(a.piece) }

// piece writes one delta.
func (a *anthropicStream) piece(u update) bool {
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
			if !a.openBlock(anthropicBlock{Type: "tool_use", ID: idOr(d.ID, "toolu_"), Name: d.Name, Input: json.RawMessage("{}")}) {
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
		"usage":   anthropicUsageOf(res),
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
