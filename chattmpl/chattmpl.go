// Package chattmpl renders the Jinja chat templates that GGUF models carry
// (tokenizer.chat_template) for chats with tools, assistant tool calls and
// tool results, giving templates the variables and helpers that Hugging Face
// transformers' apply_chat_template gives them.
//
// # Engine
//
// Templates are run by github.com/ardanlabs/jinja (v1.8.0; later versions
// need a newer Go than this module's), a pure-Go, dependency-free Jinja
// engine written for LLM chat templates: it applies transformers'
// trim_blocks/lstrip_blocks defaults and has the filters, tests, string and
// dict methods, namespace(), loop controls and slicing those templates use.
// It was tried first and renders the published Llama 3.1/3.2, Qwen2.5,
// Qwen3, Mistral Nemo and Gemma 2/3 templates in testdata unchanged, so no
// other engine was needed. What it lacks is supplied here:
//
//   - tojson: its own sorts keys and escapes <, > and & when given indent
//     (Llama 3 renders tools with tojson(indent=4)), and writes floats the Go
//     way; the template's "| tojson" is rewritten to a replacement that
//     matches Python's json.dumps(ensure_ascii=False) with indent,
//     separators, sort_keys and ensure_ascii, keeping key order;
//   - strftime_now uses Input.Now (its own uses the clock);
//   - raise_exception reports an *ExceptionError carrying the message;
//   - range refuses to build more than 100000 items;
//   - bounds (below), since the engine has no context, step or size limits.
//
// # Data
//
// messages is a list of dicts with role and content (always a string,
// "" when empty); an assistant message with calls has tool_calls, a list of
// {"id", "type": "function", "function": {"name", "arguments"}} (absent
// otherwise: Llama 3 tests 'tool_calls' in message); a tool message has
// tool_call_id and name when set. tools, when there are any, is a list of
// {"type": "function", "function": {"name", "description", "parameters"}};
// with none it is undefined. JSON keeps its key order.
//
// arguments is a dict parsed from the call's JSON text, which is what
// transformers documents and what Llama 3.x, Qwen2.5, Qwen3 and Mistral
// templates expect (they apply tojson to it or to the whole function).
// Some templates (DeepSeek V3/R1, Functionary) instead concatenate the
// arguments into the prompt as a string, as OpenAI clients send them.
// Parse tells them apart by rendering a probe call: when the dict comes
// out in Python repr form ('key': ...) rather than as JSON, arguments are
// passed to that template as the JSON text. (Parse also uses a probe
// render, with one tool, for SupportsTools.)
//
// Mistral templates require tool call IDs of exactly 9 alphanumeric
// characters and raise otherwise; Gemma templates raise on system and tool
// roles. Those errors come back from Render as *ExceptionError.
//
// # Bounds
//
// Parse refuses sources over MaxSourceBytes and blocks or brackets nested
// deeper than 256. Render enforces, by instrumenting the template (see
// instrument): at most MaxSteps loop iterations plus macro calls, macro
// calls nested at most MaxMacroDepth deep (recursive macros would otherwise
// overflow the Go stack and kill the process), the context's cancellation
// and deadline and a wall-clock limit of RenderTimeout, and MaxRenderAlloc
// bytes allocated. The last is read from the Go runtime's heap allocation
// counter (runtime/metrics, about 0.7 µs a read) at every step; it is
// process-wide, so allocations of other goroutines during the render count
// too, and a loop that doubles a list each turn can reach about twice the
// limit before it is stopped. All are checked between steps only, so a
// single expression can still run long or allocate without bound (e.g.
// 'x' * 10000000000). The output is refused beyond MaxOutputBytes once
// rendered (the engine gives no way to stop it growing earlier). Panics in
// the engine are returned as errors. Templates come with model files and
// are trusted like the model itself; these bounds keep a broken or hostile
// one from hanging the caller or overflowing the stack, not from using
// memory for a moment.
package chattmpl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/metrics"
	"strings"
	"time"

	"github.com/ardanlabs/jinja"

	"github.com/neuron-tai/meshp2p/toolcall"
)

// Limits.
const (
	MaxSourceBytes = 256 << 10
	MaxOutputBytes = 4 << 20
	MaxSteps       = 200_000
	MaxMacroDepth  = 128
	MaxRenderAlloc = 256 << 20
	RenderTimeout  = 5 * time.Second
)

var (
	// ErrTooLarge is returned by Parse for sources over MaxSourceBytes.
	ErrTooLarge = errors.New("chattmpl: template source too large")
	// ErrLimit is wrapped by render errors that hit a bound.
	ErrLimit = errors.New("chattmpl: render limit exceeded")
)

// ExceptionError is the error of a template that called raise_exception.
type ExceptionError struct {
	Message string
}

func (e *ExceptionError) Error() string { return "template raised exception: " + e.Message }

