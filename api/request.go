package api

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strings"
)

// request is a parsed chat or completion request.
type request struct {
	gen          GenerateRequest
	stream       bool
	includeUsage bool
}

// fields is a request body, field by field; JSON null counts as absent.
type fields map[string]json.RawMessage

func parseFields(body []byte) (fields, *Error) {
	var f fields
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&f); err != nil {
		return nil, BadRequest("", "request body is not a JSON object: %v", err)
	}
	if f == nil {
		return nil, BadRequest("", "request body is not a JSON object")
	}
	if dec.More() {
		return nil, BadRequest("", "request body has data after the JSON object")
	}
	for k, v := range f {
		if string(v) == "null" {
			delete(f, k)
		}
	}
	return f, nil
}

// field kinds the chat and completion endpoints accept.
type acceptFn func(f fields, name string, r *request) *Error

var commonFields = map[string]acceptFn{
	"model":             func(f fields, n string, r *request) *Error { return f.str(n, &r.gen.Model, true) },
	"stream":            func(f fields, n string, r *request) *Error { return f.boolean(n, &r.stream) },
	"stream_options":    parseStreamOptions,
	"max_tokens":        func(f fields, n string, r *request) *Error { return f.integer(n, &r.gen.MaxTokens, 1, MaxTokensLimit) },
	"temperature":       func(f fields, n string, r *request) *Error { return f.float(n, &r.gen.Temperature, 0, 2) },
	"top_p":             func(f fields, n string, r *request) *Error { return f.float(n, &r.gen.TopP, 0, 1) },
	"presence_penalty":  func(f fields, n string, r *request) *Error { return f.float(n, &r.gen.PresencePenalty, -2, 2) },
	"frequency_penalty": func(f fields, n string, r *request) *Error { return f.float(n, &r.gen.FrequencyPenalty, -2, 2) },
	"seed":              parseSeed,
	"stop":              parseStop,
	"top_k":             func(f fields, n string, r *request) *Error { return f.integer(n, &r.gen.TopK, 0, MaxTopK) },
	"min_p":             func(f fields, n string, r *request) *Error { return f.float(n, &r.gen.MinP, 0, 1) },
	"repeat_penalty":    func(f fields, n string, r *request) *Error { return f.float(n, &r.gen.RepeatPenalty, 0, 10) },
	"n":                 only("n", "1", "one choice per request; send several requests for several answers"),
	"user":              func(f fields, n string, r *request) *Error { var s string; return f.str(n, &s, false) },
}

var chatFields = merge(commonFields, map[string]acceptFn{
	"messages":              parseMessages,
	"max_completion_tokens": func(f fields, n string, r *request) *Error { return f.integer(n, &r.gen.MaxTokens, 1, MaxTokensLimit) },
	"logprobs":              func(f fields, n string, r *request) *Error { return f.boolean(n, &r.gen.Logprobs) },
	"top_logprobs": func(f fields, n string, r *request) *Error {
		return f.integer(n, &r.gen.TopLogprobs, 0, MaxTopLogprobs)
	},
	"response_format":     parseResponseFormat,
	"tools":               parseTools,
	"tool_choice":         parseToolChoice,
	"parallel_tool_calls": func(f fields, n string, r *request) *Error { return f.boolean(n, &r.gen.ParallelToolCalls) },
})

var completionFields = merge(commonFields, map[string]acceptFn{
	"prompt":   parsePrompt,
	"logprobs": parseCompletionLogprobs,
	"echo":     only("echo", "false", "the prompt is not echoed"),
	"best_of":  only("best_of", "1", "one candidate per request"),
	"suffix":   only("suffix", `""`, "insertion (suffix) is not supported"),
})

func merge(a, b map[string]acceptFn) map[string]acceptFn {
	out := map[string]acceptFn{}
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}

// parseChat validates a /v1/chat/completions body.
func parseChat(body []byte) (*request, *Error) {
	r, err := parseWith(body, chatFields, "messages", true)
	if err != nil {
		return nil, err
	}
	if err := checkGen(&r.gen, openAINames); err != nil {
		return nil, err
	}
	return r, nil
}

