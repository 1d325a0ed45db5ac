package chattmpl

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"
)

// maxJSONDepth bounds the nesting of JSON given to templates (tool schemas,
// call arguments), and so the recursion of the template engine over it.
const maxJSONDepth = 64

// maxRange is the most items range() may return.
const maxRange = 100_000

// jsonValue decodes JSON text into a template value, keeping the order of
// object keys (transformers keeps it too: Python dicts are ordered).
// Integers become ints, other numbers floats.
func jsonValue(data []byte) (jinja.Value, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := decodeValue(dec, 0)
	if err != nil {
		return jinja.Undefined(), err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return jinja.Undefined(), errors.New("trailing data after JSON value")
	}
	return v, nil
}

func decodeValue(dec *json.Decoder, depth int) (jinja.Value, error) {
	tok, err := dec.Token()
	if err != nil {
		return jinja.Undefined(), err
	}
	switch t := tok.(type) {
	case json.Delim:
		if depth >= maxJSONDepth {
			return jinja.Undefined(), fmt.Errorf("JSON nested deeper than %d", maxJSONDepth)
		}
		switch t {
		case '{':
			d := jinja.NewDict()
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return jinja.Undefined(), err
				}
				k, _ := kt.(string)
				v, err := decodeValue(dec, depth+1)
				if err != nil {
					return jinja.Undefined(), err
				}
				d.AsDict().Set(k, v)
			}
			if _, err := dec.Token(); err != nil {
				return jinja.Undefined(), err
			}
			return d, nil
		case '[':
			var items []jinja.Value
			for dec.More() {
				v, err := decodeValue(dec, depth+1)
				if err != nil {
					return jinja.Undefined(), err
				}
				items = append(items, v)
			}
			if _, err := dec.Token(); err != nil {
				return jinja.Undefined(), err
			}
			return jinja.NewList(items), nil
		}
		return jinja.Undefined(), fmt.Errorf("unexpected %v", t)
	case string:
		return jinja.NewString(t), nil
	case json.Number:
		if !strings.ContainsAny(string(t), ".eE") {
			if i, err := t.Int64(); err == nil {
				return jinja.NewInt(i), nil
			}
		}
		f, err := strconv.ParseFloat(string(t), 64)
		if err != nil && !errors.Is(err, strconv.ErrRange) {
			return jinja.Undefined(), err
		}
		return jinja.NewFloat(f), nil
	case bool:
		return jinja.NewBool(t), nil
	case nil:
		return jinja.None(), nil
	}
	return jinja.Undefined(), fmt.Errorf("unexpected JSON token %v", tok)
}

// dict builds a template dict from key/value pairs, in order.
func dict(kv ...any) jinja.Value {
	d := jinja.NewDict()
	for i := 0; i+1 < len(kv); i += 2 {
		var v jinja.Value
		switch x := kv[i+1].(type) {
		case jinja.Value:
			v = x
		case string:
			v = jinja.NewString(x)
		case bool:
			v = jinja.NewBool(x)
		default:
			panic(fmt.Sprintf("chattmpl: dict value %T", x))
		}
		d.AsDict().Set(kv[i].(string), v)
	}
	return d
}

// messagesValue gives the messages as transformers' apply_chat_template
// receives them from an OpenAI-style request.
func messagesValue(msgs []Message, argsAsString bool) (jinja.Value, error) {
	items := make([]jinja.Value, 0, len(msgs))
	for i, m := range msgs {
		d := dict("role", m.Role, "content", m.Content)
		if len(m.ToolCalls) > 0 {
			calls := make([]jinja.Value, 0, len(m.ToolCalls))
			for _, c := range m.ToolCalls {
				var args jinja.Value
				if argsAsString {
					args = jinja.NewString(c.Arguments)
				} else {
					text := c.Arguments
					if strings.TrimSpace(text) == "" {
						text = "{}"
					}
					v, err := jsonValue([]byte(text))
					if err != nil {
						return jinja.Undefined(), fmt.Errorf("message %d: tool call %q: arguments: %w", i, c.Name, err)
					}
					args = v
				}
				calls = append(calls, dict(
					"id", c.ID,
					"type", "function",
					"function", dict("name", c.Name, "arguments", args),
				))
			}
			d.AsDict().Set("tool_calls", jinja.NewList(calls))
		}
		if m.ToolCallID != "" {
			d.AsDict().Set("tool_call_id", jinja.NewString(m.ToolCallID))
		}
		if m.Name != "" {
			d.AsDict().Set("name", jinja.NewString(m.Name))
		}
		items = append(items, d)
	}
	return jinja.NewList(items), nil
}

// toolsValue gives the tools in the OpenAI form transformers passes on.
func toolsValue(tools []Tool) (jinja.Value, error) {
	items := make([]jinja.Value, 0, len(tools))
	for _, t := range tools {
		fn := dict("name", t.Name)
		if t.Description != "" {
			fn.AsDict().Set("description", jinja.NewString(t.Description))
		}
		if len(bytes.TrimSpace(t.Parameters)) > 0 {
			v, err := jsonValue(t.Parameters)
			if err != nil {
				return jinja.Undefined(), fmt.Errorf("tool %q: parameters: %w", t.Name, err)
			}
			fn.AsDict().Set("parameters", v)
		}
		items = append(items, dict("type", "function", "function", fn))
	}
	return jinja.NewList(items), nil
}

