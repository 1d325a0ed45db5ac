package api

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/neuron-tai/meshp2p/client"
)

// scripted is a Backend that plays back fixed token pieces: it stands in
// for the swarm in the HTTP-level tests (the swarm itself is tested through
// Swarm with the OpenAI SDK, in cmd/meshp2p's serve tests).
type scripted struct {
	pieces []string
	err    error         // returned before any piece
	block  chan struct{} // if set, Generate waits on it (or ctx) before playing
	// calls, if set, are played after the pieces as tool calls (each
	// call's arguments in two fragments), and the result reports them.
	calls  []ToolCall
	seen   atomic.Pointer[GenerateRequest]
	ctxErr atomic.Value
}

func (b *scripted) Models(context.Context) ([]Model, error) {
	return []Model{{ID: "tiny", Name: "tiny", Fingerprint: strings.Repeat("ab", 32), NLayer: 5, Created: 1700000000}}, nil
}

func (b *scripted) Generate(ctx context.Context, req *GenerateRequest, onDelta func(Delta)) (*GenerateResult, error) {
	onText := func(s string, piece string) {
		d := Delta{Text: s}
		if req.Logprobs {
			lp := TokenLogprob{Token: piece, Logprob: -0.5, Bytes: []byte(piece)}
			for i := range req.TopLogprobs {
				lp.Top = append(lp.Top, TopLogprob{Token: fmt.Sprint("alt", i), Logprob: -float32(i + 1), Bytes: []byte(fmt.Sprint("alt", i))})
			}
			d.Logprobs = []TokenLogprob{lp}
		}
		onDelta(d)
	}
	b.seen.Store(req)
	if b.err != nil {
		return nil, b.err
	}
	if b.block != nil {
		select {
		case <-b.block:
		case <-ctx.Done():
			b.ctxErr.Store(ctx.Err())
			return nil, ctx.Err()
		}
	}
	if req.OnRoute != nil {
		req.OnRoute(RouteInfo{Model: "tiny", Fingerprint: strings.Repeat("ab", 32), Hops: []Hop{{Peer: "p1", Start: 0, End: 5}}})
	}
	// The pieces go through the same text assembly the swarm backend
	// uses (client.Text via client.Stream): UTF-8 and stop strings.
	n, text := 0, client.NewText(req.Stops)
	for _, p := range b.pieces {
		n++
		stop := text.Add(p)
		onText(text.Next(false), p)
		if stop {
			break
		}
	}
	if rest := text.Next(true); rest != "" {
		onDelta(Delta{Text: rest})
	}
	for i, c := range b.calls {
		half := len(c.Arguments) / 2
		onDelta(Delta{ToolCalls: []ToolCallDelta{{Index: i, ID: c.ID, Name: c.Name, Arguments: c.Arguments[:half]}}})
		onDelta(Delta{ToolCalls: []ToolCallDelta{{Index: i, Arguments: c.Arguments[half:]}}})
		n++
	}
	return &GenerateResult{Model: "tiny", Fingerprint: strings.Repeat("ab", 32), PromptTokens: 3, CompletionTokens: n,
		Length: req.MaxTokens > 0 && n >= req.MaxTokens && len(b.calls) == 0, ToolCalls: b.calls, Stop: text.Stop()}, nil
}

func post(t *testing.T, h http.Handler, path, body string, hdr ...string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

type errBody struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Param   any    `json:"param"`
		Code    any    `json:"code"`
	} `json:"error"`
}

func decodeErr(t *testing.T, w *httptest.ResponseRecorder) errBody {
	t.Helper()
	var e errBody
	if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || e.Error.Message == "" {
		t.Fatalf("status %d: not an OpenAI error object: %q (%v)", w.Code, w.Body.String(), err)
	}
	return e
}

