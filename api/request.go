package api

import (
	"cmp"
	"encoding/json"
	"fmt"
	"strings"
)

// OpenAI's chat completions (POST /v1/chat/completions) and completions
// (POST /v1/completions) requests, parsed as every shape's are (jobj,
// parseAll; shapes.go): the fields both take, then each one's own.

// request is a parsed chat (chat) or completion request.
type request struct {
	gen          GenerateRequest
	stream       bool
	includeUsage bool
	chat         bool
}

// openAIFields are the fields chat and completion requests both take.
var openAIFields = []string{"model", "stream", "stream_options", "max_tokens", "temperature", "top_p", "presence_penalty",
	"frequency_penalty", "seed", "stop", "top_k", "min_p", "repeat_penalty", "standby", "n", "user"}

// parseChat validates a /v1/chat/completions body.
func parseChat(body []byte) (*request, *Error) {
	r, e := parseOpenAI(body, true, []string{"messages", "max_completion_tokens", "logprobs", "top_logprobs",
		"response_format", "tools", "tool_choice", "parallel_tool_calls"},
		parseChatMessages, parseChatOptions, parseResponseFormat, parseChatTools, parseChatToolChoice)
	if e == nil {
		e = checkGen(&r.gen, openAINames)
	}
	if e != nil {
		return nil, e
	}
	return r, nil
}

// parseCompletion validates a /v1/completions body.
func parseCompletion(body []byte) (*request, *Error) {
	r, e := parseOpenAI(body, false, []string{"prompt", "logprobs", "echo", "best_of", "suffix"},
		parsePrompt, parseCompletionOptions)
	if e != nil {
		return nil, e
	}
	if r.gen.MaxTokens == 0 {
		r.gen.MaxTokens = DefaultCompletionMaxTokens
	}
	return r, nil
}

// parseOpenAI validates a chat (chat) or completion body: its own fields
// (the first required, as model is) are parsed by parsers, after the
// fields both take.
func parseOpenAI(body []byte, chat bool, own []string, parsers ...func(jobj, *GenerateRequest) *Error) (*request, *Error) {
	o, e := bodyObject(body, append(own, openAIFields...)...)
	if e != nil {
		return nil, e
	}
	if e := o.need("model", own[0]); e != nil {
		return nil, e
	}
	// OpenAI's defaults; parallel tool calls on.
	r := &request{chat: chat, gen: GenerateRequest{Temperature: 1, TopP: 1, Seed: randomSeed(), ParallelToolCalls: chat}}
	g := &r.gen
	var user string
	// cmp.Or: the first error, the fields taken in this order (chat's
	// max_completion_tokens before max_tokens: max_tokens wins).
	if e := cmp.Or(o.str("model", &g.Model, true), o.optBool("stream", &r.stream),
		o.optInt("max_completion_tokens", &g.MaxTokens, 1, MaxTokensLimit), o.optInt("max_tokens", &g.MaxTokens, 1, MaxTokensLimit),
		o.optFloat("temperature", &g.Temperature, 0, 2), o.optFloat("top_p", &g.TopP, 0, 1),
		o.optFloat("presence_penalty", &g.PresencePenalty, -2, 2), o.optFloat("frequency_penalty", &g.FrequencyPenalty, -2, 2),
		o.optSeed("seed", &g.Seed, false), o.optStops("stop", &g.Stops, true), o.optInt("top_k", &g.TopK, 0, MaxTopK),
		o.optFloat("min_p", &g.MinP, 0, 1), o.optFloat("repeat_penalty", &g.RepeatPenalty, 0, 10), o.optBool("standby", &g.Standby),
		o.only("n", "1", "one choice per request; send several requests for several answers"), o.optStr("user", &user, false),
		r.parseStreamOptions(o)); e != nil {
		return nil, e
	}
	g.NoStandby = o.has("standby") && !g.Standby
	if e := parseAll(o, g, parsers...); e != nil {
		return nil, e
	}
	if o.has("stream_options") && !r.stream {
		return nil, BadRequest("stream_options", "stream_options is only allowed with stream: true")
	}
	return r, nil
}

// parseStreamOptions takes stream_options.include_usage; any other
// option only false (off).
func (r *request) parseStreamOptions(o jobj) *Error {
	so, found, e := o.optObject("stream_options")
	if !found {
		return e
	}
	names := []string{"include_usage"}
	for k, v := range so.f {
		if jsonEqual(v, "false") {
			names = append(names, k[len(so.k("")):])
		}
	}
	return cmp.Or(so.known("only include_usage is supported", names...), so.optBool("include_usage", &r.includeUsage))
}

// parseChatOptions takes chat's logprobs (true or false), top_logprobs
// and parallel_tool_calls.
func parseChatOptions(o jobj, g *GenerateRequest) *Error {
	return cmp.Or(o.optBool("logprobs", &g.Logprobs), o.optInt("top_logprobs", &g.TopLogprobs, 0, MaxTopLogprobs),
		o.optBool("parallel_tool_calls", &g.ParallelToolCalls))
}

