package client

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/neuron-tai/meshp2p/chattmpl"
	"github.com/neuron-tai/meshp2p/toolcall"
)

// Tool calling and constrained output, on the origin side: the chat is
// rendered with the model's own Jinja template when tools are in play
// (chattmpl), required or named calls and JSON formats become a grammar
// the tail enforces (SamplingParams.grammar; JSON schemas converted by the
// vocabulary's GrammarVocab), and the calls are parsed out of the text as
// it streams (toolcall, in the syntax the template's model family uses).

// Tool is a function the model may call (Parameters: its JSON schema).
type Tool = chattmpl.Tool

// ToolCall is one call (in a Message's history, or made by the model).
type ToolCall = chattmpl.ToolCall

// ToolCallDelta is a fragment of the call Index as it streams: the first
// carries ID and Name, the rest pieces of Arguments.
type ToolCallDelta struct {
	Index     int
	ID, Name  string
	Arguments string
}

// Tool choice modes.
const (
	ToolAuto     = "auto"
	ToolNone     = "none"
	ToolRequired = "required"
	ToolFunction = "function"
)

// Tools are the tools a generation may call and whether it must.
type Tools struct {
	List     []Tool
	Choice   string // ToolAuto ("" too), ToolNone, ToolRequired, ToolFunction
	Function string // ToolFunction: the one to call
	Parallel bool   // several calls in one turn
}

// active reports whether calls are parsed (tools given, choice not none).
func (t Tools) active() bool { return len(t.List) > 0 && t.Choice != ToolNone }

// forced reports whether a call is required (grammar-constrained).
func (t Tools) forced() bool {
	return len(t.List) > 0 && (t.Choice == ToolRequired || t.Choice == ToolFunction)
}

// Format constrains a generation's text: JSONObject any JSON object,
// Schema (JSON) valid JSON for that schema.
type Format struct {
	JSONObject bool
	Schema     json.RawMessage
}

func (f Format) set() bool { return f.JSONObject || f.Schema != nil }

// TokenLogprob is a generated token's log-probability (and its most
// likely alternatives), with the tokens' text.
type TokenLogprob struct {
	Token   string
	Bytes   []byte
	Logprob float32
	Top     []TopLogprob
}

// TopLogprob is one alternative to a generated token.
type TopLogprob struct {
	Token   string
	Logprob float32
	Bytes   []byte
}

// GrammarVocab is what a vocabulary offers for tools and constrained
// output (client/enginevocab's does: llama.cpp's grammar compiler and
// JSON-schema converter, and the GGUF's Jinja chat template).
type GrammarVocab interface {
	// CheckGrammar compiles a GBNF grammar against the vocabulary.
	CheckGrammar(gbnf string) error
	// SchemaToGrammar converts a JSON schema to GBNF (root rule "root");
	// it must refuse what CheckSchema refuses (the converter it wraps is
	// not written for hostile input).
	SchemaToGrammar(schema []byte) (string, error)
	// TemplateSource is the chat template (Jinja; "" none) and the text
	// of the BOS and EOS tokens.
	TemplateSource() (src, bos, eos string)
}

// Errors of tools and formats (errors.Is).
var (
	// ErrGrammar: a JSON schema or tool parameters the converter cannot
	// handle, or a grammar that does not compile (the message names why).
	ErrGrammar = errors.New("client: grammar")
	// ErrNoGrammar: the vocabulary cannot compile grammars.
	ErrNoGrammar = errors.New("client: this client cannot constrain output (its vocabulary has no grammar compiler)")
)

// MaxCallParts bounds the calls one grammar-forced turn may make.
const MaxCallParts = 16

// RenderTimeout bounds a Jinja rendering.
const RenderTimeout = 2 * time.Second

// needsJinja reports whether the prompt needs the Jinja renderer: tools,
// or tool calls and results in the history.
func (p Prompt) needsJinja() bool {
	if len(p.Tools) > 0 {
		return true
	}
	for _, m := range p.Messages {
		if m.Role == "tool" || len(m.ToolCalls) > 0 {
			return true
		}
	}
	return false
}