// parseCompletion validates a /v1/completions body.
func parseCompletion(body []byte) (*request, *Error) {
	r, err := parseWith(body, completionFields, "prompt", false)
	if err != nil {
		return nil, err
	}
	if r.gen.MaxTokens == 0 {
		r.gen.MaxTokens = DefaultCompletionMaxTokens
	}
	return r, nil
}

func parseWith(body []byte, accept map[string]acceptFn, required string, chat bool) (*request, *Error) {
	f, err := parseFields(body)
	if err != nil {
		return nil, err
	}
	// Fields in a fixed order, so the error for a body with several bad
	// fields is always the same.
	names := make([]string, 0, len(f))
	for k := range f {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		if _, ok := accept[k]; !ok {
			return nil, unsupported(k, "this gateway does not implement it (docs/api.md lists the supported fields)")
		}
	}
	// OpenAI's defaults: parallel tool calls on.
	r := &request{gen: GenerateRequest{Temperature: 1, TopP: 1, ParallelToolCalls: chat}}
	for _, k := range []string{"model", required} {
		if _, ok := f[k]; !ok {
			return nil, BadRequest(k, "missing required field %q", k)
		}
	}
	for _, k := range names {
		if err := accept[k](f, k, r); err != nil {
			return nil, err
		}
	}
	if _, ok := f["stream_options"]; ok && !r.stream {
		return nil, BadRequest("stream_options", "stream_options is only allowed with stream: true")
	}
	if _, ok := f["seed"]; !ok {
		var b [8]byte
		_, _ = rand.Read(b[:])
		r.gen.Seed = binary.LittleEndian.Uint64(b[:])
	}
	return r, nil
}

// only accepts a field whose value is exactly want (JSON), refusing any
// other value with why.
func only(name, want, why string) acceptFn {
	return func(f fields, n string, r *request) *Error {
		var got, exp any
		if json.Unmarshal(f[n], &got) != nil || json.Unmarshal([]byte(want), &exp) != nil || fmt.Sprint(got) != fmt.Sprint(exp) {
			return unsupported(name, fmt.Sprintf("only %s is supported: %s", want, why))
		}
		return nil
	}
}

func (f fields) str(n string, dst *string, nonEmpty bool) *Error {
	if json.Unmarshal(f[n], dst) != nil {
		return BadRequest(n, "%q must be a string", n)
	}
	if nonEmpty && *dst == "" {
		return BadRequest(n, "%q must not be empty", n)
	}
	return nil
}

func (f fields) boolean(n string, dst *bool) *Error {
	if json.Unmarshal(f[n], dst) != nil {
		return BadRequest(n, "%q must be true or false", n)
	}
	return nil
}

func (f fields) float(n string, dst *float32, lo, hi float64) *Error {
	var v float64
	if json.Unmarshal(f[n], &v) != nil || math.IsNaN(v) || v < lo || v > hi {
		return BadRequest(n, "%q must be a number in [%g, %g]", n, lo, hi)
	}
	*dst = float32(v)
	return nil
}

func (f fields) integer(n string, dst *int, lo, hi int) *Error {
	var v float64
	if json.Unmarshal(f[n], &v) != nil || v != math.Trunc(v) || v < float64(lo) || v > float64(hi) {
		return BadRequest(n, "%q must be an integer in [%d, %d]", n, lo, hi)
	}
	*dst = int(v)
	return nil
}

func parseSeed(f fields, n string, r *request) *Error {
	var v json.Number
	dec := json.NewDecoder(bytes.NewReader(f[n]))
	dec.UseNumber()
	if dec.Decode(&v) != nil {
		return BadRequest(n, "%q must be an integer", n)
	}
	i, err := v.Int64()
	if err != nil {
		return BadRequest(n, "%q must be a 64-bit integer", n)
	}
	r.gen.Seed = uint64(i)
	return nil
}