// toJSON is the tojson filter as transformers defines it:
// json.dumps(x, ensure_ascii=False, indent=indent, separators=separators,
// sort_keys=sort_keys), key order kept, no HTML escaping.
func toJSON(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.NewString(""), nil
	}
	e := jsonEnc{itemSep: ", ", keySep: ": "}
	if v, ok := kwargs["indent"]; ok && !v.IsNone() && !v.IsUndefined() {
		switch {
		case v.IsInt():
			e.indent = strings.Repeat(" ", int(min(max(v.AsInt(), 0), 64)))
		case v.IsString():
			e.indent = v.AsString()
		default:
			return jinja.Undefined(), errors.New("tojson: indent must be an int or a string")
		}
		e.indented = true
		e.itemSep = ","
	}
	if v, ok := kwargs["separators"]; ok && !v.IsNone() && !v.IsUndefined() {
		if !v.IsList() || v.AsList().Len() != 2 || !v.AsList().Get(0).IsString() || !v.AsList().Get(1).IsString() {
			return jinja.Undefined(), errors.New("tojson: separators must be two strings")
		}
		e.itemSep, e.keySep = v.AsList().Get(0).AsString(), v.AsList().Get(1).AsString()
	}
	if v, ok := kwargs["sort_keys"]; ok {
		e.sortKeys = v.IsTruthy()
	}
	if v, ok := kwargs["ensure_ascii"]; ok {
		e.ascii = v.IsTruthy()
	}
	if err := e.value(args[0], 0); err != nil {
		return jinja.Undefined(), fmt.Errorf("tojson: %w", err)
	}
	return jinja.NewString(e.b.String()), nil
}

type jsonEnc struct {
	b               strings.Builder
	itemSep, keySep string
	indent          string
	indented        bool
	sortKeys, ascii bool
}

func (e *jsonEnc) newline(level int) {
	if !e.indented {
		return
	}
	e.b.WriteByte('\n')
	for range level {
		e.b.WriteString(e.indent)
	}
}

func (e *jsonEnc) value(v jinja.Value, level int) error {
	if level > 2*maxJSONDepth {
		return errors.New("value nested too deeply")
	}
	switch {
	case v.IsNone(), v.IsUndefined(), v.IsCallable():
		e.b.WriteString("null")
	case v.IsBool():
		if v.AsBool() {
			e.b.WriteString("true")
		} else {
			e.b.WriteString("false")
		}
	case v.IsInt():
		e.b.WriteString(strconv.FormatInt(v.AsInt(), 10))
	case v.IsFloat():
		e.b.WriteString(pyFloat(v.AsFloat()))
	case v.IsString():
		e.str(v.AsString())
	case v.IsList():
		items := v.AsList().Items
		if len(items) == 0 {
			e.b.WriteString("[]")
			return nil
		}
		e.b.WriteByte('[')
		for i, it := range items {
			if i > 0 {
				e.b.WriteString(e.itemSep)
			}
			e.newline(level + 1)
			if err := e.value(it, level+1); err != nil {
				return err
			}
		}
		e.newline(level)
		e.b.WriteByte(']')
	case v.IsDict():
		d := v.AsDict()
		keys := d.Keys
		if e.sortKeys {
			keys = d.OrderedKeys()
			sort.Strings(keys)
		}
		if len(keys) == 0 {
			e.b.WriteString("{}")
			return nil
		}
		e.b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				e.b.WriteString(e.itemSep)
			}
			e.newline(level + 1)
			e.str(k)
			e.b.WriteString(e.keySep)
			if err := e.value(d.Data[k], level+1); err != nil {
				return err
			}
		}
		e.newline(level)
		e.b.WriteByte('}')
	default:
		e.b.WriteString("null")
	}
	return nil
}

// str writes s as Python's json.dumps does.
func (e *jsonEnc) str(s string) {
	const hex = "0123456789abcdef"
	e.b.WriteByte('"')
	for _, r := range s { // invalid UTF-8 reads as U+FFFD
		switch {
		case r == '"':
			e.b.WriteString(`\"`)
		case r == '\\':
			e.b.WriteString(`\\`)
		case r == '\n':
			e.b.WriteString(`\n`)
		case r == '\r':
			e.b.WriteString(`\r`)
		case r == '\t':
			e.b.WriteString(`\t`)
		case r == '\b':
			e.b.WriteString(`\b`)
		case r == '\f':
			e.b.WriteString(`\f`)
		case r < 0x20 || (e.ascii && r > 0x7e):
			if r > 0xffff {
				r -= 0x10000
				hi, lo := 0xd800+(r>>10), 0xdc00+(r&0x3ff)
				for _, u := range []rune{hi, lo} {
					e.b.WriteString(`\u`)
					e.b.WriteByte(hex[u>>12&15])
					e.b.WriteByte(hex[u>>8&15])
					e.b.WriteByte(hex[u>>4&15])
					e.b.WriteByte(hex[u&15])
				}
				continue
			}
			e.b.WriteString(`\u`)
			e.b.WriteByte(hex[r>>12&15])
			e.b.WriteByte(hex[r>>8&15])
			e.b.WriteByte(hex[r>>4&15])
			e.b.WriteByte(hex[r&15])
		default:
			var buf [utf8.UTFMax]byte
			n := utf8.EncodeRune(buf[:], r)
			e.b.Write(buf[:n])
		}
	}
	e.b.WriteByte('"')
}