// parseCompletionOptions takes /v1/completions' logprobs (an integer: the
// alternatives per token, 0 only the token's own), echo, best_of and
// suffix (only their defaults).
func parseCompletionOptions(o jobj, g *GenerateRequest) *Error {
	return cmp.Or(o.opt("logprobs", func() *Error {
		g.Logprobs = true
		return o.integer("logprobs", &g.TopLogprobs, 0, MaxTopLogprobs)
	}), o.only("echo", "false", "the prompt is not echoed"), o.only("best_of", "1", "one candidate per request"),
		o.only("suffix", `""`, "insertion (suffix) is not supported"))
}

// parsePrompt takes the prompt: a string, or an array of one.
func parsePrompt(o jobj, g *GenerateRequest) *Error {
	if s, ok := o.strValue("prompt"); ok {
		g.Prompt = s
	} else {
		var list []string
		if json.Unmarshal(o.raw("prompt"), &list) != nil || len(list) != 1 {
			return BadRequest("prompt", "%q must be a string (or an array of exactly one string; token arrays are not supported)", "prompt")
		}
		g.Prompt = list[0]
	}
	if g.Prompt == "" {
		return BadRequest("prompt", "%q must not be empty", "prompt")
	}
	return nil
}

// parseResponseFormat takes {"type": "text"}, {"type": "json_object"}
// and {"type": "json_schema", "json_schema": {name, schema, strict,
// description}}.
func parseResponseFormat(o jobj, g *GenerateRequest) *Error {
	rf, found, e := o.optObject("response_format")
	if !found {
		return e
	}
	typ, ok := rf.strValue("type")
	if !ok {
		return BadRequest(rf.k("type"), "response_format needs a type (text, json_object, json_schema)")
	}
	allowed := []string{"type"}
	switch typ {
	case FormatText, FormatJSONObject:
	case FormatJSONSchema:
		allowed = append(allowed, "json_schema")
		if e := parseJSONSchema(rf, &g.Format); e != nil {
			return e
		}
	default:
		return BadRequest(rf.k("type"), "unknown response_format type %q (text, json_object, json_schema)", typ)
	}
	if k := rf.unknown(allowed...); k != "" {
		return unsupported(k, fmt.Sprintf("a %s response_format carries no %s", typ, k[len(rf.k("")):]))
	}
	g.Format.Type = typ
	return nil
}

// parseJSONSchema takes response_format.json_schema into f.
func parseJSONSchema(rf jobj, f *ResponseFormat) *Error {
	js, e := rf.object("json_schema")
	if e != nil {
		return BadRequest(rf.k("json_schema"), "json_schema must be an object with name and schema")
	}
	var d string
	if e := cmp.Or(js.known("json_schema carries name, description, schema and strict", "name", "description", "schema", "strict"),
		js.optBool("strict", &f.Strict), js.optStr("description", &d, false)); e != nil {
		return e
	}
	if !js.has("name") {
		return BadRequest(js.k("name"), "json_schema needs a name")
	}
	name, ok := js.strValue("name")
	if !ok || !toolName.MatchString(name) {
		return BadRequest(js.k("name"), "name must be 1 to %d characters of a-z, A-Z, 0-9, _ and -", MaxToolNameBytes)
	}
	f.Name, f.Schema = name, js.raw("schema")
	if f.Schema == nil {
		// OpenAI's default when no schema is given: any JSON object.
		f.Schema = json.RawMessage(`{"type":"object"}`)
	}
	return nil
}

// parseChatTools takes [{"type": "function", "function": {name,
// description, parameters, strict}}].
func parseChatTools(o jobj, g *GenerateRequest) *Error {
	return o.tools(g, Tool{}, func(to jobj, t *Tool) *Error {
		if !jsonEqual(to.raw("type"), `"function"`) {
			return unsupported(to.k("type"), `only tools of type "function" are supported`)
		}
		if e := to.known("tools carry type and function", "type", "function"); e != nil {
			return e
		}
		f, e := functionObject(to, "functions carry name, description, parameters and strict",
			"name", "description", "parameters", "strict")
		if e != nil {
			return e
		}
		return f.functionTool(t, "parameters", false)
	})
}