// Every unsupported or invalid field is refused with a 400 that names it;
// nothing is silently ignored.
func TestValidation(t *testing.T) {
	s := New(Config{Backend: &scripted{pieces: []string{"a"}}})
	const msgs = `"messages":[{"role":"user","content":"hi"}]`
	chat := func(extra string) string { return `{"model":"tiny",` + msgs + extra + `}` }
	comp := func(extra string) string { return `{"model":"tiny","prompt":"hi"` + extra + `}` }
	cases := []struct {
		name, path, body, param string
	}{
		{"n", "/v1/chat/completions", chat(`,"n":2`), "n"},
		{"tool type", "/v1/chat/completions", chat(`,"tools":[{"type":"web_search"}]`), "tools[0].type"},
		{"tool name", "/v1/chat/completions", chat(`,"tools":[{"type":"function","function":{"name":"no spaces"}}]`), "tools[0].function.name"},
		{"tool twice", "/v1/chat/completions", chat(`,"tools":[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"f"}}]`), "tools[1].function.name"},
		{"tool field", "/v1/chat/completions", chat(`,"tools":[{"type":"function","function":{"name":"f","x":1}}]`), "tools[0].function.x"},
		{"tool params not object", "/v1/chat/completions", chat(`,"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"string"}}}]`), "tools[0].function.parameters"},
		{"tool params too deep", "/v1/chat/completions", chat(`,"tools":[{"type":"function","function":{"name":"f","parameters":` + strings.Repeat(`{"a":`, 40) + `1` + strings.Repeat(`}`, 40) + `}}]`), "tools[0].function.parameters"},
		{"tool_choice unknown", "/v1/chat/completions", chat(`,"tool_choice":"sometimes"`), "tool_choice"},
		{"tool_choice required without tools", "/v1/chat/completions", chat(`,"tool_choice":"required"`), "tool_choice"},
		{"tool_choice names a missing tool", "/v1/chat/completions", chat(`,"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"g"}}`), "tool_choice"},
		{"functions", "/v1/chat/completions", chat(`,"functions":[]`), "functions"},
		{"top_logprobs range", "/v1/chat/completions", chat(`,"logprobs":true,"top_logprobs":21`), "top_logprobs"},
		{"top_logprobs without logprobs", "/v1/chat/completions", chat(`,"top_logprobs":2`), "top_logprobs"},
		{"logit_bias", "/v1/chat/completions", chat(`,"logit_bias":{"1":5}`), "logit_bias"},
		{"response_format type", "/v1/chat/completions", chat(`,"response_format":{"type":"yaml"}`), "response_format.type"},
		{"response_format schema name", "/v1/chat/completions", chat(`,"response_format":{"type":"json_schema","json_schema":{"schema":{}}}`), "response_format.json_schema.name"},
		{"response_format schema field", "/v1/chat/completions", chat(`,"response_format":{"type":"json_schema","json_schema":{"name":"a","x":1}}`), "response_format.json_schema.x"},
		{"response_format schema not object", "/v1/chat/completions", chat(`,"response_format":{"type":"json_schema","json_schema":{"name":"a","schema":[1]}}`), "response_format"},
		{"response_format with forced tools", "/v1/chat/completions", chat(`,"response_format":{"type":"json_object"},"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"required"`), "response_format"},
		{"parallel_tool_calls type", "/v1/chat/completions", chat(`,"parallel_tool_calls":"yes"`), "parallel_tool_calls"},
		{"audio", "/v1/chat/completions", chat(`,"modalities":["audio"]`), "modalities"},
		{"unknown", "/v1/chat/completions", chat(`,"frobnicate":1`), "frobnicate"},
		{"temperature range", "/v1/chat/completions", chat(`,"temperature":2.5`), "temperature"},
		{"temperature type", "/v1/chat/completions", chat(`,"temperature":"hot"`), "temperature"},
		{"top_p range", "/v1/chat/completions", chat(`,"top_p":1.5`), "top_p"},
		{"presence range", "/v1/chat/completions", chat(`,"presence_penalty":-3`), "presence_penalty"},
		{"frequency range", "/v1/chat/completions", chat(`,"frequency_penalty":2.1`), "frequency_penalty"},
		{"max_tokens zero", "/v1/chat/completions", chat(`,"max_tokens":0`), "max_tokens"},
		{"max_tokens fraction", "/v1/chat/completions", chat(`,"max_tokens":1.5`), "max_tokens"},
		{"max_completion_tokens", "/v1/chat/completions", chat(`,"max_completion_tokens":-1`), "max_completion_tokens"},
		{"seed", "/v1/chat/completions", chat(`,"seed":"x"`), "seed"},
		{"stop type", "/v1/chat/completions", chat(`,"stop":5`), "stop"},
		{"stop count", "/v1/chat/completions", chat(`,"stop":["a","b","c","d","e"]`), "stop"},
		{"stop empty", "/v1/chat/completions", chat(`,"stop":[""]`), "stop"},
		{"stream_options without stream", "/v1/chat/completions", chat(`,"stream_options":{"include_usage":true}`), "stream_options"},
		{"stream_options field", "/v1/chat/completions", chat(`,"stream":true,"stream_options":{"x":1}`), "stream_options.x"},
		{"no model", "/v1/chat/completions", `{` + msgs + `}`, "model"},
		{"no messages", "/v1/chat/completions", `{"model":"tiny"}`, "messages"},
		{"empty messages", "/v1/chat/completions", `{"model":"tiny","messages":[]}`, "messages"},
		{"tool message without id", "/v1/chat/completions", `{"model":"tiny","messages":[{"role":"tool","content":"x"}]}`, "messages[0].tool_call_id"},
		{"function role", "/v1/chat/completions", `{"model":"tiny","messages":[{"role":"function","content":"x"}]}`, "messages[0].role"},
		{"no role", "/v1/chat/completions", `{"model":"tiny","messages":[{"content":"x"}]}`, "messages[0].role"},
		{"image part", "/v1/chat/completions", `{"model":"tiny","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, "messages[0].content[0].type"},
		{"message audio", "/v1/chat/completions", `{"model":"tiny","messages":[{"role":"user","content":"x","audio":{}}]}`, "messages[0].audio"},
		{"tool calls on a user turn", "/v1/chat/completions", `{"model":"tiny","messages":[{"role":"user","content":"x","tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":"{}"}}]}]}`, "messages[0].tool_calls"},
		{"tool call arguments not JSON", "/v1/chat/completions", `{"model":"tiny","messages":[{"role":"user","content":"x"},{"role":"assistant","tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":"{nope"}}]}]}`, "messages[1].tool_calls[0].function.arguments"},
		{"prompt tokens", "/v1/completions", `{"model":"tiny","prompt":[1,2,3]}`, "prompt"},
		{"prompt list", "/v1/completions", `{"model":"tiny","prompt":["a","b"]}`, "prompt"},
		{"echo", "/v1/completions", comp(`,"echo":true`), "echo"},
		{"best_of", "/v1/completions", comp(`,"best_of":3`), "best_of"},
		{"suffix", "/v1/completions", comp(`,"suffix":"end"`), "suffix"},
		{"completion logprobs", "/v1/completions", comp(`,"logprobs":21`), "logprobs"},
		{"completion n", "/v1/completions", comp(`,"n":3`), "n"},
		{"no prompt", "/v1/completions", `{"model":"tiny"}`, "prompt"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := post(t, s, tc.path, tc.body)
			if w.Code != http.StatusBadRequest {
				t.Fatalf("status %d, want 400: %s", w.Code, w.Body.String())
			}
			e := decodeErr(t, w)
			if e.Error.Param != tc.param || e.Error.Type != "invalid_request_error" || !strings.Contains(e.Error.Message, tc.param[strings.LastIndexByte(tc.param, '.')+1:]) {
				t.Fatalf("error %+v, want param %q named in the message", e.Error, tc.param)
			}
		})
	}
	for _, body := range []string{`not json`, `[1,2]`, `{"model":"tiny"} {}`} {
		if w := post(t, s, "/v1/chat/completions", body); w.Code != http.StatusBadRequest {
			t.Fatalf("body %q: status %d", body, w.Code)
		}
	}
}

// Accepted fields reach the backend with their values; OpenAI's defaults
// apply to the rest.
func TestAcceptedFields(t *testing.T) {
	b := &scripted{pieces: []string{"ok"}}
	s := New(Config{Backend: b})
	w := post(t, s, "/v1/chat/completions", `{"model":"tiny","messages":[{"role":"developer","content":"be brief"},
		{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},{"role":"assistant","content":"c","refusal":null}],
		"max_completion_tokens":7,"temperature":0.5,"top_p":0.9,"seed":-1,"presence_penalty":0.5,"frequency_penalty":-0.5,
		"n":1,"logprobs":false,"user":"u","response_format":{"type":"text"},"stop":"x","tools":null}`)
	if w.Code != http.StatusOK {
		t.Fatalf("status %d: %s", w.Code, w.Body.String())
	}
	got := b.seen.Load()
	want := []Message{{Role: "system", Content: "be brief"}, {Role: "user", Content: "a\nb"}, {Role: "assistant", Content: "c"}}
	if fmt.Sprint(got.Messages) != fmt.Sprint(want) || got.MaxTokens != 7 || got.Temperature != 0.5 || got.TopP != 0.9 ||
		got.Seed != ^uint64(0) || got.PresencePenalty != 0.5 || got.FrequencyPenalty != -0.5 {
		t.Fatalf("backend saw %+v", got)
	}
	if w := post(t, s, "/v1/completions", `{"model":"tiny","prompt":["once"],"echo":false,"best_of":1,"suffix":""}`); w.Code != http.StatusOK {
		t.Fatalf("completion: %d %s", w.Code, w.Body.String())
	}
	got = b.seen.Load()
	if got.Prompt != "once" || got.MaxTokens != DefaultCompletionMaxTokens || got.Temperature != 1 || got.TopP != 1 {
		t.Fatalf("completion defaults: %+v", got)
	}
}

// sse reads an event stream into its data payloads, checking the framing:
// every event is one "data: " line followed by a blank line.
func sse(t *testing.T, body io.Reader) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(body)
	for sc.Scan() {
		line := sc.Text()
		d, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("line %q is not a data line", line)
		}
		out = append(out, d)
		if !sc.Scan() || sc.Text() != "" {
			t.Fatalf("event %q not followed by a blank line", d)
		}
	}
	return out
}

// The stream is role chunk, content deltas, finish chunk, usage chunk and
// [DONE]; deltas never split a UTF-8 character and a stop string split
// over tokens is never emitted.
func TestSSEFraming(t *testing.T) {
	// "é" (c3 a9) and "€" (e2 82 ac) split across pieces; stop "END" spans
	// three pieces.
	b := &scripted{pieces: []string{"caf", "\xc3", "\xa9 ", "\xe2\x82", "\xac E", "N", "D tail"}}
	srv := httptest.NewServer(New(Config{Backend: b}))
	defer srv.Close()
	resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"tiny","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true},"stop":["END"]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || ct != "text/event-stream" {
		t.Fatalf("status %d content type %q", resp.StatusCode, ct)
	}
	events := sse(t, resp.Body)
	if len(events) < 4 || events[len(events)-1] != "[DONE]" {
		t.Fatalf("events %q", events)
	}
	type chunk struct {
		ID, Object, Model string
		Choices           []struct {
			Delta        struct{ Role, Content string }
			FinishReason *string `json:"finish_reason"`
		}
		Usage   *usage
		Meshp2p *extension
	}
	var chunks []chunk
	for _, e := range events[:len(events)-1] {
		var c chunk
		if err := json.Unmarshal([]byte(e), &c); err != nil {
			t.Fatalf("event %q: %v", e, err)
		}
		if c.Object != "chat.completion.chunk" || !strings.HasPrefix(c.ID, "chatcmpl-") || c.ID != chunks0(chunks, c).ID || c.Model != "tiny" {
			t.Fatalf("chunk %+v", c)
		}
		chunks = append(chunks, c)
	}
	if chunks[0].Choices[0].Delta.Role != "assistant" || chunks[0].Choices[0].Delta.Content != "" {
		t.Fatalf("first chunk %+v", chunks[0])
	}
	text := ""
	for _, c := range chunks[1 : len(chunks)-2] {
		d := c.Choices[0].Delta.Content
		if !utf8.ValidString(d) || c.Choices[0].FinishReason != nil {
			t.Fatalf("delta %q (finish %v)", d, c.Choices[0].FinishReason)
		}
		text += d
	}
	if text != "café € " {
		t.Fatalf("text %q", text)
	}
	fin, use := chunks[len(chunks)-2], chunks[len(chunks)-1]
	if fin.Choices[0].FinishReason == nil || *fin.Choices[0].FinishReason != "stop" || fin.Meshp2p == nil {
		t.Fatalf("finish chunk %+v", fin)
	}
	if len(use.Choices) != 0 || use.Usage == nil || use.Usage.CompletionTokens != 7 || use.Usage.TotalTokens != 10 {
		t.Fatalf("usage chunk %+v", use)
	}
	if chunks[1].Meshp2p == nil || len(chunks[1].Meshp2p.Route) != 1 {
		t.Fatalf("first delta lacks the route: %+v", chunks[1])
	}
}

func chunks0[T any](cs []T, c T) T {
	if len(cs) == 0 {
		return c
	}
	return cs[0]
}

func TestNonStreamAndCompletionStream(t *testing.T) {
	b := &scripted{pieces: []string{"Once", " upon"}}
	s := New(Config{Backend: b})
	w := post(t, s, "/v1/chat/completions", `{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`)
	var c struct {
		Object  string
		Choices []struct {
			Message      chatMessage
			FinishReason string `json:"finish_reason"`
		}
		Usage usage
	}
	if err := json.Unmarshal(w.Body.Bytes(), &c); err != nil || w.Code != 200 {
		t.Fatalf("%d %s", w.Code, w.Body.String())
	}
	if c.Object != "chat.completion" || deref(c.Choices[0].Message.Content) != "Once upon" || c.Choices[0].Message.Role != "assistant" ||
		c.Choices[0].FinishReason != "length" || c.Usage.TotalTokens != 5 || w.Header().Get("X-Meshp2p-Reroutes") != "0" {
		t.Fatalf("response %+v", c)
	}
	w = post(t, s, "/v1/completions", `{"model":"tiny","prompt":"x","stream":true}`)
	ev := sse(t, w.Body)
	var txt string
	for _, e := range ev[:len(ev)-1] {
		var k struct {
			Object  string
			Choices []struct{ Text string }
		}
		if err := json.Unmarshal([]byte(e), &k); err != nil || k.Object != "text_completion" {
			t.Fatalf("event %q", e)
		}
		txt += k.Choices[0].Text
	}
	if txt != "Once upon" || ev[len(ev)-1] != "[DONE]" {
		t.Fatalf("completion stream %q", ev)
	}
}

// Backend errors keep their status, also on streams that failed before
// their first token.
func TestBackendErrors(t *testing.T) {
	cases := []struct {
		err    error
		status int
		code   string
		retry  string // Retry-After
	}{
		{ModelNotFound("nope"), 404, "model_not_found", ""},
		{fmt.Errorf("wrapped: %w", Unavailable("no peer serves layers 2-4 of 5")), 503, "model_unavailable", "10"},
		{Warming(7500*time.Millisecond, "model b is warming"), 503, "model_warming", "8"}, // the wait rounded up
		{errors.New("boom"), 500, "", ""},
	}
	for _, tc := range cases {
		for _, stream := range []string{"false", "true"} {
			s := New(Config{Backend: &scripted{err: tc.err}})
			w := post(t, s, "/v1/chat/completions", `{"model":"nope","messages":[{"role":"user","content":"hi"}],"stream":`+stream+`}`)
			e := decodeErr(t, w)
			if w.Code != tc.status || (tc.code != "" && e.Error.Code != tc.code) {
				t.Fatalf("%v stream=%s: %d %+v", tc.err, stream, w.Code, e)
			}
			if ra := w.Header().Get("Retry-After"); ra != tc.retry {
				t.Fatalf("%v stream=%s: Retry-After %q, want %q", tc.err, stream, ra, tc.retry)
			}
		}
	}
	// Anthropic's and Ollama's shapes carry the header too.
	for _, req := range [][2]string{{"/v1/messages", `{"model":"b","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`},
		{"/api/generate", `{"model":"b","prompt":"hi"}`}} {
		for _, err := range []error{Warming(10*time.Second, "warming"), Unavailable("no peer serves layers 2-4 of 5")} {
			s := New(Config{Backend: &scripted{err: err}})
			if w := post(t, s, req[0], req[1]); w.Code != 503 || w.Header().Get("Retry-After") != "10" {
				t.Fatalf("%s, %v: %d, Retry-After %q", req[0], err, w.Code, w.Header().Get("Retry-After"))
			}
		}
	}
	s := New(Config{Backend: &scripted{}})
	r := httptest.NewRequest(http.MethodGet, "/v1/models/nope", nil)
	w := httptest.NewRecorder()
	s.ServeHTTP(w, r)
	if w.Code != 404 || decodeErr(t, w).Error.Code != "model_not_found" {
		t.Fatalf("unknown model: %d %s", w.Code, w.Body.String())
	}
	for _, path := range []string{"/v1/models/tiny", "/v1/models/" + strings.Repeat("ab", 8), "/v1/models/" + strings.Repeat("ab", 32)} {
		w := httptest.NewRecorder()
		s.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
		var m modelObject
		if json.Unmarshal(w.Body.Bytes(), &m) != nil || w.Code != 200 || m.ID != "tiny" || m.Object != "model" || m.Created != 1700000000 {
			t.Fatalf("%s: %d %s", path, w.Code, w.Body.String())
		}
	}
	w = httptest.NewRecorder()
	s.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/v1/embeddings", nil))
	if w.Code != 404 {
		t.Fatalf("unknown endpoint: %d", w.Code)
	}
}