// pyFloat formats f as Python's repr (and so json.dumps) does.
func pyFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	s := strconv.FormatFloat(f, 'e', -1, 64)
	exp, _ := strconv.Atoi(s[strings.IndexByte(s, 'e')+1:])
	if exp < -4 || exp >= 16 {
		return s // e.g. 1e+16, 1.5e-05, as Python writes them
	}
	s = strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.ContainsAny(s, ".") {
		s += ".0"
	}
	return s
}

// strftime formats t with the C/Python directives chat templates use.
// Unknown directives are copied as they are, like glibc does.
func strftime(format string, t time.Time) string {
	var b strings.Builder
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c != '%' || i+1 >= len(format) {
			b.WriteByte(c)
			continue
		}
		i++
		pad := true
		if format[i] == '-' && i+1 < len(format) { // glibc: no padding
			pad = false
			i++
		}
		writeDirective(&b, format[i], pad, t)
	}
	return b.String()
}

// writeDirective writes t as the directive %<d> (%-<d> when !pad) asks.
func writeDirective(b *strings.Builder, d byte, pad bool, t time.Time) {
	num := func(n, width int) {
		s := strconv.Itoa(n)
		if pad {
			for len(s) < width {
				s = "0" + s
			}
		}
		b.WriteString(s)
	}
	switch d {
	case 'Y':
		num(t.Year(), 4)
	case 'y':
		num(t.Year()%100, 2)
	case 'm':
		num(int(t.Month()), 2)
	case 'd':
		num(t.Day(), 2)
	case 'e':
		s := strconv.Itoa(t.Day())
		if pad && len(s) < 2 {
			s = " " + s
		}
		b.WriteString(s)
	case 'j':
		num(t.YearDay(), 3)
	case 'H':
		num(t.Hour(), 2)
	case 'I':
		h := t.Hour() % 12
		if h == 0 {
			h = 12
		}
		num(h, 2)
	case 'M':
		num(t.Minute(), 2)
	case 'S':
		num(t.Second(), 2)
	case 'p':
		if t.Hour() < 12 {
			b.WriteString("AM")
		} else {
			b.WriteString("PM")
		}
	case 'b', 'h':
		b.WriteString(t.Month().String()[:3])
	case 'B':
		b.WriteString(t.Month().String())
	case 'a':
		b.WriteString(t.Weekday().String()[:3])
	case 'A':
		b.WriteString(t.Weekday().String())
	case 'w':
		b.WriteString(strconv.Itoa(int(t.Weekday())))
	case 'Z':
		name, _ := t.Zone()
		b.WriteString(name)
	case 'z':
		b.WriteString(t.Format("-0700"))
	case 'F':
		b.WriteString(t.Format("2006-01-02"))
	case 'T':
		b.WriteString(t.Format("15:04:05"))
	case '%':
		b.WriteByte('%')
	default:
		b.WriteByte('%')
		if !pad {
			b.WriteByte('-')
		}
		b.WriteByte(d)
	}
}

// rangeFn is Python's range, refusing more than maxRange items.
func rangeFn(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	ints := make([]int64, len(args))
	for i, a := range args {
		if !a.IsInt() {
			return jinja.Undefined(), fmt.Errorf("range: argument %d is not an int", i+1)
		}
		ints[i] = a.AsInt()
	}
	var start, stop, step int64 = 0, 0, 1
	switch len(ints) {
	case 1:
		stop = ints[0]
	case 2:
		start, stop = ints[0], ints[1]
	case 3:
		start, stop, step = ints[0], ints[1], ints[2]
	default:
		return jinja.Undefined(), fmt.Errorf("range: expected 1 to 3 arguments, got %d", len(args))
	}
	if step == 0 {
		return jinja.Undefined(), errors.New("range: step must not be zero")
	}
	var n float64
	if step > 0 && stop > start {
		n = math.Ceil((float64(stop) - float64(start)) / float64(step))
	} else if step < 0 && stop < start {
		n = math.Ceil((float64(start) - float64(stop)) / float64(-step))
	}
	if n > maxRange {
		return jinja.Undefined(), fmt.Errorf("%w: range of %.0f items (at most %d)", ErrLimit, n, maxRange)
	}
	items := make([]jinja.Value, 0, int(n))
	for i, x := 0, start; i < int(n); i, x = i+1, x+step {
		items = append(items, jinja.NewInt(x))
	}
	return jinja.NewList(items), nil
}