// parseChatToolChoice takes "auto", "none", "required" and {"type":
// "function", "function": {"name": …}} (also Ollama's tool_choice, an
// extension there).
func parseChatToolChoice(o jobj, g *GenerateRequest) *Error {
	if !o.has("tool_choice") {
		return nil
	}
	if mode, ok := o.strValue("tool_choice"); ok {
		switch mode {
		case ToolAuto, ToolNone, ToolRequired:
			g.ToolChoice = ToolChoice{Mode: mode}
			return nil
		}
		return BadRequest("tool_choice", "tool_choice must be auto, none, required or a function object, got %q", mode)
	}
	var obj struct {
		Type     string `json:"type"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if json.Unmarshal(o.raw("tool_choice"), &obj) != nil || obj.Type != "function" || obj.Function.Name == "" {
		return BadRequest("tool_choice", `tool_choice must be auto, none, required or {"type": "function", "function": {"name": …}}`)
	}
	g.ToolChoice = ToolChoice{Mode: ToolFunction, Name: obj.Function.Name}
	return nil
}

// parseChatMessages takes system, developer (as system), user, assistant
// (text and/or tool_calls) and tool turns, with string content or an
// array of text parts; anything else is refused naming the field.
func parseChatMessages(o jobj, g *GenerateRequest) *Error {
	return o.objects("messages", 1, MaxMessages, func(m jobj) *Error {
		msg, e := chatMessageIn(m)
		if e == nil {
			g.Messages = append(g.Messages, msg)
		}
		return e
	})
}

// chatMessageIn is the message m.
func chatMessageIn(m jobj) (Message, *Error) {
	var msg Message
	if e := m.known("messages carry role, content, name, tool_calls and tool_call_id (no audio)",
		"role", "content", "refusal", "tool_calls", "tool_call_id", "name"); e != nil {
		return msg, e
	}
	if m.has("content") {
		c, e := textParts(m.raw("content"), m.k("content"), "text parts", chatTextPart)
		if e != nil {
			return msg, e
		}
		msg.Content = c
	}
	if e := m.optStr("name", &msg.Name, false); e != nil {
		return msg, e
	}
	// An assistant turn may carry an empty refusal.
	if m.has("refusal") && !jsonEqual(m.raw("refusal"), `""`) {
		return msg, unsupported(m.k("refusal"), "refusals are not supported")
	}
	if e := cmp.Or(m.optStr("role", &msg.Role, false), m.optStr("tool_call_id", &msg.ToolCallID, false)); e != nil {
		return msg, e
	}
	if m.has("tool_calls") {
		calls, e := chatToolCalls(m.raw("tool_calls"), m.k("tool_calls"))
		if e != nil {
			return msg, e
		}
		msg.ToolCalls = calls
	}
	switch msg.Role {
	case "system", "user", "assistant":
	case "tool":
		if msg.ToolCallID == "" {
			return msg, BadRequest(m.k("tool_call_id"), "a tool message needs the tool_call_id it answers")
		}
	case "developer":
		msg.Role = "system"
	case "":
		return msg, BadRequest(m.k("role"), "missing role")
	default:
		return msg, unsupported(m.k("role"), fmt.Sprintf("role %q is not supported (system, developer, user, assistant)", msg.Role))
	}
	if len(msg.ToolCalls) > 0 && msg.Role != "assistant" {
		return msg, BadRequest(m.k("tool_calls"), "only assistant messages carry tool_calls")
	}
	// content: null counts as given (an empty turn) here.
	if !m.given("content") && msg.Role != "assistant" {
		return msg, BadRequest(m.k("content"), "missing content")
	}
	return msg, nil
}

// chatTextPart is a content part's text: {"type": "text", "text": …}
// (text: null counts as "").
func chatTextPart(po jobj) (string, *Error) {
	typ, ok := po.strValue("type")
	if !ok {
		return "", BadRequest(po.k("type"), "content part without a type")
	}
	if typ != "text" {
		return "", unsupported(po.k("type"), fmt.Sprintf("content part type %q is not supported (text only)", typ))
	}
	if e := po.known("text parts carry type and text only", "type", "text"); e != nil {
		return "", e
	}
	text, ok := po.strValue("text")
	if !ok && (po.has("text") || !po.given("text")) {
		return "", BadRequest(po.k("text"), "text must be a string")
	}
	return text, nil
}

// chatToolCalls parses an assistant message's tool_calls, raw at path p.
func chatToolCalls(raw json.RawMessage, p string) ([]ToolCall, *Error) {
	var calls []struct {
		ID       string `json:"id"`
		Type     string `json:"type"`
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	}
	if json.Unmarshal(raw, &calls) != nil {
		return nil, BadRequest(p, `tool_calls must be an array of {"id", "type": "function", "function": {"name", "arguments"}}`)
	}
	if len(calls) > MaxToolCallsTurn {
		return nil, BadRequest(p, "at most %d tool calls per message", MaxToolCallsTurn)
	}
	out := make([]ToolCall, len(calls))
	for i, c := range calls {
		if c.Type != "" && c.Type != "function" {
			return nil, unsupported(fmt.Sprintf("%s[%d].type", p, i), `only "function" tool calls are supported`)
		}
		out[i] = ToolCall{ID: c.ID, Name: c.Function.Name, Arguments: c.Function.Arguments}
		if strings.TrimSpace(out[i].Arguments) == "" {
			out[i].Arguments = "{}"
		}
	}
	return out, nil
}
