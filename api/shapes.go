package api

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// What every API shape (OpenAI chat and completions, Responses, Anthropic,
// Ollama) shares: request objects whose errors name the field at fault
// (jobj) and the parsers of what their requests have alike (sampling
// fields, stop strings, tools, tool results, text parts), the reading of
// a request, one generation driver for their streams and answers
// (serveGen, drive), event writers and tool-call arguments.

// whyUnknown is the reason every unknown field is refused with.
const whyUnknown = "this gateway does not implement it (docs/api.md lists the supported fields)"

// jobj is a JSON object of a request, its fields keyed by their full path
// ("messages[2].content"), so that every error names the field at fault.
// JSON null counts as absent (given tells it from a missing field).
type jobj struct {
	path string
	f    map[string]json.RawMessage
	null []string // the fields that are null
}

// bodyObject parses a request body, a JSON object of the fields names
// (any other is refused).
func bodyObject(body []byte, names ...string) (jobj, *Error) {
	var f map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&f); err != nil {
		return jobj{}, BadRequest("", "request body is not a JSON object: %v", err)
	}
	if f == nil {
		return jobj{}, BadRequest("", "request body is not a JSON object")
	}
	if dec.More() {
		return jobj{}, BadRequest("", "request body has data after the JSON object")
	}
	o := jobj{f: map[string]json.RawMessage{}}
	o.add(f)
	return o, o.known(whyUnknown, names...)
}

// subObject parses raw, the JSON object at path.
func subObject(raw json.RawMessage, path string) (jobj, *Error) {
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil || m == nil {
		return jobj{}, BadRequest(path, "%q must be an object", path)
	}
	o := jobj{path: path, f: map[string]json.RawMessage{}}
	o.add(m)
	return o, nil
}

// add takes the fields of m, its nulls aside.
func (o *jobj) add(m map[string]json.RawMessage) {
	for k, v := range m {
		if string(v) == "null" {
			o.null = append(o.null, k)
		} else {
			o.f[o.k(k)] = v
		}
	}
}

// object is field n, a JSON object.
func (o jobj) object(n string) (jobj, *Error) { return subObject(o.raw(n), o.k(n)) }

// optObject is field n, an object; found is false when o lacks n (e nil)
// or n is no object (e says so).
func (o jobj) optObject(n string) (v jobj, found bool, e *Error) {
	if !o.has(n) {
		return jobj{}, false, nil
	}
	v, e = o.object(n)
	return v, e == nil, e
}

// nested is the object inner of object n, which carries nothing else (why
// refuses the rest); found is false when either is absent or no object,
// or n carries more.
func (o jobj) nested(n, inner, why string) (v jobj, found bool, e *Error) {
	outer, found, e := o.optObject(n)
	if found {
		e = outer.known(why, inner)
	}
	if !found || e != nil {
		return jobj{}, false, e
	}
	return outer.optObject(inner)
}

// k is the full path of field n.
func (o jobj) k(n string) string {
	if o.path == "" {
		return n
	}
	return o.path + "." + n
}

func (o jobj) has(n string) bool { _, ok := o.f[o.k(n)]; return ok }

// given reports whether o carries field n, JSON null included.
func (o jobj) given(n string) bool { return o.has(n) || slices.Contains(o.null, n) }

func (o jobj) raw(n string) json.RawMessage { return o.f[o.k(n)] }

// strValue is field n when it is a JSON string (ok false: it is not).
func (o jobj) strValue(n string) (s string, ok bool) {
	ok = json.Unmarshal(o.raw(n), &s) == nil
	return s, ok
}

// unknown is the full path of the first field (in sorted order, so the
// error is stable) that is not among names; "" when there is none.
func (o jobj) unknown(names ...string) string {
	var bad []string
	for k := range o.f {
		if !slices.Contains(names, k[len(o.k("")):]) {
			bad = append(bad, k)
		}
	}
	if len(bad) == 0 {
		return ""
	}
	sort.Strings(bad)
	return bad[0]
}