// Message is a chat message. Role is system, user, assistant or tool.
type Message struct {
	Role, Content string
	ToolCalls     []ToolCall // assistant
	ToolCallID    string     // tool: the call answered
	Name          string     // tool: the tool's name
}

// ToolCall is a call made by the assistant.
type ToolCall struct {
	ID, Name  string
	Arguments string // JSON object text
}

// Tool is a function the model may call.
type Tool struct {
	Name, Description string
	Parameters        json.RawMessage // JSON schema; may be nil
}

// Input is what a template is rendered with.
type Input struct {
	Messages            []Message
	Tools               []Tool
	AddGenerationPrompt bool
	BOS, EOS            string
	Now                 time.Time // for strftime_now; zero means time.Now()
}

// ChatML is the ChatML chat template (<|im_start|>role ... <|im_end|>),
// for a model whose GGUF has none (serve --chat-template chatml): the
// demo model stories260K, say, which was never trained on chats.
const ChatML = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}" +
	"{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"

// Template is a parsed chat template. It is safe for concurrent use.
type Template struct {
	tmpl         *jinja.Template
	tools        bool
	argsAsString bool
	format       toolcall.Format
}

// Parse compiles a chat template.
func Parse(src string) (*Template, error) {
	if len(src) > MaxSourceBytes {
		return nil, fmt.Errorf("%w: %d bytes (at most %d)", ErrTooLarge, len(src), MaxSourceBytes)
	}
	inst, err := instrument(src)
	if err != nil {
		return nil, fmt.Errorf("chattmpl: parse: %w", err)
	}
	tmpl, err := compile(inst)
	if err != nil {
		return nil, fmt.Errorf("chattmpl: parse: %w", err)
	}
	t := &Template{tmpl: tmpl, format: detectFormat(src)}
	t.probe(src)
	return t, nil
}

func compile(src string) (t *jinja.Template, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("engine panic: %v", r)
		}
	}()
	return jinja.Compile(src)
}

// SupportsTools reports whether the template renders the tools it is given.
func (t *Template) SupportsTools() bool { return t.tools }

// Format reports the tool-call syntax the template's model writes, as
// detected from the template text; toolcall.Generic when unknown.
func (t *Template) Format() toolcall.Format { return t.format }

// Render renders the template.
func (t *Template) Render(ctx context.Context, in Input) (string, error) {
	out, err := t.render(ctx, in, t.argsAsString)
	if err != nil {
		return "", fmt.Errorf("chattmpl: render: %w", err)
	}
	return out, nil
}

// budget bounds one render.
type budget struct {
	ctx      context.Context
	deadline time.Time
	steps    int
	depth    int
	alloc0   uint64
	sample   []metrics.Sample
}

const allocMetric = "/gc/heap/allocs:bytes"

func (b *budget) step() error {
	b.steps++
	if b.steps > MaxSteps {
		return fmt.Errorf("%w: more than %d loop iterations and macro calls", ErrLimit, MaxSteps)
	}
	// Checked at every step: a loop can double a list or string each turn.
	if b.allocated() > MaxRenderAlloc {
		return fmt.Errorf("%w: rendering allocated more than %d bytes", ErrLimit, MaxRenderAlloc)
	}
	if b.steps%16 != 0 {
		return nil
	}
	if err := b.ctx.Err(); err != nil {
		return err
	}
	if time.Now().After(b.deadline) {
		return fmt.Errorf("%w: rendering took longer than %v", ErrLimit, RenderTimeout)
	}
	return nil
}