// renderTools renders a chat with tools: with the model's own template
// when it renders tools, else (or when it cannot render the history) with
// the tools described in a system message and calls and results written
// in the Generic syntax, through the same template. It returns the text
// and the syntax the model is expected to call tools in.
//
// addBOS tells the tokenizer whether to add the model's BOS: not when
// the template wrote it.
func renderTools(ctx context.Context, v Vocab, p Prompt) (text string, f toolcall.Format, addBOS bool, err error) {
	gv, ok := v.(GrammarVocab)
	if !ok {
		return "", 0, false, ErrNoGrammar
	}
	src, bos, eos := gv.TemplateSource()
	if src == "" {
		return "", 0, false, ErrNoChatTemplate
	}
	t, err := chattmpl.Parse(src)
	if err != nil {
		return "", 0, false, fmt.Errorf("%w: %w", ErrChatTemplate, err)
	}
	rctx, cancel := context.WithTimeout(ctx, RenderTimeout)
	defer cancel()
	if t.SupportsTools() {
		msgs := make([]chattmpl.Message, len(p.Messages))
		for i, m := range p.Messages {
			msgs[i] = chattmpl.Message(m)
		}
		if t.Format() == toolcall.Mistral {
			mistralIDs(msgs)
		}
		text, err := t.Render(rctx, chattmpl.Input{Messages: msgs, Tools: p.Tools, AddGenerationPrompt: true, BOS: bos, EOS: eos, Now: time.Now()})
		if err != nil {
			return "", 0, false, fmt.Errorf("%w: %w", ErrChatTemplate, err)
		}
		return text, t.Format(), bos == "" || !strings.HasPrefix(text, bos), nil
	}
	text, err = v.ApplyChatTemplate(genericToolChat(p), true)
	if err != nil {
		return "", 0, false, fmt.Errorf("%w: %w", ErrChatTemplate, err)
	}
	return text, toolcall.Generic, true, nil
}

// mistralIDs rewrites the history's call ids into the 9 alphanumeric
// characters Mistral's templates insist on (they raise otherwise): the
// same id always becomes the same 9 characters, so calls and results
// still pair up.
func mistralIDs(msgs []chattmpl.Message) {
	const alnum = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	short := func(id string) string {
		if len(id) == 9 && strings.Trim(id, alnum) == "" {
			return id
		}
		h := sha256.Sum256([]byte(id))
		b := make([]byte, 9)
		for i := range b {
			b[i] = alnum[int(h[i])%len(alnum)]
		}
		return string(b)
	}
	for i := range msgs {
		if msgs[i].ToolCallID != "" {
			msgs[i].ToolCallID = short(msgs[i].ToolCallID)
		}
		if len(msgs[i].ToolCalls) > 0 {
			calls := append([]chattmpl.ToolCall(nil), msgs[i].ToolCalls...)
			for j := range calls {
				calls[j].ID = short(calls[j].ID)
			}
			msgs[i].ToolCalls = calls
		}
	}
}

// genericToolChat writes tools, calls and results into plain turns for a
// template that does not render tools: a system message lists the tools
// and how to call them, an assistant's calls and a tool's results become
// text in the Generic syntax.
func genericToolChat(p Prompt) []Message {
	syn := toolcall.Generic.Syntax()
	var out []Message
	if len(p.Tools) > 0 {
		var sb strings.Builder
		sb.WriteString("You can call these functions. To call one, answer with ")
		sb.WriteString(syn.Prefix + `{"` + syn.NameKey + `": <function name>, "` + syn.ArgsKey + `": <arguments object>}` + syn.Suffix)
		sb.WriteString(" and nothing else.\nFunctions:\n")
		for _, t := range p.Tools {
			b, _ := json.Marshal(map[string]any{"name": t.Name, "description": t.Description, "parameters": rawOrEmpty(t.Parameters)})
			sb.Write(b)
			sb.WriteByte('\n')
		}
		sys := sb.String()
		if len(p.Messages) > 0 && p.Messages[0].Role == "system" {
			sys = p.Messages[0].Content + "\n\n" + sys
			p.Messages = p.Messages[1:]
		}
		out = append(out, Message{Role: "system", Content: sys})
	}
	for _, m := range p.Messages {
		switch {
		case m.Role == "tool":
			out = append(out, Message{Role: "user", Content: "<tool_response>\n" + m.Content + "\n</tool_response>"})
		case len(m.ToolCalls) > 0:
			var sb strings.Builder
			sb.WriteString(m.Content)
			for i, c := range m.ToolCalls {
				if i > 0 || m.Content != "" {
					sb.WriteString(syn.Sep)
				}
				b, _ := json.Marshal(map[string]any{syn.NameKey: c.Name, syn.ArgsKey: json.RawMessage(argsOrEmpty(c.Arguments))})
				sb.WriteString(syn.Prefix + string(b) + syn.Suffix)
			}
			out = append(out, Message{Role: m.Role, Content: sb.String()})
		default:
			out = append(out, Message{Role: m.Role, Content: m.Content})
		}
	}
	return out
}