// known refuses the first field that is not among names (unknown).
func (o jobj) known(why string, names ...string) *Error {
	if k := o.unknown(names...); k != "" {
		return unsupported(k, why)
	}
	return nil
}

// need refuses the first of names that o lacks: a missing required field
// of the body, or a missing field of an object in it.
func (o jobj) need(names ...string) *Error {
	for _, n := range names {
		switch {
		case o.has(n):
		case o.path == "":
			return BadRequest(n, "missing required field %q", n)
		default:
			return BadRequest(o.k(n), "missing %s", n)
		}
	}
	return nil
}

// str, boolean, float and integer parse field n into dst: a string
// (nonEmpty: not ""), true or false, a number in [lo, hi], an integer in
// [lo, hi].
func (o jobj) str(n string, dst *string, nonEmpty bool) *Error {
	p := o.k(n)
	if json.Unmarshal(o.raw(n), dst) != nil {
		return BadRequest(p, "%q must be a string", p)
	}
	if nonEmpty && *dst == "" {
		return BadRequest(p, "%q must not be empty", p)
	}
	return nil
}

func (o jobj) boolean(n string, dst *bool) *Error {
	if json.Unmarshal(o.raw(n), dst) != nil {
		return BadRequest(o.k(n), "%q must be true or false", o.k(n))
	}
	return nil
}

func (o jobj) float(n string, dst *float32, lo, hi float64) *Error {
	var v float64
	if json.Unmarshal(o.raw(n), &v) != nil || math.IsNaN(v) || v < lo || v > hi {
		return BadRequest(o.k(n), "%q must be a number in [%g, %g]", o.k(n), lo, hi)
	}
	*dst = float32(v)
	return nil
}

func (o jobj) integer(n string, dst *int, lo, hi int) *Error {
	var v float64
	if json.Unmarshal(o.raw(n), &v) != nil || v != math.Trunc(v) || v < float64(lo) || v > float64(hi) {
		return BadRequest(o.k(n), "%q must be an integer in [%d, %d]", o.k(n), lo, hi)
	}
	*dst = int(v)
	return nil
}

// int64 parses field n, a 64-bit integer (a seed), into dst.
func (o jobj) int64(n string, dst *int64) *Error {
	var v json.Number
	dec := json.NewDecoder(bytes.NewReader(o.raw(n)))
	dec.UseNumber()
	if dec.Decode(&v) != nil {
		return BadRequest(o.k(n), "%q must be an integer", o.k(n))
	}
	i, err := v.Int64()
	if err != nil {
		return BadRequest(o.k(n), "%q must be a 64-bit integer", o.k(n))
	}
	*dst = i
	return nil
}

// needStr is str for a field that must be there.
func (o jobj) needStr(n string, dst *string, nonEmpty bool) *Error {
	if e := o.need(n); e != nil {
		return e
	}
	return o.str(n, dst, nonEmpty)
}

// opt is parse's error when o has field n; an absent field is no error
// (its destination keeps the shape's default).
func (o jobj) opt(n string, parse func() *Error) *Error {
	if !o.has(n) {
		return nil
	}
	return parse()
}

// optStr, optBool, optFloat and optInt are str, boolean, float and
// integer for fields that may be absent.
func (o jobj) optStr(n string, dst *string, nonEmpty bool) *Error {
	return o.opt(n, func() *Error { return o.str(n, dst, nonEmpty) })
}
func (o jobj) optBool(n string, dst *bool) *Error {
	return o.opt(n, func() *Error { return o.boolean(n, dst) })
}
func (o jobj) optFloat(n string, dst *float32, lo, hi float64) *Error {
	return o.opt(n, func() *Error { return o.float(n, dst, lo, hi) })
}
func (o jobj) optInt(n string, dst *int, lo, hi int) *Error {
	return o.opt(n, func() *Error { return o.integer(n, dst, lo, hi) })
}