// The key is required on /v1/ (401 otherwise) and not on mounted extras.
func TestAuth(t *testing.T) {
	s := New(Config{Backend: &scripted{pieces: []string{"a"}}, APIKey: "s3cret"})
	s.Handle("GET /api/status", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "up") }))
	body := `{"model":"tiny","prompt":"x"}`
	for _, h := range []string{"", "Bearer", "Bearer s3cre", "Bearer s3cret2", "Basic s3cret", "bearer s3cret", "Bearer xxxxxx"} {
		w := post(t, s, "/v1/completions", body, "Authorization", h)
		if w.Code != 401 || w.Header().Get("WWW-Authenticate") == "" || decodeErr(t, w).Error.Code != "invalid_api_key" {
			t.Fatalf("Authorization %q: %d", h, w.Code)
		}
	}
	if w := post(t, s, "/v1/completions", body, "Authorization", "Bearer s3cret"); w.Code != 200 {
		t.Fatalf("right key: %d %s", w.Code, w.Body.String())
	}
	w := httptest.NewRecorder()
	s.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/api/status", nil))
	if w.Code != 200 || w.Body.String() != "up" {
		t.Fatalf("mounted handler: %d %q", w.Code, w.Body.String())
	}
	defer func() {
		if recover() == nil {
			t.Fatal("mounting under /v1/ did not panic")
		}
	}()
	s.Handle("/v1/x", http.NotFoundHandler())
}

