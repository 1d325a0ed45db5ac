package toolcall

import (
	"reflect"
	"strings"
	"testing"
)

// streamed is a call put together from Deltas.
type streamed struct {
	Name, Arguments string
}

type result struct {
	content string
	calls   []Call
	deltas  []streamed // by Index
	nDelta  int
}

// runChunks feeds chunks to a new parser and collects everything.
func runChunks(t testing.TB, f Format, known []string, chunks []string) result {
	t.Helper()
	p := NewParser(f, known)
	var r result
	var content strings.Builder
	args := map[int][]byte{}
	add := func(ds []Delta) {
		for _, d := range ds {
			r.nDelta++
			for len(r.deltas) <= d.Index {
				r.deltas = append(r.deltas, streamed{})
			}
			s := &r.deltas[d.Index]
			if d.Name != "" {
				if s.Name != "" {
					t.Fatalf("call %d named twice (%q, %q)", d.Index, s.Name, d.Name)
				}
				s.Name = d.Name
			} else if s.Name == "" {
				t.Fatalf("call %d: arguments %q before its name", d.Index, d.Arguments)
			}
			args[d.Index] = append(args[d.Index], d.Arguments...)
		}
	}
	for _, c := range chunks {
		out, ds := p.Write(c)
		content.WriteString(out)
		add(ds)
		if p.heldLen() > MaxHeld {
			t.Fatalf("held %d bytes > MaxHeld", p.heldLen())
		}
	}
	out, ds, calls := p.Close()
	content.WriteString(out)
	add(ds)
	r.content = content.String()
	r.calls = calls
	for i := range r.deltas {
		r.deltas[i].Arguments = string(args[i])
	}
	return r
}

func bytesOf(s string) []string {
	out := make([]string, len(s))
	for i := 0; i < len(s); i++ {
		out[i] = s[i : i+1]
	}
	return out
}

var weatherTools = []string{"get_weather", "get_time"}

