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
	"logprobs":              only("logprobs", "false", "log probabilities are not reported"),
	"response_format":       parseResponseFormat,
})

var completionFields = merge(commonFields, map[string]acceptFn{
	"prompt":  parsePrompt,
	"echo":    only("echo", "false", "the prompt is not echoed"),
	"best_of": only("best_of", "1", "one candidate per request"),
	"suffix":  only("suffix", `""`, "insertion (suffix) is not supported"),
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
	r, err := parseWith(body, chatFields, "messages")
	if err != nil {
		return nil, err
	}
	return r, nil
}

// parseCompletion validates a /v1/completions body.
func parseCompletion(body []byte) (*request, *Error) {
	r, err := parseWith(body, completionFields, "prompt")
	if err != nil {
		return nil, err
	}
	if r.gen.MaxTokens == 0 {
		r.gen.MaxTokens = DefaultCompletionMaxTokens
	}
	return r, nil
}

func parseWith(body []byte, accept map[string]acceptFn, required string) (*request, *Error) {
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
	r := &request{gen: GenerateRequest{Temperature: 1, TopP: 1}}
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

func parseResponseFormat(f fields, n string, r *request) *Error {
	var rf struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(f[n], &rf) != nil || rf.Type != "text" {
		return unsupported(n, `only {"type": "text"} is supported: no JSON mode or schemas`)
	}
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
			default:
				return unsupported(p+"."+k, "messages carry role and content only (no tools, names or audio)")
			}
		}
		switch msg.Role {
		case "system", "user", "assistant":
		case "developer":
			msg.Role = "system"
		case "":
			return BadRequest(p+".role", "missing role")
		default:
			return unsupported(p+".role", fmt.Sprintf("role %q is not supported (system, developer, user, assistant)", msg.Role))
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