func (b *budget) allocated() uint64 {
	metrics.Read(b.sample)
	if b.sample[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return b.sample[0].Value.Uint64() - b.alloc0
}

var empty = jinja.NewString("")

func (t *Template) render(ctx context.Context, in Input, argsAsString bool) (out string, err error) {
	defer func() {
		if r := recover(); r != nil {
			out, err = "", fmt.Errorf("engine panic: %v", r)
		}
	}()
	if err := ctx.Err(); err != nil {
		return "", err
	}
	b := &budget{ctx: ctx, deadline: time.Now().Add(RenderTimeout), sample: []metrics.Sample{{Name: allocMetric}}}
	b.alloc0 = b.allocated()
	now := in.Now
	if now.IsZero() {
		now = time.Now()
	}

	msgs, err := messagesValue(in.Messages, argsAsString)
	if err != nil {
		return "", err
	}
	data := map[string]jinja.Value{
		"messages":              msgs,
		"add_generation_prompt": jinja.NewBool(in.AddGenerationPrompt),
		"bos_token":             jinja.NewString(in.BOS),
		"eos_token":             jinja.NewString(in.EOS),
		"raise_exception": jinja.NewCallable("raise_exception", func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
			msg := "raise_exception called"
			if len(args) > 0 {
				msg = args[0].String()
				if args[0].IsString() {
					msg = args[0].AsString()
				}
			}
			return jinja.Undefined(), &ExceptionError{Message: msg}
		}),
		"strftime_now": jinja.NewCallable("strftime_now", func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
			if len(args) == 0 || !args[0].IsString() {
				return jinja.Undefined(), errors.New("strftime_now: expected a format string")
			}
			return jinja.NewString(strftime(args[0].AsString(), now)), nil
		}),
		"range":  jinja.NewCallable("range", rangeFn),
		tojsonFn: jinja.NewCallable("tojson", toJSON),
		stepFn: jinja.NewCallable(stepFn, func([]jinja.Value, map[string]jinja.Value) (jinja.Value, error) {
			return empty, b.step()
		}),
		enterFn: jinja.NewCallable(enterFn, func([]jinja.Value, map[string]jinja.Value) (jinja.Value, error) {
			b.depth++
			if b.depth > MaxMacroDepth {
				return empty, fmt.Errorf("%w: macro calls nested deeper than %d", ErrLimit, MaxMacroDepth)
			}
			return empty, b.step()
		}),
		leaveFn: jinja.NewCallable(leaveFn, func([]jinja.Value, map[string]jinja.Value) (jinja.Value, error) {
			b.depth--
			return empty, nil
		}),
	}
	if len(in.Tools) > 0 {
		tools, err := toolsValue(in.Tools)
		if err != nil {
			return "", err
		}
		data["tools"] = tools
	}

	out, err = t.tmpl.RenderValues(data)
	if err != nil {
		return "", err
	}
	if len(out) > MaxOutputBytes {
		return "", fmt.Errorf("%w: output of %d bytes (at most %d)", ErrLimit, len(out), MaxOutputBytes)
	}
	return out, nil
}

// Names used by the probe renders.
const (
	probeTool  = "chattmpl_probe_tool"
	probeArg   = "chattmpl_probe_arg"
	probeValue = "chattmpl_probe_value"
)

// probe renders two sample chats to learn whether the template renders
// tools, and whether it wants call arguments as a dict or as JSON text.
func (t *Template) probe(src string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	tool := Tool{
		Name:        probeTool,
		Description: "Probe.",
		Parameters:  json.RawMessage(`{"type": "object", "properties": {"` + probeArg + `": {"type": "string"}}}`),
	}
	now := time.Date(2024, 7, 26, 0, 0, 0, 0, time.UTC)

	out, err := t.render(ctx, Input{
		Messages:            []Message{{Role: "user", Content: "Hello."}},
		Tools:               []Tool{tool},
		AddGenerationPrompt: true,
		Now:                 now,
	}, false)
	if err == nil {
		t.tools = strings.Contains(out, probeTool)
	} else {
		t.tools = mentionsTools(src)
	}

	out, err = t.render(ctx, Input{
		Messages: []Message{
			{Role: "user", Content: "Hello."},
			{Role: "assistant", ToolCalls: []ToolCall{{ID: "probe0001", Name: probeTool, Arguments: `{"` + probeArg + `": "` + probeValue + `"}`}}},
			{Role: "tool", ToolCallID: "probe0001", Name: probeTool, Content: "Done."},
		},
		Tools:               []Tool{tool},
		AddGenerationPrompt: true,
		Now:                 now,
	}, false)
	t.argsAsString = err == nil && !strings.Contains(out, `"`+probeArg+`"`) && strings.Contains(out, `'`+probeArg+`'`)
}

// mentionsTools reports whether a tag of the template uses the variable
// tools.
func mentionsTools(src string) bool {
	for i := 0; ; {
		j := strings.Index(src[i:], "tools")
		if j < 0 {
			return false
		}
		j += i
		before := byte(' ')
		if j > 0 {
			before = src[j-1]
		}
		after := byte(' ')
		if j+5 < len(src) {
			after = src[j+5]
		}
		if !isIdent(before) && !isIdent(after) && before != '.' {
			open := strings.LastIndexAny(src[:j], "{")
			closeTag := strings.LastIndex(src[:j], "}}")
			closeStmt := strings.LastIndex(src[:j], "%}")
			if open > closeTag && open > closeStmt {
				return true
			}
		}
		i = j + 5
	}
}

// detectFormat tells from the template text which tool-call syntax the
// model writes.
func detectFormat(src string) toolcall.Format {
	switch {
	case strings.Contains(src, "[TOOL_CALLS]"):
		return toolcall.Mistral
	case strings.Contains(src, "<tool_call>"):
		return toolcall.Hermes
	case strings.Contains(src, "<|python_tag|>"),
		strings.Contains(src, "<|start_header_id|>") && (strings.Contains(src, "ipython") || strings.Contains(src, `"parameters"`)):
		return toolcall.Llama3
	}
	return toolcall.Generic
}
