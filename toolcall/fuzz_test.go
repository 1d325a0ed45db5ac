package toolcall

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

func FuzzParser(f *testing.F) {
	seeds := []string{
		"",
		"plain text",
		"Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>{\"name\": \"get_time\"}</tool_call>",
		"<tool_call>{\"arguments\": \"{\\\"a\\\": [1, -2.5e+3, null, true, false, \\\"\\\\u00e9\\\"]}\", \"name\": \"get_time\"}</tool_call> after",
		"<tool_call>{\"name\": \"get_time\", \"arguments\": {\"a\": tru}}</tool_call>",
		"<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}; {\"name\": \"get_time\", \"parameters\": {}}",
		"{\"name\": \"nope\", \"parameters\": {}}",
		"[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"abcdefghi\"}, {\"name\": \"get_time\", \"arguments\": {}}] tail",
		"[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]get_time[ARGS]{}",
		"[TOOL_CALLS][{\"name\": \"get_time\", \"arguments\": {}}, {\"name\": \"nope\"}]",
		"<tool_call><tool_call>{\"name\":\"get_time\",\"arguments\":{\"x\":{\"y\":[[]]}}}</tool_call>",
	}
	for i, s := range seeds {
		f.Add(s, uint16(len(s)/2), uint8(i))
	}
	f.Fuzz(func(t *testing.T, in string, split uint16, sel uint8) {
		format := Format(sel % 4)
		known := weatherTools
		if sel&4 != 0 {
			known = nil
		}
		whole := runChunks(t, format, known, []string{in})

		// Any split gives the same result.
		cut := int(split) % (len(in) + 1)
		size := 1 + int(sel)%7
		if len(in) > 2048 {
			size += 64 // keep big inputs quick to run (and to minimise)
		}
		splits := [][]string{{in[:cut], in[cut:]}, chunk(in, size)}
		if len(in) <= 2048 {
			splits = append(splits, bytesOf(in))
		}
		for _, chunks := range splits {
			r := runChunks(t, format, known, chunks)
			if r.content != whole.content || !reflect.DeepEqual(r.calls, whole.calls) || !sameStreams(r.deltas, whole.deltas) {
				t.Fatalf("split %d pieces: content %q calls %q streamed %q; whole: %q %q %q",
					len(chunks), r.content, r.calls, r.deltas, whole.content, whole.calls, whole.deltas)
			}
		}

		// No text is lost: without calls, all of it is content; with calls,
		// the content is what is left of the input around them.
		if len(whole.calls) == 0 && whole.content != in {
			t.Fatalf("no calls but content %q != input %q", whole.content, in)
		}
		if !isSubsequence(whole.content, in) {
			t.Fatalf("content %q is not from input %q", whole.content, in)
		}
		if !strings.Contains(in, hermesOpen) && (format == Hermes || format == Generic) && whole.content != in {
			t.Fatalf("no marker but content %q != input %q", whole.content, in)
		}
		if !strings.Contains(in, mistralMark) && format == Mistral && whole.content != in {
			t.Fatalf("no marker but content %q != input %q", whole.content, in)
		}

		// Calls are valid, and were streamed in order (streamed calls that
		// are not in calls were abandoned).
		if len(whole.calls) > MaxCalls || len(whole.deltas) > MaxCalls {
			t.Fatalf("%d calls, %d streamed", len(whole.calls), len(whole.deltas))
		}
		j := 0
		for _, c := range whole.calls {
			if !isJSONObject(c.Arguments) || !json.Valid([]byte(c.Arguments)) {
				t.Fatalf("call %q: arguments not a JSON object", c)
			}
			if c.Name == "" || (known != nil && !contains2(known, c.Name)) {
				t.Fatalf("call %q: bad name", c)
			}
			for j < len(whole.deltas) && Call(whole.deltas[j]) != c {
				j++
			}
			if j == len(whole.deltas) {
				t.Fatalf("call %q not streamed: %q", c, whole.deltas)
			}
			j++
		}
	})
}

// sameStreams reports whether two streams of calls agree: the same names,
// and arguments of which one is a prefix of the other (abandoned calls may
// have emitted more or less of their arguments, depending on the pieces the
// text came in; valid calls are compared in full with calls).
func sameStreams(a, b []streamed) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Name != b[i].Name {
			return false
		}
		if !strings.HasPrefix(a[i].Arguments, b[i].Arguments) && !strings.HasPrefix(b[i].Arguments, a[i].Arguments) {
			return false
		}
	}
	return true
}

func isSubsequence(sub, s string) bool {
	i := 0
	for j := 0; j < len(s) && i < len(sub); j++ {
		if s[j] == sub[i] {
			i++
		}
	}
	return i == len(sub)
}

func contains2(xs []string, x string) bool {
	for _, y := range xs {
		if x == y {
			return true
		}
	}
	return false
}