// optSeed parses field n when o has it: a 64-bit integer, the seed (a
// negative one as its two's complement); with minus1Random, -1 leaves dst
// (the random seed it holds: Ollama's default).
func (o jobj) optSeed(n string, dst *uint64, minus1Random bool) *Error {
	return o.opt(n, func() *Error {
		var i int64
		if e := o.int64(n, &i); e != nil {
			return e
		}
		if i != -1 || !minus1Random {
			*dst = uint64(i)
		}
		return nil
	})
}

// only refuses field n (when o has it) unless it is want (JSON; a value
// that prints the same counts), saying why only that is supported.
func (o jobj) only(n, want, why string) *Error {
	var got, exp any
	return o.opt(n, func() *Error {
		if json.Unmarshal(o.raw(n), &got) != nil || json.Unmarshal([]byte(want), &exp) != nil || fmt.Sprint(got) != fmt.Sprint(exp) {
			return unsupported(o.k(n), fmt.Sprintf("only %s is supported: %s", want, why))
		}
		return nil
	})
}

// array is field n as an array of lo to hi elements.
func (o jobj) array(n string, lo, hi int) ([]json.RawMessage, *Error) {
	var a []json.RawMessage
	if json.Unmarshal(o.raw(n), &a) != nil {
		return nil, BadRequest(o.k(n), "%q must be an array", o.k(n))
	}
	if len(a) < lo || len(a) > hi {
		return nil, BadRequest(o.k(n), "%q must hold %d to %d elements, got %d", o.k(n), lo, hi, len(a))
	}
	return a, nil
}

// objects calls each, in order, with the objects of field n, an array of
// lo to hi of them; the first error ends it.
func (o jobj) objects(n string, lo, hi int, each func(it jobj) *Error) *Error {
	items, e := o.array(n, lo, hi)
	if e != nil {
		return e
	}
	return eachObject(items, o.k(n), each)
}

// eachObject calls each, in order, with the objects of items, the array at
// path p; the first error ends it.
func eachObject(items []json.RawMessage, p string, each func(it jobj) *Error) *Error {
	for i, raw := range items {
		it, e := subObject(raw, fmt.Sprintf("%s[%d]", p, i))
		if e == nil {
			e = each(it)
		}
		if e != nil {
			return e
		}
	}
	return nil
}

// optStops parses stop strings when o has field n: an array of up to
// MaxStops strings of 1 to MaxStopBytes bytes (or one string, with one).
func (o jobj) optStops(n string, dst *[]string, one bool) *Error {
	if !o.has(n) {
		return nil
	}
	p := o.k(n)
	var s string
	if one && json.Unmarshal(o.raw(n), &s) == nil {
		*dst = []string{s}
	} else if json.Unmarshal(o.raw(n), dst) != nil {
		if one {
			return BadRequest(p, "%q must be a string or an array of strings", p)
		}
		return BadRequest(p, "%q must be an array of strings", p)
	}
	if len(*dst) > MaxStops {
		return BadRequest(p, "at most %d stop strings in %q", MaxStops, p)
	}
	for _, s := range *dst {
		if s == "" || len(s) > MaxStopBytes {
			return BadRequest(p, "%q: stop strings must be 1 to %d bytes", p, MaxStopBytes)
		}
	}
	return nil
}

// cacheControl accepts an Anthropic cache_control object and ignores it:
// nothing is cached, the output is the same.
func (o jobj) cacheControl() *Error {
	_, _, e := o.optObject("cache_control")
	return e
}

// toolCallID parses a tool call's id (1 to MaxToolCallIDSize bytes).
func (o jobj) toolCallID(n string, dst *string) *Error {
	if e := o.str(n, dst, true); e != nil {
		return e
	}
	if len(*dst) > MaxToolCallIDSize {
		return BadRequest(o.k(n), "%q: tool call ids are at most %d bytes", o.k(n), MaxToolCallIDSize)
	}
	return nil
}