func TestCORS(t *testing.T) {
	for _, tc := range []struct {
		origins []string
		origin  string
		allow   string
	}{
		{nil, "http://app.example", ""},
		{[]string{"http://app.example"}, "http://app.example", "http://app.example"},
		{[]string{"http://app.example"}, "http://evil.example", ""},
		{[]string{"*"}, "http://any.example", "*"},
	} {
		s := New(Config{Backend: &scripted{}, CORSOrigins: tc.origins, APIKey: "k"})
		r := httptest.NewRequest(http.MethodOptions, "/v1/chat/completions", nil)
		r.Header.Set("Origin", tc.origin)
		r.Header.Set("Access-Control-Request-Method", "POST")
		w := httptest.NewRecorder()
		s.ServeHTTP(w, r)
		if got := w.Header().Get("Access-Control-Allow-Origin"); got != tc.allow {
			t.Fatalf("%v from %s: allow %q, want %q", tc.origins, tc.origin, got, tc.allow)
		}
		if tc.allow != "" && (w.Code != 204 || !strings.Contains(w.Header().Get("Access-Control-Allow-Headers"), "Authorization")) {
			t.Fatalf("preflight: %d %v", w.Code, w.Header())
		}
		r = httptest.NewRequest(http.MethodGet, "/v1/models", nil)
		r.Header.Set("Origin", tc.origin)
		r.Header.Set("Authorization", "Bearer k")
		w = httptest.NewRecorder()
		s.ServeHTTP(w, r)
		if w.Code != 200 || w.Header().Get("Access-Control-Allow-Origin") != tc.allow {
			t.Fatalf("GET: %d allow %q", w.Code, w.Header().Get("Access-Control-Allow-Origin"))
		}
	}
}

