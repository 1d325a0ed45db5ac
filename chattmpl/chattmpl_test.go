package chattmpl

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ardanlabs/jinja"

	"github.com/neuron-tai/meshp2p/toolcall"
)

var (
	now = time.Date(2025, 3, 4, 10, 30, 0, 0, time.UTC)

	weatherTool = Tool{
		Name:        "get_weather",
		Description: "Get the current weather.",
		Parameters:  json.RawMessage(`{"type": "object", "properties": {"city": {"type": "string", "description": "City name"}}, "required": ["city"]}`),
	}

	// What json.dumps gives for weatherTool in OpenAI form.
	weatherJSON = `{"type": "function", "function": {"name": "get_weather", "description": "Get the current weather.", ` +
		`"parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}}, "required": ["city"]}}}`
	// And json.dumps(indent=4).
	weatherJSON4 = `{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {
                    "type": "string",
                    "description": "City name"
                }
            },
            "required": [
                "city"
            ]
        }
    }
}`

	plainChat = Input{
		Messages:            []Message{{Role: "system", Content: "You are terse."}, {Role: "user", Content: "Hi there"}},
		AddGenerationPrompt: true,
	}
	userOnlyChat = Input{
		Messages:            []Message{{Role: "user", Content: "Hi there"}},
		AddGenerationPrompt: true,
	}
	toolsChat = Input{
		Messages:            []Message{{Role: "user", Content: "What is the weather in Paris?"}},
		Tools:               []Tool{weatherTool},
		AddGenerationPrompt: true,
	}
	callChat = Input{
		Messages: []Message{
			{Role: "user", Content: "What is the weather in Paris?"},
			{Role: "assistant", ToolCalls: []ToolCall{{ID: "call12345", Name: "get_weather", Arguments: `{"city":"Paris"}`}}},
			{Role: "tool", ToolCallID: "call12345", Name: "get_weather", Content: "Sunny, 21 C"},
		},
		Tools:               []Tool{weatherTool},
		AddGenerationPrompt: true,
	}
)

type renderCase struct {
	name    string
	in      Input
	want    []string // substrings of the output, in order
	notWant []string
	wantErr string // substring of an *ExceptionError message
}