func parseStop(f fields, n string, r *request) *Error {
	var one string
	if json.Unmarshal(f[n], &one) == nil {
		r.gen.Stops = []string{one}
	} else if json.Unmarshal(f[n], &r.gen.Stops) != nil {
		return BadRequest(n, "%q must be a string or an array of strings", n)
	}
	if len(r.gen.Stops) > MaxStops {
		return BadRequest(n, "at most %d stop strings", MaxStops)
	}
	for _, s := range r.gen.Stops {
		if s == "" || len(s) > MaxStopBytes {
			return BadRequest(n, "stop strings must be 1 to %d bytes", MaxStopBytes)
		}
	}
	return nil
}

func parseStreamOptions(f fields, n string, r *request) *Error {
	var so map[string]json.RawMessage
	if json.Unmarshal(f[n], &so) != nil {
		return BadRequest(n, "%q must be an object", n)
	}
	for k, v := range so {
		switch {
		case k == "include_usage":
			if json.Unmarshal(v, &r.includeUsage) != nil {
				return BadRequest(n+".include_usage", "include_usage must be true or false")
			}
		case string(v) == "null" || string(v) == "false":
		default:
			return unsupported(n+"."+k, "only include_usage is supported")
		}
	}
	return nil
}

// parseResponseFormat accepts {"type": "text"}, {"type": "json_object"}
// and {"type": "json_schema", "json_schema": {name, schema, strict,
// description}}.
func parseResponseFormat(f fields, n string, r *request) *Error {
	var rf map[string]json.RawMessage
	if json.Unmarshal(f[n], &rf) != nil {
		return BadRequest(n, "%q must be an object", n)
	}
	var typ string
	if json.Unmarshal(rf["type"], &typ) != nil {
		return BadRequest(n+".type", "response_format needs a type (text, json_object, json_schema)")
	}
	allowed := map[string]bool{"type": true}
	switch typ {
	case FormatText, FormatJSONObject:
	case FormatJSONSchema:
		allowed["json_schema"] = true
		var js map[string]json.RawMessage
		if json.Unmarshal(rf["json_schema"], &js) != nil {
			return BadRequest(n+".json_schema", "json_schema must be an object with name and schema")
		}
		for k, v := range js {
			switch k {
			case "name":
				if json.Unmarshal(v, &r.gen.Format.Name) != nil || !toolName.MatchString(r.gen.Format.Name) {
					return BadRequest(n+".json_schema.name", "name must be 1 to %d characters of a-z, A-Z, 0-9, _ and -", MaxToolNameBytes)
				}
			case "schema":
				r.gen.Format.Schema = append(json.RawMessage(nil), v...)
			case "strict":
				if json.Unmarshal(v, &r.gen.Format.Strict) != nil {
					return BadRequest(n+".json_schema.strict", "strict must be true or false")
				}
			case "description":
				var d string
				if json.Unmarshal(v, &d) != nil {
					return BadRequest(n+".json_schema.description", "description must be a string")
				}
			default:
				return unsupported(n+".json_schema."+k, "json_schema carries name, description, schema and strict")
			}
		}
		if r.gen.Format.Name == "" {
			return BadRequest(n+".json_schema.name", "json_schema needs a name")
		}
		if r.gen.Format.Schema == nil {
			// OpenAI's default when no schema is given: any JSON object.
			r.gen.Format.Schema = json.RawMessage(`{"type":"object"}`)
		}
	default:
		return BadRequest(n+".type", "unknown response_format type %q (text, json_object, json_schema)", typ)
	}
	for k := range rf {
		if !allowed[k] {
			return unsupported(n+"."+k, fmt.Sprintf("a %s response_format carries no %s", typ, k))
		}
	}
	r.gen.Format.Type = typ
	return nil
}