func TestParser(t *testing.T) {
	long := strings.Repeat("x", MaxHeld)
	tests := []struct {
		name    string
		format  Format
		known   []string
		in      string
		content string
		calls   []Call
		// abandoned lists Delta indexes whose call was abandoned.
		abandoned []int
	}{
		// Hermes (Qwen) and Generic.
		{name: "hermes content only", format: Hermes, known: weatherTools,
			in: "The weather is fine. <b>bold</b> a < b {x}", content: "The weather is fine. <b>bold</b> a < b {x}"},
		{name: "hermes one call", format: Hermes, known: weatherTools,
			in:    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
			calls: []Call{{"get_weather", `{"city": "Paris"}`}}},
		{name: "hermes several calls", format: Hermes, known: weatherTools,
			in: "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n" +
				"<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\", \"n\": [1, 2.5e3, true, null]}}\n</tool_call>",
			calls: []Call{{"get_weather", `{"city": "Paris"}`}, {"get_time", `{"tz": "CET", "n": [1, 2.5e3, true, null]}`}}},
		{name: "hermes content then call", format: Hermes, known: weatherTools,
			in:      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>",
			content: "Let me check.\n",
			calls:   []Call{{"get_weather", `{}`}}},
		{name: "hermes call then content", format: Hermes, known: weatherTools,
			in:      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>\nDone.",
			content: "\nDone.",
			calls:   []Call{{"get_weather", `{}`}}},
		{name: "hermes arguments first", format: Hermes, known: weatherTools,
			in:    "<tool_call>{\"arguments\": {\"city\": \"}\\\"{\"}, \"name\": \"get_weather\"}</tool_call>",
			calls: []Call{{"get_weather", `{"city": "}\"{"}`}}},
		{name: "hermes arguments as string", format: Hermes, known: weatherTools,
			in:    "<tool_call>{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Rome\\\"}\"}</tool_call>",
			calls: []Call{{"get_weather", `{"city": "Rome"}`}}},
		{name: "hermes no arguments member", format: Hermes, known: weatherTools,
			in:    "<tool_call>{\"name\": \"get_time\"}</tool_call>",
			calls: []Call{{"get_time", `{}`}}},
		{name: "hermes missing close tag at end", format: Hermes, known: weatherTools,
			in:    "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_",
			calls: []Call{{"get_time", `{}`}}},
		{name: "hermes invalid JSON", format: Hermes, known: weatherTools,
			in:      "<tool_call>\n{\"name\": get_weather}\n</tool_call> after",
			content: "<tool_call>\n{\"name\": get_weather}\n</tool_call> after"},
		{name: "hermes not an object", format: Hermes, known: weatherTools,
			in:      "<tool_call>\nget_weather(city=1)</tool_call>",
			content: "<tool_call>\nget_weather(city=1)</tool_call>"},
		{name: "hermes unknown tool", format: Hermes, known: weatherTools,
			in:      "<tool_call>\n{\"name\": \"rm_rf\", \"arguments\": {}}\n</tool_call>",
			content: "<tool_call>\n{\"name\": \"rm_rf\", \"arguments\": {}}\n</tool_call>"},
		{name: "hermes arguments not object", format: Hermes, known: weatherTools,
			in:        "<tool_call>{\"name\": \"get_time\", \"arguments\": 5}</tool_call>",
			content:   "<tool_call>{\"name\": \"get_time\", \"arguments\": 5}</tool_call>",
			abandoned: []int{0}},
		{name: "hermes broken after name", format: Hermes, known: weatherTools,
			in:        "<tool_call>{\"name\": \"get_time\", \"arguments\": {\"a\": tru}}</tool_call>",
			content:   "<tool_call>{\"name\": \"get_time\", \"arguments\": {\"a\": tru}}</tool_call>",
			abandoned: []int{0}},
		{name: "hermes cut off", format: Hermes, known: weatherTools,
			in:        "ok <tool_call>{\"name\": \"get_time\", \"arguments\": {\"a\": ",
			content:   "ok <tool_call>{\"name\": \"get_time\", \"arguments\": {\"a\": ",
			abandoned: []int{0}},
		{name: "hermes partial marker released", format: Hermes, known: weatherTools,
			in: "a <tool_cal b <<tool_call>{\"name\":\"get_time\"}</tool_call>", content: "a <tool_cal b <",
			calls: []Call{{"get_time", "{}"}}},
		{name: "hermes oversize", format: Hermes, known: weatherTools,
			in:        "<tool_call>{\"name\": \"get_time\", \"arguments\": {\"a\": \"" + long + "\"}}</tool_call>",
			content:   "<tool_call>{\"name\": \"get_time\", \"arguments\": {\"a\": \"" + long + "\"}}</tool_call>",
			abandoned: []int{0}},
		{name: "generic call", format: Generic, known: weatherTools,
			in:    "<tool_call>\n{\"name\": \"get_time\", \"parameters\": {\"x\": -0.5}}\n</tool_call>",
			calls: []Call{{"get_time", `{"x": -0.5}`}}},
		{name: "any name when none known", format: Hermes,
			in:    "<tool_call>{\"name\": \"whatever\", \"arguments\": {}}</tool_call>",
			calls: []Call{{"whatever", `{}`}}},

		// Llama 3.x.
		{name: "llama content only", format: Llama3, known: weatherTools,
			in: "It is {sunny} today.", content: "It is {sunny} today."},
		{name: "llama one call", format: Llama3, known: weatherTools,
			in:    `{"name": "get_weather", "parameters": {"city": "Paris"}}`,
			calls: []Call{{"get_weather", `{"city": "Paris"}`}}},
		{name: "llama python tag", format: Llama3, known: weatherTools,
			in:    "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
			calls: []Call{{"get_weather", `{"city": "Paris"}`}}},
		{name: "llama several calls", format: Llama3, known: weatherTools,
			in:    "\n{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}; {\"name\": \"get_time\", \"parameters\": {}}\n{\"type\": \"function\", \"name\": \"get_time\", \"parameters\": {\"tz\": \"UTC\"}}\n",
			calls: []Call{{"get_weather", `{"city": "Oslo"}`}, {"get_time", `{}`}, {"get_time", `{"tz": "UTC"}`}}},
		{name: "llama content then call is content", format: Llama3, known: weatherTools,
			in:      "Sure: {\"name\": \"get_weather\", \"parameters\": {}}",
			content: "Sure: {\"name\": \"get_weather\", \"parameters\": {}}"},
		{name: "llama call then content", format: Llama3, known: weatherTools,
			in:      "{\"name\": \"get_time\", \"parameters\": {}} and more",
			content: " and more",
			calls:   []Call{{"get_time", `{}`}}},
		{name: "llama JSON answer", format: Llama3, known: weatherTools,
			in: `{"answer": 42}`, content: `{"answer": 42}`},
		{name: "llama invalid JSON", format: Llama3, known: weatherTools,
			in: `{"name": "get_time", "parameters": {]}`, content: `{"name": "get_time", "parameters": {]}`, abandoned: []int{0}},
		{name: "llama unknown tool", format: Llama3, known: weatherTools,
			in: `{"name": "nope", "parameters": {}}`, content: `{"name": "nope", "parameters": {}}`},
		{name: "llama bad python tag", format: Llama3, known: weatherTools,
			in: "<|python_x|>{}", content: "<|python_x|>{}"},

		// Mistral.
		{name: "mistral content only", format: Mistral, known: weatherTools,
			in: "Plain [TOOL] text [x]", content: "Plain [TOOL] text [x]"},
		{name: "mistral one call", format: Mistral, known: weatherTools,
			in:    `[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]`,
			calls: []Call{{"get_weather", `{"city": "Paris"}`}}},
		{name: "mistral several calls", format: Mistral, known: weatherTools,
			in:    `[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abcdefghi"}, {"name": "get_time", "arguments": {}}]`,
			calls: []Call{{"get_weather", `{"city": "Paris"}`}, {"get_time", `{}`}}},
		{name: "mistral content then call", format: Mistral, known: weatherTools,
			in:      `Checking. [TOOL_CALLS][{"name": "get_time", "arguments": {"tz": "UTC"}}]`,
			content: "Checking. ",
			calls:   []Call{{"get_time", `{"tz": "UTC"}`}}},
		{name: "mistral name form", format: Mistral, known: weatherTools,
			in:    `[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}`,
			calls: []Call{{"get_weather", `{"city": "Paris"}`}, {"get_time", `{}`}}},
		{name: "mistral single object", format: Mistral, known: weatherTools,
			in:    `[TOOL_CALLS]{"name": "get_time", "arguments": {}}`,
			calls: []Call{{"get_time", `{}`}}},
		{name: "mistral invalid JSON", format: Mistral, known: weatherTools,
			in: `[TOOL_CALLS][{"name" "get_time"}]`, content: `[TOOL_CALLS][{"name" "get_time"}]`},
		{name: "mistral unknown tool", format: Mistral, known: weatherTools,
			in: `[TOOL_CALLS][{"name": "nope", "arguments": {}}]`, content: `[TOOL_CALLS][{"name": "nope", "arguments": {}}]`},
		{name: "mistral unknown tool name form", format: Mistral, known: weatherTools,
			in: `[TOOL_CALLS]nope[ARGS]{}`, content: `[TOOL_CALLS]nope[ARGS]{}`},
		{name: "mistral second call invalid", format: Mistral, known: weatherTools,
			in:      `[TOOL_CALLS][{"name": "get_time", "arguments": {}}, {"name": "nope", "arguments": {}}]`,
			content: `, {"name": "nope", "arguments": {}}]`,
			calls:   []Call{{"get_time", `{}`}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			splits := map[string][]string{
				"whole":      {tt.in},
				"halves":     {tt.in[:len(tt.in)/2], tt.in[len(tt.in)/2:]},
				"threes":     chunk(tt.in, 3),
				"byBytePart": nil,
			}
			if len(tt.in) < 4096 {
				splits["byBytePart"] = bytesOf(tt.in)
			} else {
				delete(splits, "byBytePart")
			}
			for sname, chunks := range splits {
				r := runChunks(t, tt.format, tt.known, chunks)
				if r.content != tt.content {
					t.Errorf("%s: content %q, want %q", sname, trunc(r.content), trunc(tt.content))
				}
				if !reflect.DeepEqual(r.calls, tt.calls) && !(len(r.calls) == 0 && len(tt.calls) == 0) {
					t.Errorf("%s: calls %q, want %q", sname, r.calls, tt.calls)
				}
				// Streamed calls: the valid ones, in order, plus abandoned indexes.
				var valid []Call
				for i, s := range r.deltas {
					if contains(tt.abandoned, i) {
						continue
					}
					valid = append(valid, Call(s))
				}
				if len(r.deltas) != len(tt.calls)+len(tt.abandoned) {
					t.Errorf("%s: %d calls streamed, want %d", sname, len(r.deltas), len(tt.calls)+len(tt.abandoned))
				} else if !reflect.DeepEqual(valid, tt.calls) && !(len(valid) == 0 && len(tt.calls) == 0) {
					t.Errorf("%s: streamed %q, want %q", sname, valid, tt.calls)
				}
			}
		})
	}
}