func TestFixtures(t *testing.T) {
	qwenCall := "<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n" +
		"<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n" +
		"<|im_start|>user\n<tool_response>\nSunny, 21 C\n</tool_response><|im_end|>\n" +
		"<|im_start|>assistant\n"
	qwenTools := "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n" +
		"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n" + weatherJSON + "\n</tools>\n\n" +
		"For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n"
	llamaTools := "<|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\nCutting Knowledge Date: December 2023\n"
	llamaUserTools := "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n" +
		"Given the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.\n\n" +
		"Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}.Do not use variables.\n\n" +
		weatherJSON4 + "\n\nWhat is the weather in Paris?<|eot_id|>"
	llamaCall := "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}<|eot_id|>" +
		// The template tojson-encodes string content too ("is iterable" holds for strings).
		"<|start_header_id|>ipython<|end_header_id|>\n\n\"Sunny, 21 C\"<|eot_id|>" +
		"<|start_header_id|>assistant<|end_header_id|>\n\n"
	llamaCases := func(date string) []renderCase {
		return []renderCase{
			{name: "plain", in: plainChat, want: []string{"<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n" +
				"Cutting Knowledge Date: December 2023\nToday Date: " + date + "\n\nYou are terse.<|eot_id|>" +
				"<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
				notWant: []string{"ipython"}},
			{name: "tools", in: toolsChat, want: []string{llamaTools, "Today Date: " + date + "\n\n", llamaUserTools}},
			{name: "call", in: callChat, want: []string{llamaTools, llamaUserTools, llamaCall}},
		}
	}
	gemmaTools := renderCase{name: "tools", in: toolsChat,
		want:    []string{"<bos><start_of_turn>user\nWhat is the weather in Paris?<end_of_turn>\n<start_of_turn>model\n"},
		notWant: []string{"get_weather"}}
	gemmaCall := renderCase{name: "call", in: callChat, wantErr: "Conversation roles must alternate user/assistant/user/assistant/..."}

	tests := []struct {
		file   string
		bos    string
		eos    string
		tools  bool
		format toolcall.Format
		cases  []renderCase
	}{
		{file: "Qwen-Qwen2.5-7B-Instruct.jinja", tools: true, format: toolcall.Hermes, cases: []renderCase{
			{name: "plain", in: plainChat, want: []string{"<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"}},
			{name: "user only", in: userOnlyChat, want: []string{"<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi there"}},
			{name: "tools", in: toolsChat, want: []string{
				"<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n" + qwenTools,
				"<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n<|im_start|>assistant\n"}},
			{name: "call", in: callChat, want: []string{qwenTools, qwenCall}},
		}},
		{file: "Qwen-Qwen3-0.6B.jinja", tools: true, format: toolcall.Hermes, cases: []renderCase{
			{name: "plain", in: plainChat, want: []string{"<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"}},
			{name: "tools", in: toolsChat, want: []string{"<|im_start|>system\n" + qwenTools,
				"<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n<|im_start|>assistant\n"}},
			{name: "call", in: callChat, want: []string{qwenTools, qwenCall}},
			{name: "system with tools", in: Input{Messages: append([]Message{{Role: "system", Content: "Be brief."}}, toolsChat.Messages...), Tools: toolsChat.Tools},
				want: []string{"<|im_start|>system\nBe brief.\n\n# Tools\n"}, notWant: []string{"<|im_start|>assistant"}},
		}},
		{file: "meta-llama-Llama-3.1-8B-Instruct.jinja", bos: "<|begin_of_text|>", tools: true, format: toolcall.Llama3, cases: llamaCases("26 Jul 2024")},
		{file: "meta-llama-Llama-3.2-3B-Instruct.jinja", bos: "<|begin_of_text|>", tools: true, format: toolcall.Llama3, cases: llamaCases("04 Mar 2025")},
		{file: "mistralai-Mistral-Nemo-Instruct-2407.jinja", bos: "<s>", eos: "</s>", tools: true, format: toolcall.Mistral, cases: []renderCase{
			{name: "plain", in: plainChat, want: []string{"<s>[INST]You are terse.\n\nHi there[/INST]"}},
			{name: "tools", in: toolsChat, want: []string{"<s>[AVAILABLE_TOOLS][" + weatherJSON + "][/AVAILABLE_TOOLS][INST]What is the weather in Paris?[/INST]"}},
			{name: "call", in: callChat, want: []string{
				"[AVAILABLE_TOOLS][" + weatherJSON + "][/AVAILABLE_TOOLS][INST]What is the weather in Paris?[/INST]" +
					"[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"call12345\"}]</s>" +
					"[TOOL_RESULTS]{\"content\": Sunny, 21 C, \"call_id\": \"call12345\"}[/TOOL_RESULTS]"}},
			{name: "bad call id", in: Input{Messages: []Message{
				{Role: "user", Content: "Hi"},
				{Role: "assistant", ToolCalls: []ToolCall{{ID: "call_1", Name: "get_weather", Arguments: `{}`}}},
			}}, wantErr: "Tool call IDs should be alphanumeric strings with length 9!"},
		}},
		{file: "google-gemma-2-2b-it.jinja", bos: "<bos>", format: toolcall.Generic, cases: []renderCase{
			{name: "plain", in: plainChat, wantErr: "System role not supported"},
			{name: "user only", in: userOnlyChat, want: []string{"<bos><start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n"}},
			gemmaTools, gemmaCall,
		}},
		{file: "google-gemma-3-it.jinja", bos: "<bos>", format: toolcall.Generic, cases: []renderCase{
			{name: "plain", in: plainChat, want: []string{"<bos><start_of_turn>user\nYou are terse.\n\nHi there<end_of_turn>\n<start_of_turn>model\n"}},
			gemmaTools, gemmaCall,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			src, err := os.ReadFile("testdata/" + tt.file)
			if err != nil {
				t.Fatal(err)
			}
			tmpl, err := Parse(string(src))
			if err != nil {
				t.Fatal(err)
			}
			if tmpl.SupportsTools() != tt.tools {
				t.Errorf("SupportsTools() = %v, want %v", tmpl.SupportsTools(), tt.tools)
			}
			if tmpl.Format() != tt.format {
				t.Errorf("Format() = %v, want %v", tmpl.Format(), tt.format)
			}
			if tmpl.argsAsString {
				t.Errorf("arguments passed as a string")
			}
			// Odd input gives an error or an output, never a panic.
			for _, in := range []Input{{}, {Messages: []Message{{Role: "tool"}}}, {Messages: []Message{{Role: "assistant", ToolCalls: []ToolCall{{}}}}}} {
				if _, err := tmpl.Render(context.Background(), in); err != nil && strings.Contains(err.Error(), "panic") {
					t.Errorf("%+v: %v", in, err)
				}
			}
			for _, c := range tt.cases {
				t.Run(c.name, func(t *testing.T) {
					in := c.in
					in.BOS, in.EOS, in.Now = tt.bos, tt.eos, now
					out, err := tmpl.Render(context.Background(), in)
					if c.wantErr != "" {
						var ee *ExceptionError
						if !errors.As(err, &ee) || ee.Message != c.wantErr {
							t.Fatalf("err = %v, want exception %q", err, c.wantErr)
						}
						return
					}
					if err != nil {
						t.Fatal(err)
					}
					rest := out
					for _, w := range c.want {
						i := strings.Index(rest, w)
						if i < 0 {
							t.Fatalf("output lacks (in order) %q\noutput:\n%s", w, out)
						}
						rest = rest[i+len(w):]
					}
					for _, w := range c.notWant {
						if strings.Contains(out, w) {
							t.Errorf("output has %q\noutput:\n%s", w, out)
						}
					}
				})
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name, src string
		is        error
	}{
		{"unclosed block", "{% if messages %}x", nil},
		{"unclosed tag", "{{ messages ", nil},
		{"unknown statement", "{% frobnicate %}", nil},
		{"bad expression", "{{ messages[ }}", nil},
		{"too large", strings.Repeat("a", MaxSourceBytes+1), ErrTooLarge},
		{"deep blocks", strings.Repeat("{% if true %}", maxBlockDepth+1) + strings.Repeat("{% endif %}", maxBlockDepth+1), nil},
		{"deep brackets", "{{ " + strings.Repeat("(", maxExprDepth+1) + "1" + strings.Repeat(")", maxExprDepth+1) + " }}", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse(tt.src)
			if err == nil {
				t.Fatal("no error")
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Fatalf("err = %v, want %v", err, tt.is)
			}
		})
	}
	if _, err := Parse(strings.Repeat("a", MaxSourceBytes)); err != nil {
		t.Errorf("source of MaxSourceBytes: %v", err)
	}
}

func TestRaiseException(t *testing.T) {
	tmpl, err := Parse(`{% if messages[0].role != 'user' %}{{ raise_exception("first message is " + messages[0].role) }}{% endif %}ok`)
	if err != nil {
		t.Fatal(err)
	}
	_, err = tmpl.Render(context.Background(), Input{Messages: []Message{{Role: "system"}}})
	var ee *ExceptionError
	if !errors.As(err, &ee) || ee.Message != "first message is system" {
		t.Fatalf("err = %v", err)
	}
	out, err := tmpl.Render(context.Background(), Input{Messages: []Message{{Role: "user"}}})
	if err != nil || out != "ok" {
		t.Fatalf("%q, %v", out, err)
	}
}

// TestBounds checks that runaway templates stop, quickly, with an error.
func TestBounds(t *testing.T) {
	big := strings.Repeat("abcdefgh", 16<<10)
	tests := []struct {
		name string
		src  string
		ctx  func() (context.Context, context.CancelFunc)
		is   error
	}{
		{"nested loops", `{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}`, nil, ErrLimit},
		{"huge range", `{% for i in range(10000000000) %}x{% endfor %}`, nil, ErrLimit},
		{"loop over string", `{% set ns = namespace(s="ab") %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{% for c in ns.s %}{% endfor %}`, nil, ErrLimit},
		{"recursive macro", `{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}`, nil, ErrLimit},
		{"self-applied macro", `{% macro f(g) %}{{ g(g) }}{% endmacro %}{{ f(f) }}`, nil, ErrLimit},
		{"exponential macro", `{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60) }}`, nil, ErrLimit},
		{"doubling list", `{% set ns = namespace(l=[1, 2, 3, 4]) %}{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l | length }}`, nil, ErrLimit},
		{"huge output", `{% for i in range(100000) %}{{ "x" * 100 }}{% endfor %}`, nil, ErrLimit},
		{"cancelled", `{% for m in messages %}{{ m.content }}{% endfor %}`, func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			return ctx, cancel
		}, context.Canceled},
		{"deadline", `{% for i in range(100000) %}{% set x = messages | tojson %}{% endfor %}`, func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 50*time.Millisecond)
		}, context.DeadlineExceeded},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tmpl, err := Parse(tt.src)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.Background(), context.CancelFunc(func() {})
			if tt.ctx != nil {
				ctx, cancel = tt.ctx()
			}
			defer cancel()
			start := time.Now()
			_, err = tmpl.Render(ctx, Input{Messages: []Message{{Role: "user", Content: big}}})
			if !errors.Is(err, tt.is) {
				t.Fatalf("err = %v, want %v", err, tt.is)
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Errorf("took %v", d)
			}
		})
	}
}