func rawOrEmpty(r json.RawMessage) any {
	if r == nil {
		return map[string]any{"type": "object"}
	}
	return r
}

func argsOrEmpty(s string) string {
	if strings.TrimSpace(s) == "" || !json.Valid([]byte(s)) {
		return "{}"
	}
	return s
}

// grammarFor is the grammar a generation's tools or format impose ("":
// none): a forced call in syntax f, or JSON (any object, or a schema).
func grammarFor(v Vocab, tools Tools, format Format, f toolcall.Format) (string, error) {
	if !tools.forced() && !format.set() {
		return "", nil
	}
	gv, ok := v.(GrammarVocab)
	if !ok {
		return "", ErrNoGrammar
	}
	var g string
	var err error
	switch {
	case tools.forced():
		g, err = callGrammar(gv, tools, f)
	case format.Schema != nil:
		g, err = gv.SchemaToGrammar(format.Schema)
	default:
		g, err = gv.SchemaToGrammar([]byte(`{"type":"object"}`))
	}
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrGrammar, err)
	}
	if err := gv.CheckGrammar(g); err != nil {
		return "", fmt.Errorf("%w: %w", ErrGrammar, err)
	}
	return g, nil
}

var rootRule = regexp.MustCompile(`(?m)^root ::=`)

// callGrammar is GBNF for one (or, with Parallel, up to MaxCallParts)
// calls of the allowed tools in syntax f, each call's arguments valid for
// its function's parameters schema.
func callGrammar(gv GrammarVocab, tools Tools, f toolcall.Format) (string, error) {
	syn := f.Syntax()
	var alts []any
	defs := map[string]any{}
	for i, t := range tools.List {
		if tools.Choice == ToolFunction && t.Name != tools.Function {
			continue
		}
		params, err := hoistDefs(t.Parameters, fmt.Sprintf("t%d-", i), defs)
		if err != nil {
			return "", fmt.Errorf("tool %s: %w", t.Name, err)
		}
		alts = append(alts, map[string]any{
			"type": "object",
			"properties": orderedObject{
				{syn.NameKey, map[string]any{"const": t.Name}},
				{syn.ArgsKey, params},
			},
			"required":             []string{syn.NameKey, syn.ArgsKey},
			"additionalProperties": false,
		})
	}
	if len(alts) == 0 {
		return "", fmt.Errorf("no tool named %q", tools.Function)
	}
	schema := map[string]any{"anyOf": alts}
	if len(alts) == 1 {
		schema = alts[0].(map[string]any)
	}
	if len(defs) > 0 {
		schema["$defs"] = defs
	}
	b, err := json.Marshal(schema)
	if err != nil {
		return "", err
	}
	call, err := gv.SchemaToGrammar(b)
	if err != nil {
		return "", err
	}
	call = rootRule.ReplaceAllString(call, "meshp2p-call ::=")
	one := seq(lit(syn.Prefix), "meshp2p-call", lit(syn.Suffix))
	rest := ""
	// A named function is one call (OpenAI's); required may make several.
	if tools.Parallel && tools.Choice != ToolFunction {
		rest = fmt.Sprintf("(%s){0,%d}", seq(lit(syn.Sep), one), MaxCallParts-1)
	}
	return "root ::= " + seq(lit(syn.Open), one, rest, lit(syn.Close)) + "\n" + call, nil
}