// parseTools accepts [{"type": "function", "function": {name,
// description, parameters, strict}}].
func parseTools(f fields, n string, r *request) *Error {
	var raw []map[string]json.RawMessage
	if json.Unmarshal(f[n], &raw) != nil {
		return BadRequest(n, "%q must be an array of tool objects", n)
	}
	if len(raw) > MaxTools {
		return BadRequest(n, "at most %d tools per request, got %d", MaxTools, len(raw))
	}
	for i, t := range raw {
		p := fmt.Sprintf("%s[%d]", n, i)
		var typ string
		if json.Unmarshal(t["type"], &typ) != nil || typ != "function" {
			return unsupported(p+".type", `only tools of type "function" are supported`)
		}
		var fn map[string]json.RawMessage
		if json.Unmarshal(t["function"], &fn) != nil {
			return BadRequest(p+".function", "a function tool needs a function object")
		}
		for k := range t {
			if k != "type" && k != "function" {
				return unsupported(p+"."+k, "tools carry type and function")
			}
		}
		tool := Tool{}
		for k, v := range fn {
			if string(v) == "null" {
				continue
			}
			var err error
			switch k {
			case "name":
				err = json.Unmarshal(v, &tool.Name)
			case "description":
				err = json.Unmarshal(v, &tool.Description)
			case "parameters":
				tool.Parameters = append(json.RawMessage(nil), v...)
			case "strict":
				err = json.Unmarshal(v, &tool.Strict)
			default:
				return unsupported(p+".function."+k, "functions carry name, description, parameters and strict")
			}
			if err != nil {
				return BadRequest(p+".function."+k, "function %s has the wrong type", k)
			}
		}
		r.gen.Tools = append(r.gen.Tools, tool)
	}
	return nil
}