// TestInstrumentKeepsOutput renders templates with and without the
// instrumentation, using the engine directly, and expects the same text.
func TestInstrumentKeepsOutput(t *testing.T) {
	srcs := []string{
		"{% for m in messages %}\n  {{ m.role }}\n{% endfor %}\n",
		"{%- for m in messages -%}\n  {{ m.role }}  \n  {%- endfor %}\nend",
		"{% macro r(x) %}\n  [{{ x }}]\n{% endmacro %}\n{{ r(1) }}{%- macro s(x) -%}\n  <{{ x }}>\n  {%- endmacro -%}\n{{ s(2) }}",
		"a\n    {% for i in range(2) %}\n    {{ i }}\n    {% else %}none{% endfor %}\n  b",
		"{% raw %}{% for x in y %}{{ x | tojson }}{% endraw %}{# {% for %} #}{{ '{% for %}' }}",
		"{% set x %}{% for m in messages %}{{ m.content }}{% endfor %}{% endset %}{{ x | upper }}",
		"{% for m in messages if m.role == 'user' %}{% if loop.first %}first {% endif %}{{ loop.index }}{% endfor %}",
	}
	data := func() map[string]jinja.Value {
		msgs, err := messagesValue([]Message{{Role: "user", Content: "a"}, {Role: "assistant", Content: "b"}, {Role: "user", Content: "c"}}, false)
		if err != nil {
			t.Fatal(err)
		}
		empty := jinja.NewCallable("nop", func([]jinja.Value, map[string]jinja.Value) (jinja.Value, error) { return jinja.NewString(""), nil })
		return map[string]jinja.Value{"messages": msgs, stepFn: empty, enterFn: empty, leaveFn: empty}
	}
	for _, src := range srcs {
		plain, err := jinja.Compile(src)
		if err != nil {
			t.Fatalf("%q: %v", src, err)
		}
		want, err := plain.RenderValues(data())
		if err != nil {
			t.Fatalf("%q: %v", src, err)
		}
		inst, err := instrument(src)
		if err != nil {
			t.Fatal(err)
		}
		tmpl, err := jinja.Compile(inst)
		if err != nil {
			t.Fatalf("%q: %v", inst, err)
		}
		got, err := tmpl.RenderValues(data())
		if err != nil {
			t.Fatalf("%q: %v", inst, err)
		}
		if got != want {
			t.Errorf("%q\ninstrumented: %q\ngot  %q\nwant %q", src, inst, got, want)
		}
	}
}

