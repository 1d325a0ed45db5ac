package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
)

// checkGen validates what every API shape feeds the backend beyond
// sampling: tools, tool choice, response format and log-probabilities,
// with the same bounds and messages whichever shape the request came in.
// p names the request's fields in that shape's words (FieldNames).
func checkGen(g *GenerateRequest, p FieldNames) *Error {
	if len(g.Tools) > MaxTools {
		return badField(p.Tools, "at most %d tools per request, got %d", MaxTools, len(g.Tools))
	}
	total := 0
	seen := map[string]bool{}
	for i, t := range g.Tools {
		f := fmt.Sprintf("%s[%d]", p.Tools, i)
		if !toolName.MatchString(t.Name) {
			return badField(f+p.ToolName, "tool name %q must be 1 to %d characters of a-z, A-Z, 0-9, _ and -", t.Name, MaxToolNameBytes)
		}
		if seen[t.Name] {
			return badField(f+p.ToolName, "tool %q is defined twice", t.Name)
		}
		seen[t.Name] = true
		if t.Parameters != nil {
			if e := checkSchema(t.Parameters, f+p.ToolParams, true); e != nil {
				return e
			}
		}
		total += len(t.Name) + len(t.Description) + len(t.Parameters)
	}
	if total > MaxToolsBytes {
		return badField(p.Tools, "tools take %d bytes, more than the %d allowed", total, MaxToolsBytes)
	}
	switch g.ToolChoice.Mode {
	case "", ToolAuto, ToolNone:
	case ToolRequired:
		if len(g.Tools) == 0 {
			return badField(p.ToolChoice, "tool_choice requires a tool call but no tools are given")
		}
	case ToolFunction:
		if !seen[g.ToolChoice.Name] {
			return badField(p.ToolChoice, "tool_choice names function %q, which is not among the tools", g.ToolChoice.Name)
		}
	default:
		return badField(p.ToolChoice, "unknown tool_choice %q", g.ToolChoice.Mode)
	}
	switch g.Format.Type {
	case "", FormatText, FormatJSONObject:
	case FormatJSONSchema:
		if g.Format.Schema == nil {
			return badField(p.Format, "json_schema needs a schema")
		}
		if e := checkSchema(g.Format.Schema, p.Format, false); e != nil {
			return e
		}
	default:
		return badField(p.Format, "unknown response format type %q (text, json_object, json_schema)", g.Format.Type)
	}
	if g.Format.Type != "" && g.Format.Type != FormatText && len(g.Tools) > 0 && g.ToolChoice.Mode != ToolNone {
		return badField(p.Format, "a JSON response format and tool calls cannot be combined (set tool_choice none, or drop the format)")
	}
	if g.TopLogprobs < 0 || g.TopLogprobs > MaxTopLogprobs {
		return badField(p.TopLogprobs, "top_logprobs must be an integer in [0, %d]", MaxTopLogprobs)
	}
	if g.TopLogprobs > 0 && !g.Logprobs {
		return badField(p.TopLogprobs, "top_logprobs needs logprobs: true")
	}
	for i, m := range g.Messages {
		for j, c := range m.ToolCalls {
			f := fmt.Sprintf("messages[%d].tool_calls[%d]", i, j)
			if len(c.ID) > MaxToolCallIDSize {
				return badField(f+".id", "tool call ids are at most %d bytes", MaxToolCallIDSize)
			}
			if !toolName.MatchString(c.Name) {
				return badField(f+".function.name", "function name %q must be 1 to %d characters of a-z, A-Z, 0-9, _ and -", c.Name, MaxToolNameBytes)
			}
			if !json.Valid([]byte(c.Arguments)) {
				return badField(f+".function.arguments", "arguments must be JSON text (an object)")
			}
		}
		if len(m.ToolCallID) > MaxToolCallIDSize {
			return badField(fmt.Sprintf("messages[%d].tool_call_id", i), "tool call ids are at most %d bytes", MaxToolCallIDSize)
		}
	}
	return nil
}

// FieldNames are a shape's names of the fields checkGen checks.
type FieldNames struct {
	Tools, ToolName, ToolParams, ToolChoice, Format, TopLogprobs string
}

// openAINames are chat completions' field names.
var openAINames = FieldNames{Tools: "tools", ToolName: ".function.name", ToolParams: ".function.parameters",
	ToolChoice: "tool_choice", Format: "response_format", TopLogprobs: "top_logprobs"}

var toolName = regexp.MustCompile(fmt.Sprintf(`^[a-zA-Z0-9_-]{1,%d}$`, MaxToolNameBytes))

// checkSchema bounds a JSON schema's size and nesting; object requires it
// to be an object schema (tool parameters). Whether the grammar converter
// handles each construct is checked where the grammar is built (the
// backend), which names the construct it refuses.
func checkSchema(s json.RawMessage, field string, object bool) *Error {
	if len(s) > MaxSchemaBytes {
		return badField(field, "schema of %d bytes, more than the %d allowed", len(s), MaxSchemaBytes)
	}
	var v any
	dec := json.NewDecoder(bytes.NewReader(s))
	dec.UseNumber()
	if dec.Decode(&v) != nil {
		return badField(field, "the schema is not valid JSON")
	}
	m, ok := v.(map[string]any)
	if !ok {
		if b, isBool := v.(bool); isBool && b && !object {
			return nil
		}
		return badField(field, "the schema must be a JSON object")
	}
	if object {
		if t, ok := m["type"]; ok && t != "object" {
			return badField(field, "function parameters must be an object schema (type object), got type %v", t)
		}
	}
	if d := depth(v); d > MaxSchemaDepth {
		return badField(field, "the schema nests %d levels deep, more than the %d allowed", d, MaxSchemaDepth)
	}
	return nil
}

func depth(v any) int {
	d := 0
	switch x := v.(type) {
	case map[string]any:
		for _, e := range x {
			d = max(d, depth(e))
		}
	case []any:
		for _, e := range x {
			d = max(d, depth(e))
		}
	default:
		return 0
	}
	return d + 1
}

// badField is a 400 whose message starts with the field it names.
func badField(param, format string, args ...any) *Error {
	return BadRequest(param, "%s: %s", param, fmt.Sprintf(format, args...))
}