// funcName parses a function's name in a tool call.
func (o jobj) funcName(n string, dst *string) *Error {
	if e := o.str(n, dst, true); e != nil {
		return e
	}
	if !toolName.MatchString(*dst) {
		return BadRequest(o.k(n), "%q: function name %q must be 1 to %d characters of a-z, A-Z, 0-9, _ and -", o.k(n), *dst, MaxToolNameBytes)
	}
	return nil
}

// parseAll runs parsers, each the parser of a field of o (nothing when it
// is absent), in order; the first error ends it.
func parseAll(o jobj, g *GenerateRequest, parsers ...func(jobj, *GenerateRequest) *Error) *Error {
	for _, parse := range parsers {
		if e := parse(o, g); e != nil {
			return e
		}
	}
	return nil
}

// appendSystem appends a system message of s, unless s is empty.
func appendSystem(g *GenerateRequest, s string) {
	if s != "" {
		g.Messages = append(g.Messages, Message{Role: "system", Content: s})
	}
}

// textParts is raw at path p: a string, or an array of what (text objects;
// part checks one and is its text), their texts joined with \n.
func textParts(raw json.RawMessage, p, what string, part func(po jobj) (string, *Error)) (string, *Error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []json.RawMessage
	if json.Unmarshal(raw, &parts) != nil {
		return "", BadRequest(p, "%q must be a string or an array of %s", p, what)
	}
	texts := make([]string, 0, len(parts))
	if e := eachObject(parts, p, func(po jobj) *Error {
		t, e := part(po)
		texts = append(texts, t)
		return e
	}); e != nil {
		return "", e
	}
	return strings.Join(texts, "\n"), nil
}

// tools parses field "tools" (when o has it), an array of up to MaxTools
// tool objects, into g.Tools: tool checks one and fills its Tool, which
// starts as def (the shape's defaults).
func (o jobj) tools(g *GenerateRequest, def Tool, tool func(to jobj, t *Tool) *Error) *Error {
	if !o.has("tools") {
		return nil
	}
	return o.objects("tools", 0, MaxTools, func(to jobj) *Error {
		t := def
		if e := tool(to, &t); e != nil {
			return e
		}
		g.Tools = append(g.Tools, t)
		return nil
	})
}

// functionTool parses the function of a tool, o, into t: its name,
// description, JSON schema (field schema, which must be there when
// needSchema) and strict (t.Strict is the default), once the caller
// refused the fields its shape does not carry.
func (o jobj) functionTool(t *Tool, schema string, needSchema bool) *Error {
	if e := o.needStr("name", &t.Name, true); e != nil {
		return e
	}
	if e := o.optStr("description", &t.Description, false); e != nil {
		return e
	}
	if needSchema {
		if e := o.need(schema); e != nil {
			return e
		}
	}
	if o.has(schema) {
		t.Parameters = o.raw(schema)
	}
	return o.optBool("strict", &t.Strict)
}

// toolResult is the tool message a result object, o, makes: the id of the
// call it answers is field n (names: call id → function name).
func (o jobj) toolResult(n string, names map[string]string) (Message, *Error) {
	m := Message{Role: "tool"}
	if e := o.need(n); e != nil {
		return m, e
	}
	if e := o.toolCallID(n, &m.ToolCallID); e != nil {
		return m, e
	}
	m.Name = names[m.ToolCallID]
	return m, nil
}

// argsText is a tool call's arguments, a JSON object, as compact JSON
// text (keys in the client's order).
func argsText(raw json.RawMessage, p string) (string, *Error) {
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil || m == nil {
		return "", BadRequest(p, "%q must be a JSON object", p)
	}
	var b bytes.Buffer
	if json.Compact(&b, raw) != nil {
		return "", BadRequest(p, "%q must be a JSON object", p)
	}
	return b.String(), nil
}