// hoistDefs moves a tool's $defs (and definitions) to the wrapper schema's
// $defs under prefix and rewrites its $refs to match: nested under the
// call's arguments, "#/$defs/X" would no longer resolve (Pydantic and zod
// write schemas this way). Other $refs into the tool's own schema are
// refused.
func hoistDefs(params json.RawMessage, prefix string, defs map[string]any) (any, error) {
	if params == nil {
		return map[string]any{"type": "object"}, nil
	}
	var v any
	if err := json.Unmarshal(params, &v); err != nil {
		return nil, err
	}
	m, ok := v.(map[string]any)
	if !ok {
		return v, nil
	}
	for _, key := range []string{"$defs", "definitions"} {
		d, ok := m[key].(map[string]any)
		if !ok {
			continue
		}
		delete(m, key)
		for name, def := range d {
			defs[prefix+name] = def
		}
	}
	var err error
	var rewrite func(v any) any
	rewrite = func(v any) any {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				if ref, ok := e.(string); ok && k == "$ref" {
					switch {
					case strings.HasPrefix(ref, "#/$defs/"):
						x[k] = "#/$defs/" + prefix + strings.TrimPrefix(ref, "#/$defs/")
					case strings.HasPrefix(ref, "#/definitions/"):
						x[k] = "#/$defs/" + prefix + strings.TrimPrefix(ref, "#/definitions/")
					default:
						err = fmt.Errorf("$ref %q: in tool parameters only #/$defs/… and #/definitions/… are supported", ref)
					}
					continue
				}
				x[k] = rewrite(e)
			}
		case []any:
			for i, e := range x {
				x[i] = rewrite(e)
			}
		}
		return v
	}
	out := rewrite(m)
	for name, def := range defs {
		if strings.HasPrefix(name, prefix) {
			defs[name] = rewrite(def)
		}
	}
	return out, err
}

// lit is s as a GBNF literal ("" for the empty string).
func lit(s string) string {
	if s == "" {
		return ""
	}
	return strconv.Quote(s)
}

// seq joins the non-empty GBNF items with spaces.
func seq(items ...string) string {
	var out []string
	for _, it := range items {
		if it != "" {
			out = append(out, it)
		}
	}
	return strings.Join(out, " ")
}

// orderedObject marshals as a JSON object keeping its members' order (the
// converter emits properties in order: the name before the arguments).
type orderedObject []struct {
	k string
	v any
}

func (o orderedObject) MarshalJSON() ([]byte, error) {
	var sb strings.Builder
	sb.WriteByte('{')
	for i, kv := range o {
		if i > 0 {
			sb.WriteByte(',')
		}
		k, _ := json.Marshal(kv.k)
		v, err := json.Marshal(kv.v)
		if err != nil {
			return nil, err
		}
		sb.Write(k)
		sb.WriteByte(':')
		sb.Write(v)
	}
	sb.WriteByte('}')
	return []byte(sb.String()), nil
}

// callSplitter turns the final text of a generation with tools into
// content and tool-call fragments (ids assigned here) as it streams.
type callSplitter struct {
	p      *toolcall.Parser
	ids    map[int]string
	onText func(string)
	onCall func(ToolCallDelta)
	calls  []ToolCall
}

func newCallSplitter(f toolcall.Format, tools []Tool, onText func(string), onCall func(ToolCallDelta)) *callSplitter {
	names := make([]string, len(tools))
	for i, t := range tools {
		names[i] = t.Name
	}
	if onCall == nil {
		onCall = func(ToolCallDelta) {}
	}
	return &callSplitter{p: toolcall.NewParser(f, names), ids: map[int]string{}, onText: onText, onCall: onCall}
}

func (s *callSplitter) write(text string) {
	content, ds := s.p.Write(text)
	s.emit(content, ds)
}

func (s *callSplitter) emit(content string, ds []toolcall.Delta) {
	s.onText(content)
	for _, d := range ds {
		out := ToolCallDelta{Index: d.Index, Name: d.Name, Arguments: d.Arguments}
		if _, ok := s.ids[d.Index]; !ok {
			out.ID = newCallID()
			s.ids[d.Index] = out.ID
		}
		s.onCall(out)
	}
}

// close flushes the parser and keeps the calls it parsed.
func (s *callSplitter) close() {
	content, ds, calls := s.p.Close()
	s.emit(content, ds)
	idx := s.p.CallIndexes()
	for i, c := range calls {
		id, ok := "", false
		if i < len(idx) {
			id, ok = s.ids[idx[i]]
		}
		if !ok {
			id = newCallID()
		}
		s.calls = append(s.calls, ToolCall{ID: id, Name: c.Name, Arguments: c.Arguments})
	}
}

func newCallID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "call_" + hex.EncodeToString(b[:])
}