// Bodies are bounded (413), generations too: MaxActive run, MaxQueue
// wait, the next gets 429 with Retry-After; a client that leaves cancels
// its generation.
func TestLimits(t *testing.T) {
	s := New(Config{Backend: &scripted{}, MaxBody: 64})
	w := post(t, s, "/v1/completions", `{"model":"tiny","prompt":"`+strings.Repeat("x", 100)+`"}`)
	if w.Code != 413 || decodeErr(t, w).Error.Code != "request_too_large" {
		t.Fatalf("big body: %d", w.Code)
	}

	b := &scripted{pieces: []string{"a"}, block: make(chan struct{})}
	ls := New(Config{Backend: b, MaxActive: 1, MaxQueue: 1})
	srv := httptest.NewServer(ls)
	defer srv.Close()
	body := `{"model":"tiny","prompt":"x"}`
	results := make(chan int, 2)
	for range 2 {
		go func() {
			resp, err := http.Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(body))
			if err != nil {
				results <- -1
				return
			}
			resp.Body.Close()
			results <- resp.StatusCode
		}()
	}
	// One runs, one waits: the third is refused.
	for deadline := time.Now().Add(10 * time.Second); len(ls.limit.slots) != 1 || len(ls.limit.queue) != 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the two requests never got a slot and a queue place")
		}
	}
	resp, err := http.Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("third request: %d Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	close(b.block)
	for range 2 {
		if c := <-results; c != 200 {
			t.Fatalf("queued request: %d", c)
		}
	}

	// A client that leaves mid-request cancels the backend's context.
	b2 := &scripted{block: make(chan struct{})}
	srv2 := httptest.NewServer(New(Config{Backend: b2}))
	defer srv2.Close()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv2.URL+"/v1/completions", strings.NewReader(`{"model":"tiny","prompt":"x","stream":true}`))
	go func() {
		for b2.seen.Load() == nil {
			time.Sleep(time.Millisecond)
		}
		cancel()
	}()
	if _, err := http.DefaultClient.Do(req); err == nil {
		t.Fatal("cancelled request succeeded")
	}
	for deadline := time.Now().Add(5 * time.Second); b2.ctxErr.Load() == nil; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("backend not cancelled after the client left")
		}
	}
}