// argsObject is a call's arguments (JSON text) as the JSON object the
// Anthropic and Ollama shapes carry; {} when the text is not an object
// (the backend's calls always are: a grammar or parser made them).
func argsObject(s string) json.RawMessage {
	var m map[string]json.RawMessage
	if json.Unmarshal([]byte(s), &m) != nil || m == nil {
		return json.RawMessage("{}")
	}
	var b bytes.Buffer
	if json.Compact(&b, []byte(s)) != nil {
		return json.RawMessage("{}")
	}
	return b.Bytes()
}

func randomSeed() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:])
}

// messageNaming is e's message, led by the field at fault when the message
// does not name it (for shapes whose errors have no param).
func messageNaming(e *Error) string {
	if p, ok := e.Param.(string); ok && p != "" && !strings.Contains(e.Message, p) {
		return p + ": " + e.Message
	}
	return e.Message
}

// errorHeaders sets the headers every error response carries, whatever
// its shape.
func errorHeaders(w http.ResponseWriter, e *Error) {
	switch {
	case e.RetryAfter > 0:
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(e.RetryAfter.Seconds()))))
	case e.Status == http.StatusTooManyRequests:
		w.Header().Set("Retry-After", "1")
	}
	if e.Status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="meshp2p"`)
	}
}

func methodNotAllowed(r *http.Request, allow string) *Error {
	return newError(http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed", "",
		"%s %s: method not allowed (use %s)", r.Method, r.URL.Path, allow)
}

// readRequest reads a POST body and parses it with parse; a failure (a
// method other than POST, a body too large, an invalid request) is
// answered with writeErr, and ok is false.
func readRequest[T any](s *Server, w http.ResponseWriter, r *http.Request, writeErr func(http.ResponseWriter, *Error),
	parse func([]byte) (T, *Error)) (req T, ok bool) {
	var e *Error
	if r.Method != http.MethodPost {
		e = methodNotAllowed(r, "POST")
	}
	var body []byte
	if e == nil {
		body, e = s.readBody(w, r)
	}
	if e == nil {
		req, e = parse(body)
	}
	if e != nil {
		writeErr(w, e)
		return req, false
	}
	return req, true
}

// jsonEqual reports whether raw is the JSON value want.
func jsonEqual(raw json.RawMessage, want string) bool {
	var b bytes.Buffer
	return json.Compact(&b, raw) == nil && b.String() == want
}

// isJSONObject reports whether s is one JSON object.
func isJSONObject(s string) bool {
	var m map[string]json.RawMessage
	return json.Unmarshal([]byte(s), &m) == nil && m != nil
}

// modelOr is m, or def when m is empty.
func modelOr(m, def string) string {
	if m != "" {
		return m
	}
	return def
}

// idOr is id, or when it is empty a new random one led by prefix.
func idOr(id, prefix string) string {
	if id == "" {
		return prefix + randomID()
	}
	return id
}

// shape is how an API shape answers a generation: its error writer, the
// whole answer built from everything the run produced, and the writer of
// its stream.
type shape struct {
	writeErr func(http.ResponseWriter, *Error)
	respond  func(u update) any // u.Res is set
	stream   func(ew *eventWriter) streamer
}

// streamer writes one shape's stream. start is called once the first
// token arrived (or the generation ended without one), with the headers
// not yet written; delta with every update from then on (the one that
// started the stream and the last included), whole: a shape whose events
// follow the order the backend produced things in walks u.Deltas
// (update.each); finish after the last. A false return means the client
// is gone.
type streamer interface {
	start(u update) bool
	delta(u update) bool
	finish(res *GenerateResult)
	fail(e *Error) // after start: the status is already 200
}

// serveGen runs gen (admitted, logged) and answers it in sh's shape,
// streamed or not.
func (s *Server) serveGen(w http.ResponseWriter, r *http.Request, gen *GenerateRequest, stream bool, sh shape) {
	release, ok := s.admit(w, r, sh.writeErr)
	if !ok {
		return
	}
	defer release()
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	g := s.startRun(ctx, gen)
	var status int
	if stream {
		status = drive(ctx, cancel, w, g, sh)
	} else {
		status = http.StatusOK
		u := g.wait()
		switch {
		case u.Err != nil && r.Context().Err() != nil:
			status = 0 // the client left
		case u.Err != nil:
			e := asError(u.Err)
			sh.writeErr(w, e)
			status = e.Status
		default:
			if u.Res == nil {
				u.Res = &GenerateResult{}
			}
			w.Header().Set("X-Meshp2p-Reroutes", strconv.Itoa(u.Res.Reroutes))
			writeJSON(w, http.StatusOK, sh.respond(u))
		}
	}
	s.logRun(r, gen.Model, stream, status, g)
}

// drive streams g: nothing is written before the first token (or the end),
// so errors before it keep their HTTP status; a failed write (the client
// left) cancels the generation, which frees every hop.
func drive(ctx context.Context, cancel context.CancelFunc, w http.ResponseWriter, g *run, sh shape) int {
	st := sh.stream(&eventWriter{w: w, rc: http.NewResponseController(w)})
	// rerouted: the route changed since the stream was last handed an
	// update (the first route included): the next one says so.
	started, rerouted := false, false
	for {
		u, ok := g.next(ctx)
		if !ok {
			return 0
		}
		rerouted = rerouted || u.Rerouted
		if u.Done && u.Err != nil {
			if ctx.Err() != nil {
				return 0
			}
			e := asError(u.Err)
			if !started {
				sh.writeErr(w, e)
				return e.Status
			}
			st.fail(e)
			return http.StatusOK
		}
		if !started && (u.Tokens > 0 || u.Done) {
			started = true
			if !st.start(u) {
				cancel()
				continue
			}
		}
		if !started {
			continue
		}
		u.Rerouted, rerouted = rerouted, false
		if !st.delta(u) {
			cancel()
			continue
		}
		if u.Done {
			if u.Res == nil {
				u.Res = &GenerateResult{}
			}
			st.finish(u.Res)
			return http.StatusOK
		}
	}
}

// each calls piece with u's deltas one at a time, in the order the
// backend produced them (Text, ToolCalls and Logprobs merge them); false
// when piece is.
func (u update) each(piece func(d update) bool) bool {
	for _, d := range u.Deltas {
		if !piece(update{Text: d.Text, ToolCalls: d.ToolCalls, Logprobs: d.Logprobs, Tokens: u.Tokens, Route: u.Route}) {
			return false
		}
	}
	return true
}

// eventWriter writes a stream's events: server-sent events, data only
// (OpenAI) or with event names (Anthropic, Responses), or JSON lines
// (Ollama).
type eventWriter struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

// open writes the headers of a stream of contentType.
func (e *eventWriter) open(contentType string) {
	h := e.w.Header()
	h.Set("Content-Type", contentType)
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	e.w.WriteHeader(http.StatusOK)
}

// write writes and flushes b; false when the client is gone.
func (e *eventWriter) write(b []byte) bool {
	_ = e.rc.SetWriteDeadline(time.Now().Add(WriteTimeout))
	if _, err := e.w.Write(b); err != nil {
		return false
	}
	return e.rc.Flush() == nil
}

// event writes one server-sent event named name.
func (e *eventWriter) event(name string, v any) bool {
	b, err := json.Marshal(v)
	if err != nil {
		return false
	}
	return e.write(fmt.Appendf(nil, "event: %s\ndata: %s\n\n", name, b))
}

// data writes one server-sent event without a name.
func (e *eventWriter) data(v any) bool {
	b, err := json.Marshal(v)
	if err != nil {
		return false
	}
	return e.write(fmt.Appendf(nil, "data: %s\n\n", b))
}

// line writes v as one JSON line.
func (e *eventWriter) line(v any) bool {
	b, err := json.Marshal(v)
	if err != nil {
		return false
	}
	return e.write(append(b, '\n'))
}