// parseToolChoice accepts "auto", "none", "required" and {"type":
// "function", "function": {"name": …}}.
func parseToolChoice(f fields, n string, r *request) *Error {
	var mode string
	if json.Unmarshal(f[n], &mode) == nil {
		switch mode {
		case ToolAuto, ToolNone, ToolRequired:
			r.gen.ToolChoice = ToolChoice{Mode: mode}
			return nil
		}
		return BadRequest(n, "tool_choice must be auto, none, required or a function object, got %q", mode)
	}
	var obj struct {
		Type     string `json:"type"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if json.Unmarshal(f[n], &obj) != nil || obj.Type != "function" || obj.Function.Name == "" {
		return BadRequest(n, `tool_choice must be auto, none, required or {"type": "function", "function": {"name": …}}`)
	}
	r.gen.ToolChoice = ToolChoice{Mode: ToolFunction, Name: obj.Function.Name}
	return nil
}

// parseCompletionLogprobs is /v1/completions' logprobs: an integer, the
// alternatives per token (0: only the token's own).
func parseCompletionLogprobs(f fields, n string, r *request) *Error {
	if e := f.integer(n, &r.gen.TopLogprobs, 0, MaxTopLogprobs); e != nil {
		return e
	}
	r.gen.Logprobs = true
	return nil
}

func parsePrompt(f fields, n string, r *request) *Error {
	var one string
	if json.Unmarshal(f[n], &one) == nil {
		r.gen.Prompt = one
	} else {
		var list []string
		if json.Unmarshal(f[n], &list) != nil || len(list) != 1 {
			return BadRequest(n, "%q must be a string (or an array of exactly one string; token arrays are not supported)", n)
		}
		r.gen.Prompt = list[0]
	}
	if r.gen.Prompt == "" {
		return BadRequest(n, "%q must not be empty", n)
	}
	return nil
}

// parseMessages accepts system, developer (as system), user and assistant
// turns with string content or an array of text parts; anything else is
// refused with the field that carries it.
func parseMessages(f fields, n string, r *request) *Error {
	var raw []map[string]json.RawMessage
	if json.Unmarshal(f[n], &raw) != nil {
		return BadRequest(n, "%q must be an array of message objects", n)
	}
	if len(raw) == 0 || len(raw) > MaxMessages {
		return BadRequest(n, "%q must hold 1 to %d messages", n, MaxMessages)
	}
	for i, m := range raw {
		p := fmt.Sprintf("messages[%d]", i)
		msg := Message{}
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			v := m[k]
			if string(v) == "null" {
				continue
			}
			switch k {
			case "role":
				if json.Unmarshal(v, &msg.Role) != nil {
					return BadRequest(p+".role", "role must be a string")
				}
			case "content":
				c, err := messageContent(v, p+".content")
				if err != nil {
					return err
				}
				msg.Content = c
			case "refusal":
				// An assistant turn may carry an empty refusal.
				var s string
				if json.Unmarshal(v, &s) != nil || s != "" {
					return unsupported(p+".refusal", "refusals are not supported")
				}
			case "tool_calls":
				calls, err := messageToolCalls(v, p+".tool_calls")
				if err != nil {
					return err
				}
				msg.ToolCalls = calls
			case "tool_call_id":
				if json.Unmarshal(v, &msg.ToolCallID) != nil {
					return BadRequest(p+".tool_call_id", "tool_call_id must be a string")
				}
			case "name":
				if json.Unmarshal(v, &msg.Name) != nil {
					return BadRequest(p+".name", "name must be a string")
				}
			default:
				return unsupported(p+"."+k, "messages carry role, content, name, tool_calls and tool_call_id (no audio)")
			}
		}
		switch msg.Role {
		case "system", "user", "assistant":
		case "tool":
			if msg.ToolCallID == "" {
				return BadRequest(p+".tool_call_id", "a tool message needs the tool_call_id it answers")
			}
		case "developer":
			msg.Role = "system"
		case "":
			return BadRequest(p+".role", "missing role")
		default:
			return unsupported(p+".role", fmt.Sprintf("role %q is not supported (system, developer, user, assistant)", msg.Role))
		}
		if len(msg.ToolCalls) > 0 && msg.Role != "assistant" {
			return BadRequest(p+".tool_calls", "only assistant messages carry tool_calls")
		}
		if _, ok := m["content"]; !ok && msg.Role != "assistant" {
			return BadRequest(p+".content", "missing content")
		}
		r.gen.Messages = append(r.gen.Messages, msg)
	}
	return nil
}

func messageContent(v json.RawMessage, p string) (string, *Error) {
	var s string
	if json.Unmarshal(v, &s) == nil {
		return s, nil
	}
	var parts []map[string]json.RawMessage
	if json.Unmarshal(v, &parts) != nil {
		return "", BadRequest(p, "content must be a string or an array of text parts")
	}
	var texts []string
	for j, part := range parts {
		pp := fmt.Sprintf("%s[%d]", p, j)
		var typ, text string
		if json.Unmarshal(part["type"], &typ) != nil {
			return "", BadRequest(pp+".type", "content part without a type")
		}
		if typ != "text" {
			return "", unsupported(pp+".type", fmt.Sprintf("content part type %q is not supported (text only)", typ))
		}
		for k := range part {
			if k != "type" && k != "text" {
				return "", unsupported(pp+"."+k, "text parts carry type and text only")
			}
		}
		if json.Unmarshal(part["text"], &text) != nil {
			return "", BadRequest(pp+".text", "text must be a string")
		}
		texts = append(texts, text)
	}
	return strings.Join(texts, "\n"), nil
}

// messageToolCalls parses an assistant message's tool_calls.
func messageToolCalls(v json.RawMessage, p string) ([]ToolCall, *Error) {
	var raw []struct {
		ID       string `json:"id"`
		Type     string `json:"type"`
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	}
	if json.Unmarshal(v, &raw) != nil {
		return nil, BadRequest(p, `tool_calls must be an array of {"id", "type": "function", "function": {"name", "arguments"}}`)
	}
	if len(raw) > MaxToolCallsTurn {
		return nil, BadRequest(p, "at most %d tool calls per message", MaxToolCallsTurn)
	}
	out := make([]ToolCall, len(raw))
	for i, c := range raw {
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