// The API package stays free of cgo, the engine and the node.
func TestNoEngineOrNodeDependency(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}} {{len .CgoFiles}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		path, cgo, _ := strings.Cut(line, " ")
		mod := "github.com/neuron-tai/meshp2p/"
		if path == mod+"engine" || path == mod+"node" || (strings.HasPrefix(path, mod) && cgo != "0") {
			t.Errorf("api depends on %s (cgo files: %s)", path, cgo)
		}
	}
	if !strings.Contains(string(out), "net/http") {
		t.Fatalf("go list output looks wrong:\n%s", out)
	}
}

// Serve holds at most MaxConns connections open; the next waits until
// one closes.
func TestMaxConns(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- New(Config{Backend: &scripted{}, MaxConns: 1}).Serve(ctx, ln) }()
	defer func() { cancel(); <-done }()
	url := "http://" + ln.Addr().String() + "/v1/models"
	hold, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	// Make sure the held connection was accepted: a request on it works.
	if _, err := io.WriteString(hold, "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if _, err := bufio.NewReader(hold).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Timeout: 300 * time.Millisecond, Transport: &http.Transport{DisableKeepAlives: true}}
	if resp, err := c.Get(url); err == nil {
		resp.Body.Close()
		t.Fatal("a second connection was served while the first held the only slot")
	}
	hold.Close()
	c.Timeout = 10 * time.Second
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("after the first connection closed: %v", err)
	}
	resp.Body.Close()
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