// TestNameFirst checks that a call's name is emitted before its arguments
// are complete, and that argument fragments stream as they arrive.
func TestNameFirst(t *testing.T) {
	p := NewParser(Hermes, weatherTools)
	c, ds := p.Write("Hi <tool_call>\n{\"name\": \"get_weather\", ")
	if c != "Hi " {
		t.Fatalf("content %q", c)
	}
	if len(ds) != 1 || ds[0] != (Delta{Index: 0, Name: "get_weather"}) {
		t.Fatalf("deltas %+v", ds)
	}
	_, ds = p.Write("\"arguments\": {\"city\": \"Pa")
	if len(ds) != 1 || ds[0] != (Delta{Index: 0, Arguments: `{"city": "Pa`}) {
		t.Fatalf("deltas %+v", ds)
	}
	_, ds = p.Write("ris\"}}\n</tool_call>")
	if len(ds) != 1 || ds[0] != (Delta{Index: 0, Arguments: `ris"}`}) {
		t.Fatalf("deltas %+v", ds)
	}
	c, ds, calls := p.Close()
	if c != "" || len(ds) != 0 || len(calls) != 1 || calls[0].Arguments != `{"city": "Paris"}` {
		t.Fatalf("close: %q %+v %+v", c, ds, calls)
	}
}