func TestToJSON(t *testing.T) {
	v, err := jsonValue([]byte(`{"b": 1, "a": [1.0, 1e16, 0.0001, 1e-05, 123456789.0, -2, 1.5, 1e400], "s": "<&>\"\\é\u0001\n", "n": null, "t": true, "e": {}, "l": []}`))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		kwargs map[string]jinja.Value
		want   string
	}{
		{"default", nil, `{"b": 1, "a": [1.0, 1e+16, 0.0001, 1e-05, 123456789.0, -2, 1.5, Infinity], "s": "<&>\"\\é\u0001\n", "n": null, "t": true, "e": {}, "l": []}`},
		{"indent", map[string]jinja.Value{"indent": jinja.NewInt(2)}, "{\n  \"b\": 1,\n  \"a\": [\n    1.0,\n    1e+16,\n    0.0001,\n    1e-05,\n    123456789.0,\n    -2,\n    1.5,\n    Infinity\n  ],\n" +
			"  \"s\": \"<&>\\\"\\\\é\\u0001\\n\",\n  \"n\": null,\n  \"t\": true,\n  \"e\": {},\n  \"l\": []\n}"},
		{"separators sort_keys ensure_ascii", map[string]jinja.Value{
			"separators": jinja.NewList([]jinja.Value{jinja.NewString(","), jinja.NewString(":")}),
			"sort_keys":  jinja.NewBool(true), "ensure_ascii": jinja.NewBool(true)},
			`{"a":[1.0,1e+16,0.0001,1e-05,123456789.0,-2,1.5,Infinity],"b":1,"e":{},"l":[],"n":null,"s":"<&>\"\\\u00e9\u0001\n","t":true}`},
	}
	for _, tt := range tests {
		got, err := toJSON([]jinja.Value{v}, tt.kwargs)
		if err != nil {
			t.Fatal(err)
		}
		if got.AsString() != tt.want {
			t.Errorf("%s:\ngot  %s\nwant %s", tt.name, got.AsString(), tt.want)
		}
	}
	got, _ := toJSON([]jinja.Value{jinja.NewString("😀")}, map[string]jinja.Value{"ensure_ascii": jinja.NewBool(true)})
	if got.AsString() != `"\ud83d\ude00"` {
		t.Errorf("surrogates: %s", got.AsString())
	}
	// Through a template: "| tojson" is the replacement.
	tmpl, err := Parse(`{{ tools | tojson(indent=1) }}|{{ tools[0]['function']|tojson }}`)
	if err != nil {
		t.Fatal(err)
	}
	out, err := tmpl.Render(context.Background(), Input{Tools: []Tool{{Name: "f", Description: "a<b"}}})
	if err != nil {
		t.Fatal(err)
	}
	want := "[\n {\n  \"type\": \"function\",\n  \"function\": {\n   \"name\": \"f\",\n   \"description\": \"a<b\"\n  }\n }\n]|{\"name\": \"f\", \"description\": \"a<b\"}"
	if out != want {
		t.Errorf("got %q\nwant %q", out, want)
	}
}