// TestHeldBack checks that text that cannot be a call is not held back.
func TestHeldBack(t *testing.T) {
	tests := []struct {
		format Format
		in     string
		want   string // content released by Write(in)
	}{
		{Hermes, "hello <tool", "hello "},
		{Hermes, "hello <b>", "hello <b>"},
		{Mistral, "see [TOOL_", "see "},
		{Mistral, "see [x]", "see [x]"},
		{Llama3, "  ", ""},
		{Llama3, "  <|python", ""},
		{Llama3, "  Hello", "  Hello"},
		{Llama3, `{"name": "get_time"`, ""},
	}
	for _, tt := range tests {
		p := NewParser(tt.format, weatherTools)
		if got, _ := p.Write(tt.in); got != tt.want {
			t.Errorf("%v Write(%q) = %q, want %q", tt.format, tt.in, got, tt.want)
		}
	}
}

func TestMaxCalls(t *testing.T) {
	one := "<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>"
	in := strings.Repeat(one, MaxCalls+2)
	r := runChunks(t, Hermes, weatherTools, []string{in})
	if len(r.calls) != MaxCalls {
		t.Fatalf("%d calls, want %d", len(r.calls), MaxCalls)
	}
	if r.content != one+one {
		t.Fatalf("content %q", r.content)
	}
}

func TestFormat(t *testing.T) {
	for f, want := range map[Format]string{Generic: "generic", Hermes: "hermes", Llama3: "llama3", Mistral: "mistral", Format(9): "Format(9)"} {
		if f.String() != want {
			t.Errorf("%d: %q", int(f), f.String())
		}
	}
	// A call written in a format's Syntax parses back in that format.
	for _, f := range []Format{Generic, Hermes, Llama3, Mistral} {
		s := f.Syntax()
		call := func(name, args string) string {
			return s.Prefix + `{"` + s.NameKey + `": "` + name + `", "` + s.ArgsKey + `": ` + args + `}` + s.Suffix
		}
		in := s.Open + call("get_weather", `{"city": "Paris"}`) + s.Sep + call("get_time", `{}`) + s.Close
		r := runChunks(t, f, weatherTools, bytesOf(in))
		want := []Call{{"get_weather", `{"city": "Paris"}`}, {"get_time", `{}`}}
		if r.content != "" || !reflect.DeepEqual(r.calls, want) {
			t.Errorf("%v: %q -> content %q calls %q", f, in, r.content, r.calls)
		}
	}
}

func chunk(s string, n int) []string {
	var out []string
	for len(s) > n {
		out = append(out, s[:n])
		s = s[n:]
	}
	return append(out, s)
}

func contains(xs []int, x int) bool {
	for _, y := range xs {
		if x == y {
			return true
		}
	}
	return false
}

func trunc(s string) string {
	if len(s) > 200 {
		return s[:100] + "..." + s[len(s)-100:]
	}
	return s
}