func TestStrftime(t *testing.T) {
	tm := time.Date(2024, 7, 6, 15, 4, 5, 0, time.UTC)
	for format, want := range map[string]string{
		"%d %b %Y":       "06 Jul 2024",
		"%B %-d, %Y":     "July 6, 2024",
		"%Y-%m-%d %H:%M": "2024-07-06 15:04",
		"%A %a %I%p %j":  "Saturday Sat 03PM 188",
		"100%% %q":       "100% %q",
	} {
		if got := strftime(format, tm); got != want {
			t.Errorf("%q: %q, want %q", format, got, want)
		}
	}
	tmpl, err := Parse(`{{ strftime_now("%d %b %Y") }}`)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := tmpl.Render(context.Background(), Input{Now: tm}); err != nil || out != "06 Jul 2024" {
		t.Errorf("%q, %v", out, err)
	}
}

// TestFeatures exercises template features chat templates rely on.
func TestFeatures(t *testing.T) {
	in := Input{
		Messages: []Message{
			{Role: "system", Content: "  Sys  "},
			{Role: "user", Content: "Hello World"},
			{Role: "assistant", Content: "<think>hm</think>\nAnswer", ToolCalls: []ToolCall{{ID: "c1", Name: "f", Arguments: `{"b": 2, "a": [1]}`}}},
			{Role: "tool", ToolCallID: "c1", Name: "f", Content: "r"},
		},
		AddGenerationPrompt: true, BOS: "<s>", EOS: "</s>",
	}
	tests := []struct{ src, want string }{
		{`{{ messages[1:] | length }}|{{ messages[-1].role }}|{{ messages[::-1][0].role }}`, "3|tool|tool"},
		{`{{ messages[0].content.strip() }}|{{ messages[0].content.lstrip() }}|{{ messages[0].content.rstrip() }}|`, "Sys|Sys  |  Sys|"},
		{`{{ messages[1].content.startswith('Hello') }}{{ messages[1].content.endswith('x') }}`, "TrueFalse"},
		{`{{ messages[1].content.split(' ') | join(',') }}|{{ messages[1].content.upper() }}|{{ messages[1].content.lower() }}|{{ 'a b'.title() }}|{{ 'aXa'.replace('X', 'y') }}`, "Hello,World|HELLO WORLD|hello world|A B|aya"},
		{`{{ messages[2].content.split('</think>')[-1].lstrip('\n') }}`, "Answer"},
		{`{% for k, v in messages[2].tool_calls[0].function.arguments.items() %}{{ k }}={{ v | tojson }};{% endfor %}`, "b=2;a=[1];"},
		{`{{ messages[2].tool_calls[0].id }} {{ messages[2].tool_calls[0].type }} {{ messages[3].tool_call_id }} {{ messages[3].name }}`, "c1 function c1 f"},
		{`{{ messages[1].content is string }}{{ messages[1] is mapping }}{{ messages is sequence }}{{ tools is defined }}{{ messages[1].tool_calls is defined }}{{ none is none }}`, "TrueTrueTrueFalseFalseTrue"},
		{`{% set ns = namespace(n=0) %}{% for m in messages %}{% if m.role == 'tool' %}{% break %}{% endif %}{% if m.role == 'system' %}{% continue %}{% endif %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}`, "2"},
		{`{{ bos_token }}{{ eos_token }}{{ add_generation_prompt }}`, "<s></s>True"},
		{`{{ 'tool_calls' in messages[2] }}{{ 'tool_calls' in messages[1] }}`, "TrueFalse"},
	}
	for _, tt := range tests {
		tmpl, err := Parse(tt.src)
		if err != nil {
			t.Errorf("%s: %v", tt.src, err)
			continue
		}
		out, err := tmpl.Render(context.Background(), in)
		if err != nil || out != tt.want {
			t.Errorf("%s:\ngot  %q, %v\nwant %q", tt.src, out, err, tt.want)
		}
	}
}

// TestArgumentsAsString checks the probe that finds templates which
// concatenate call arguments as text (as DeepSeek's do).
func TestArgumentsAsString(t *testing.T) {
	src := "{% for m in messages %}{% if m.tool_calls %}{% for tc in m.tool_calls %}" +
		"{{ tc.function.name + '\\n```json\\n' + tc.function.arguments + '\\n```' }}{% endfor %}{% endif %}{% endfor %}"
	tmpl, err := Parse(src)
	if err != nil {
		t.Fatal(err)
	}
	if !tmpl.argsAsString {
		t.Fatal("not detected")
	}
	out, err := tmpl.Render(context.Background(), callChat)
	if err != nil {
		t.Fatal(err)
	}
	if want := "get_weather\n```json\n{\"city\":\"Paris\"}\n```"; out != want {
		t.Errorf("got %q, want %q", out, want)
	}
	if tmpl.SupportsTools() {
		t.Error("SupportsTools")
	}

	// Bad JSON arguments are an error for dict templates.
	q, err := os.ReadFile("testdata/Qwen-Qwen3-0.6B.jinja")
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err = Parse(string(q))
	if err != nil {
		t.Fatal(err)
	}
	in := callChat
	in.Messages = append([]Message(nil), callChat.Messages...)
	in.Messages[1].ToolCalls = []ToolCall{{ID: "x", Name: "get_weather", Arguments: `{"city": `}}
	if _, err := tmpl.Render(context.Background(), in); err == nil {
		t.Error("no error for bad arguments")
	}
}

func TestConcurrentRender(t *testing.T) {
	src, err := os.ReadFile("testdata/Qwen-Qwen3-0.6B.jinja")
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := Parse(string(src))
	if err != nil {
		t.Fatal(err)
	}
	want, err := tmpl.Render(context.Background(), callChat)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 50 {
				got, err := tmpl.Render(context.Background(), callChat)
				if err != nil || got != want {
					t.Errorf("concurrent render differs: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// TestSupportsToolsFallback covers templates whose probe render fails: the
// template text decides.
func TestSupportsToolsFallback(t *testing.T) {
	tests := []struct {
		src  string
		want bool
	}{
		{"{% if messages[0].role != 'system' %}{{ raise_exception('system first') }}{% endif %}{% for t in tools %}{{ t.function.name }}{% endfor %}", true},
		{"{% if messages[0].role != 'system' %}{{ raise_exception('system first') }}{% endif %}{% if tools is defined %}x{% endif %}", true},
		{"{% if messages[0].role != 'system' %}{{ raise_exception('system first') }}{% endif %}tools: {{ messages[0].content }}", false},
		{"{% if messages[0].role != 'system' %}{{ raise_exception('system first') }}{% endif %}{{ message.tools }}{{ custom_tools }}", false},
		{"{% for t in tools %}{% endfor %}no names", false},
	}
	for _, tt := range tests {
		tmpl, err := Parse(tt.src)
		if err != nil {
			t.Fatal(err)
		}
		if tmpl.SupportsTools() != tt.want {
			t.Errorf("%s: SupportsTools() = %v", tt.src, !tt.want)
		}
	}
}
