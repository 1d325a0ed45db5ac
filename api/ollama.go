package api

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// Ollama's API (POST /api/chat, POST /api/generate, GET /api/tags, POST
// /api/show, GET /api/version) over the same Backend as the OpenAI
// endpoints: the request becomes a GenerateRequest (validated by
// checkGen), runs through the shared machinery and is answered in
// Ollama's shapes: JSON objects, newline-delimited JSON streams (the
// default, as in Ollama) and {"error": "…"}. Sampling defaults are
// Ollama's (temperature 0.8, top_k 40, top_p 0.9, repeat_penalty 1.1 over
// the last 64 tokens, a random seed). docs/api.md lists what it accepts
// and refuses.

// ollamaRequest is a parsed /api/chat or /api/generate body.
type ollamaRequest struct {
	gen    GenerateRequest
	stream bool
	chat   bool
	// load: no messages (chat) or an empty prompt (generate): Ollama's
	// "load the model" request, answered without generating.
	load bool
}

var ollamaNames = FieldNames{Tools: "tools", ToolName: ".function.name", ToolParams: ".function.parameters",
	ToolChoice: "tool_choice", Format: "format", TopLogprobs: "top_logprobs"}

// Ollama's default sampling (its api.DefaultOptions).
const (
	ollamaTemperature   = 0.8
	ollamaTopK          = 40
	ollamaTopP          = 0.9
	ollamaRepeatPenalty = 1.1
)

// parseOllama validates an /api/chat (chat) or /api/generate body.
func parseOllama(body []byte, chat bool) (*ollamaRequest, *Error) {
	names := []string{"model", "format", "options", "stream", "keep_alive", "think", "logprobs", "top_logprobs"}
	if chat {
		// tool_choice is meshp2p's extension (Ollama has none): OpenAI's
		// values, so a client can force a call as on /v1/chat/completions.
		names = append(names, "messages", "tools", "tool_choice")
	} else {
		names = append(names, "prompt", "system", "raw", "images", "context", "suffix", "template")
	}
	o, e := bodyObject(body, names...)
	if e != nil {
		return nil, e
	}
	if e := o.need("model"); e != nil {
		return nil, e
	}
	r := &ollamaRequest{chat: chat, stream: true, gen: GenerateRequest{Temperature: ollamaTemperature, TopK: ollamaTopK,
		TopP: ollamaTopP, RepeatPenalty: ollamaRepeatPenalty, Seed: randomSeed(), ParallelToolCalls: true}}
	g := &r.gen
	if e := cmp.Or(o.str("model", &g.Model, true), o.optBool("stream", &r.stream)); e != nil {
		return nil, e
	}
	if o.has("keep_alive") {
		var d any
		_ = json.Unmarshal(o.raw("keep_alive"), &d)
		switch d.(type) {
		case string, float64:
		default:
			return nil, BadRequest("keep_alive", `"keep_alive" must be a duration ("5m") or a number of seconds`)
		}
	}
	if o.has("think") {
		var b bool
		if json.Unmarshal(o.raw("think"), &b) != nil || b {
			return nil, unsupported("think", "only false is supported: no separate thinking output")
		}
	}
	if e := cmp.Or(o.optBool("logprobs", &g.Logprobs), o.optInt("top_logprobs", &g.TopLogprobs, 0, MaxTopLogprobs)); e != nil {
		return nil, e
	}
	if e := parseAll(o, g, parseOllamaFormat, parseOllamaOptions); e != nil {
		return nil, e
	}
	if chat {
		if e := o.need("messages"); e != nil {
			return nil, e
		}
		if e := parseAll(o, g, parseOllamaMessages, parseOllamaTools, parseChatToolChoice); e != nil {
			return nil, e
		}
		r.load = len(g.Messages) == 0
	} else if e := parseOllamaPrompt(o, r); e != nil {
		return nil, e
	}
	if e := checkGen(g, ollamaNames); e != nil {
		return nil, e
	}
	return r, nil
}

// parseOllamaPrompt maps /api/generate's prompt: rendered as a user turn
// (after system) with the model's chat template, or with raw as it is.
func parseOllamaPrompt(o jobj, r *ollamaRequest) *Error {
	for _, c := range []struct{ name, empty, why string }{
		{"images", "[]", "images are not supported"},
		{"context", "[]", "context token arrays are not supported: send the conversation to /api/chat"},
		{"suffix", `""`, "insertion (suffix) is not supported"},
		{"template", `""`, "the model's own chat template is used (or raw: true)"},
	} {
		if o.has(c.name) && !jsonEqual(o.raw(c.name), c.empty) {
			return unsupported(c.name, fmt.Sprintf("only %s is supported: %s", c.empty, c.why))
		}
	}
	var prompt, system string
	var raw bool
	if e := cmp.Or(o.optStr("prompt", &prompt, false), o.optStr("system", &system, false), o.optBool("raw", &raw)); e != nil {
		return e
	}
	r.load = prompt == ""
	switch {
	case raw && system != "":
		return unsupported("system", "a raw prompt is sent as it is: no system prompt")
	case raw:
		r.gen.Prompt = prompt
	default:
		appendSystem(&r.gen, system)
		r.gen.Messages = append(r.gen.Messages, Message{Role: "user", Content: prompt})
	}
	return nil
}

// parseOllamaFormat maps format: "json" (any JSON object) or a JSON
// schema; "" is none.
func parseOllamaFormat(o jobj, g *GenerateRequest) *Error {
	if !o.has("format") {
		return nil
	}
	if s, ok := o.strValue("format"); ok {
		switch s {
		case "":
		case "json":
			g.Format = ResponseFormat{Type: FormatJSONObject}
		default:
			return BadRequest("format", `"format" must be "json" or a JSON schema (an object), got %q`, s)
		}
		return nil
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(o.raw("format"), &m) != nil || m == nil {
		return BadRequest("format", `"format" must be "json" or a JSON schema (an object)`)
	}
	g.Format = ResponseFormat{Type: FormatJSONSchema, Schema: o.raw("format"), Strict: true}
	return nil
}

// parseOllamaOptions maps the sampling options the backend implements;
// the rest (num_ctx, num_gpu, mirostat, …) are refused, naming them.
func parseOllamaOptions(o jobj, g *GenerateRequest) *Error {
	op, found, e := o.optObject("options")
	if !found {
		return e
	}
	if e := op.known("this option is not implemented by the gateway (docs/api.md lists the supported options)",
		"temperature", "top_k", "top_p", "min_p", "repeat_penalty", "seed", "num_predict", "stop",
		"presence_penalty", "frequency_penalty"); e != nil {
		return e
	}
	// cmp.Or: the first error, the options taken in this order.
	if e := cmp.Or(op.optFloat("temperature", &g.Temperature, 0, 2), op.optFloat("top_p", &g.TopP, 0, 1),
		op.optFloat("min_p", &g.MinP, 0, 1), op.optFloat("repeat_penalty", &g.RepeatPenalty, 0, 10),
		op.optFloat("presence_penalty", &g.PresencePenalty, -2, 2), op.optFloat("frequency_penalty", &g.FrequencyPenalty, -2, 2),
		op.optInt("top_k", &g.TopK, 0, MaxTopK)); e != nil {
		return e
	}
	// seed -1 (Ollama's default): random.
	if e := op.optSeed("seed", &g.Seed, true); e != nil {
		return e
	}
	if op.has("num_predict") {
		// -1 (Ollama's default, "until the end"): the gateway's default
		// max_tokens.
		var n int
		if e := op.integer("num_predict", &n, -1, MaxTokensLimit); e != nil {
			return e
		}
		if n == 0 {
			return BadRequest("options.num_predict", `"options.num_predict" must be -1 or an integer in [1, %d]`, MaxTokensLimit)
		}
		g.MaxTokens = max(n, 0)
	}
	return op.optStops("stop", &g.Stops, true)
}

func parseOllamaMessages(o jobj, g *GenerateRequest) *Error {
	return o.objects("messages", 0, MaxMessages, func(m jobj) *Error {
		if e := m.known("messages carry role, content, tool_calls, tool_name and tool_call_id (no images)",
			"role", "content", "images", "tool_calls", "tool_name", "tool_call_id", "thinking"); e != nil {
			return e
		}
		msg := Message{}
		if e := m.needStr("role", &msg.Role, true); e != nil {
			return e
		}
		msg.Role = strings.ToLower(msg.Role)
		switch msg.Role {
		case "system", "user", "assistant", "tool":
		default:
			return unsupported(m.k("role"), fmt.Sprintf("role %q is not supported (system, user, assistant, tool)", msg.Role))
		}
		if e := m.optStr("content", &msg.Content, false); e != nil {
			return e
		}
		if m.has("images") && !jsonEqual(m.raw("images"), "[]") {
			return unsupported(m.k("images"), "images are not supported")
		}
		if m.has("thinking") && !jsonEqual(m.raw("thinking"), `""`) {
			return unsupported(m.k("thinking"), "thinking output is not supported (only an empty string)")
		}
		if m.has("tool_calls") {
			if msg.Role != "assistant" {
				return BadRequest(m.k("tool_calls"), "tool_calls belong in assistant messages")
			}
			if e := m.objects("tool_calls", 0, MaxTools, func(co jobj) *Error {
				tc, e := parseOllamaToolCall(co)
				if e == nil {
					msg.ToolCalls = append(msg.ToolCalls, tc)
				}
				return e
			}); e != nil {
				return e
			}
		}
		for _, k := range []string{"tool_name", "tool_call_id"} {
			if m.has(k) && msg.Role != "tool" {
				return BadRequest(m.k(k), "%s belongs in tool messages", k)
			}
		}
		if e := m.optStr("tool_name", &msg.Name, false); e != nil {
			return e
		}
		if m.has("tool_call_id") {
			if e := m.toolCallID("tool_call_id", &msg.ToolCallID); e != nil {
				return e
			}
		}
		g.Messages = append(g.Messages, msg)
		return nil
	})
}

// parseOllamaToolCall parses an assistant's call, co: {function: {name,
// arguments (an object; a string holding one is accepted too), index}, id}.
func parseOllamaToolCall(co jobj) (ToolCall, *Error) {
	var c ToolCall
	if e := co.known("tool calls carry function, id and type", "function", "id", "type"); e != nil {
		return c, e
	}
	if co.has("type") && !jsonEqual(co.raw("type"), `"function"`) {
		return c, unsupported(co.k("type"), `only "function" calls are supported`)
	}
	if co.has("id") {
		if e := co.toolCallID("id", &c.ID); e != nil {
			return c, e
		}
	}
	f, e := functionObject(co, "functions carry name, arguments and index", "name", "arguments", "index")
	if e != nil {
		return c, e
	}
	if e := f.need("name"); e != nil {
		return c, e
	}
	if e := f.funcName("name", &c.Name); e != nil {
		return c, e
	}
	var i int
	if e := f.optInt("index", &i, 0, MaxTools); e != nil {
		return c, e
	}
	c.Arguments = "{}"
	if f.has("arguments") {
		args := f.raw("arguments")
		var s string
		if json.Unmarshal(args, &s) == nil {
			args = json.RawMessage(s)
		}
		if c.Arguments, e = argsText(args, f.k("arguments")); e != nil {
			return c, e
		}
	}
	return c, nil
}

// functionObject is the function object of a tool or a call, o, which
// carries the fields keys only (why refuses others).
func functionObject(o jobj, why string, keys ...string) (jobj, *Error) {
	if e := o.need("function"); e != nil {
		return jobj{}, e
	}
	f, e := o.object("function")
	if e == nil {
		e = f.known(why, keys...)
	}
	return f, e
}

func parseOllamaTools(o jobj, g *GenerateRequest) *Error {
	return o.tools(g, Tool{}, func(to jobj, t *Tool) *Error {
		if e := to.known("tools carry type and function", "type", "function"); e != nil {
			return e
		}
		if to.has("type") && !jsonEqual(to.raw("type"), `"function"`) {
			return unsupported(to.k("type"), `only "function" tools are supported`)
		}
		f, e := functionObject(to, "functions carry name, description and parameters", "name", "description", "parameters")
		if e != nil {
			return e
		}
		return f.functionTool(t, "parameters", false)
	})
}

// Responses.

type ollamaMessage struct {
	Role      string           `json:"role"`
	Content   string           `json:"content"`
	ToolCalls []ollamaToolCall `json:"tool_calls,omitempty"`
}

type ollamaToolCall struct {
	ID       string         `json:"id,omitempty"`
	Function ollamaFunction `json:"function"`
}

type ollamaFunction struct {
	Index     int             `json:"index"`
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
}

type ollamaLogprob struct {
	Token       string          `json:"token"`
	Logprob     float32         `json:"logprob"`
	Bytes       []int           `json:"bytes,omitempty"`
	TopLogprobs []ollamaLogprob `json:"top_logprobs,omitempty"`
}

// ollamaChunk is a whole response, or one line of a stream: chat carries
// message, generate response.
type ollamaChunk struct {
	Model              string          `json:"model"`
	CreatedAt          string          `json:"created_at"`
	Message            *ollamaMessage  `json:"message,omitempty"`
	Response           *string         `json:"response,omitempty"`
	Done               bool            `json:"done"`
	DoneReason         string          `json:"done_reason,omitempty"`
	TotalDuration      int64           `json:"total_duration,omitempty"`
	LoadDuration       int64           `json:"load_duration,omitempty"`
	PromptEvalCount    int             `json:"prompt_eval_count,omitempty"`
	PromptEvalDuration int64           `json:"prompt_eval_duration,omitempty"`
	EvalCount          int             `json:"eval_count,omitempty"`
	EvalDuration       int64           `json:"eval_duration,omitempty"`
	Logprobs           []ollamaLogprob `json:"logprobs,omitempty"`
	Meshp2p            *extension      `json:"meshp2p,omitempty"`
}

func ollamaNow() string { return time.Now().UTC().Format(time.RFC3339Nano) }

// chunk is a chunk carrying text (and logprobs) for req's shape.
func (r *ollamaRequest) chunk(model, text string, lps []TokenLogprob) ollamaChunk {
	c := ollamaChunk{Model: model, CreatedAt: ollamaNow()}
	if r.chat {
		c.Message = &ollamaMessage{Role: "assistant", Content: text}
	} else {
		c.Response = &text
	}
	if r.gen.Logprobs {
		c.Logprobs = ollamaLogprobs(lps)
	}
	return c
}

func ollamaLogprobs(lps []TokenLogprob) []ollamaLogprob {
	out := make([]ollamaLogprob, len(lps))
	for i, lp := range lps {
		out[i] = ollamaLogprob{Token: lp.Token, Logprob: lp.Logprob, Bytes: byteInts(lp.Bytes)}
		for _, a := range lp.Top {
			out[i].TopLogprobs = append(out[i].TopLogprobs, ollamaLogprob{Token: a.Token, Logprob: a.Logprob, Bytes: byteInts(a.Bytes)})
		}
	}
	return out
}

func ollamaCall(i int, c ToolCall) ollamaToolCall {
	return ollamaToolCall{ID: c.ID, Function: ollamaFunction{Index: i, Name: c.Name, Arguments: argsObject(c.Arguments)}}
}

// done fills the final chunk: done_reason, counts and durations (first:
// when the first token arrived; zero when unknown).
func (c *ollamaChunk) done(res *GenerateResult, start, first time.Time) {
	c.Done, c.DoneReason = true, "stop"
	if res.Length {
		c.DoneReason = "length"
	}
	now := time.Now()
	c.TotalDuration = int64(now.Sub(start))
	c.PromptEvalCount, c.EvalCount = res.PromptTokens, res.CompletionTokens
	c.EvalDuration = c.TotalDuration
	if !first.IsZero() {
		c.PromptEvalDuration, c.EvalDuration = int64(first.Sub(start)), int64(now.Sub(first))
	}
	c.Meshp2p = final(res)
}

func (s *Server) ollamaChat(w http.ResponseWriter, r *http.Request)     { s.ollamaRun(w, r, true) }
func (s *Server) ollamaGenerate(w http.ResponseWriter, r *http.Request) { s.ollamaRun(w, r, false) }

// ollamaRun answers /api/chat (chat) or /api/generate.
func (s *Server) ollamaRun(w http.ResponseWriter, r *http.Request, chat bool) {
	start := time.Now()
	req, ok := readRequest(s, w, r, writeOllamaError, func(body []byte) (*ollamaRequest, *Error) { return parseOllama(body, chat) })
	if !ok {
		return
	}
	if req.load {
		s.ollamaLoad(w, r, req)
		return
	}
	s.serveGen(w, r, &req.gen, req.stream, shape{
		writeErr: writeOllamaError,
		respond: func(u update) any {
			c := req.chunk(modelOr(u.Res.Model, req.gen.Model), u.Text, u.Logprobs)
			if chat {
				for i, tc := range u.Res.ToolCalls {
					c.Message.ToolCalls = append(c.Message.ToolCalls, ollamaCall(i, tc))
				}
			}
			c.done(u.Res, start, time.Time{})
			return c
		},
		stream: func(ew *eventWriter) streamer {
			return &ollamaStream{ew: ew, req: req, model: req.gen.Model, began: start}
		},
	})
}

// ollamaLoad answers a request with nothing to generate as Ollama does
// (done_reason "load"), once the model is known to exist.
func (s *Server) ollamaLoad(w http.ResponseWriter, r *http.Request, req *ollamaRequest) {
	m, e := s.findModel(r, req.gen.Model)
	if e != nil {
		writeOllamaError(w, e)
		return
	}
	c := req.chunk(m.ID, "", nil)
	c.Done, c.DoneReason = true, "load"
	if req.stream {
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.WriteHeader(http.StatusOK)
		_ = json.NewEncoder(w).Encode(c)
		return
	}
	writeJSON(w, http.StatusOK, c)
}

// ollamaStream writes NDJSON: a line per piece of text, a line per tool
// call once it is complete (Ollama streams calls whole), a final line with
// done: true, done_reason and the counts.
type ollamaStream struct {
	ew           *eventWriter
	req          *ollamaRequest
	model        string
	began, first time.Time // the request's start, the first token's arrival
	call         *ToolCall // the call being assembled
	callIdx      int       // its ToolCallDelta.Index
	calls        int       // calls written
}

func (o *ollamaStream) start(u update) bool {
	o.model = modelOr(u.Route.Model, o.model)
	o.first = time.Now()
	o.ew.open("application/x-ndjson")
	return true
}

// flushCall writes the call assembled so far, whole, as Ollama streams
// calls. A call whose arguments never became a JSON object was abandoned
// (cut off by num_predict, or broken): its text arrives as content, so it
// is dropped here.
func (o *ollamaStream) flushCall() bool {
	if o.call == nil {
		return true
	}
	if !isJSONObject(o.call.Arguments) {
		o.call = nil
		return true
	}
	c := o.req.chunk(o.model, "", nil)
	c.Message.ToolCalls = []ollamaToolCall{ollamaCall(o.calls, *o.call)}
	o.call = nil
	o.calls++
	return o.ew.line(c)
}

func (o *ollamaStream) delta(u update) bool { return u.each(o.piece) }

// piece writes one delta.
func (o *ollamaStream) piece(u update) bool {
	if u.Text != "" || len(u.Logprobs) > 0 {
		// Text ends a call in progress (flushed if complete); logprobs
		// alone ride along without touching it.
		if (u.Text != "" && !o.flushCall()) || !o.ew.line(o.req.chunk(o.model, u.Text, u.Logprobs)) {
			return false
		}
	}
	if !o.req.chat {
		return true
	}
	for _, d := range u.ToolCalls {
		if o.call == nil || d.Index != o.callIdx {
			if !o.flushCall() {
				return false
			}
			o.call, o.callIdx = &ToolCall{ID: d.ID, Name: d.Name}, d.Index
		}
		o.call.Arguments += d.Arguments
	}
	return true
}

func (o *ollamaStream) finish(res *GenerateResult) {
	if !o.flushCall() {
		return
	}
	c := o.req.chunk(modelOr(res.Model, o.model), "", nil)
	c.done(res, o.began, o.first)
	o.ew.line(c)
}

func (o *ollamaStream) fail(e *Error) { o.ew.line(map[string]string{"error": messageNaming(e)}) }

// Models, show, version.

type ollamaModel struct {
	Name       string        `json:"name"`
	Model      string        `json:"model"`
	ModifiedAt string        `json:"modified_at"`
	Size       int64         `json:"size"`
	Digest     string        `json:"digest"`
	Details    ollamaDetails `json:"details"`
}

// ollamaDetails: what the swarm knows of a model is its name, fingerprint
// and layer count; family, size and quantization stay empty.
type ollamaDetails struct {
	ParentModel       string   `json:"parent_model"`
	Format            string   `json:"format"`
	Family            string   `json:"family"`
	Families          []string `json:"families"`
	ParameterSize     string   `json:"parameter_size"`
	QuantizationLevel string   `json:"quantization_level"`
}

func ollamaModified(m Model) string { return time.Unix(m.Created, 0).UTC().Format(time.RFC3339) }

func (s *Server) ollamaTags(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		writeOllamaError(w, methodNotAllowed(r, "GET"))
		return
	}
	ms, err := s.cfg.Backend.Models(r.Context())
	if err != nil {
		writeOllamaError(w, asError(err))
		return
	}
	list := struct {
		Models []ollamaModel `json:"models"`
	}{Models: []ollamaModel{}}
	for _, m := range ms {
		list.Models = append(list.Models, ollamaModel{Name: m.ID, Model: m.ID, ModifiedAt: ollamaModified(m),
			Digest: m.Fingerprint, Details: ollamaDetails{Format: "gguf"}})
	}
	writeJSON(w, http.StatusOK, list)
}

// parseOllamaShow validates an /api/show body: the model it names.
func parseOllamaShow(body []byte) (string, *Error) {
	o, e := bodyObject(body, "model", "name", "verbose")
	var id string
	if e == nil {
		switch {
		case o.has("model"):
			e = o.str("model", &id, true)
		case o.has("name"):
			e = o.str("name", &id, true)
		default:
			e = o.need("model")
		}
	}
	var v bool
	if e == nil {
		e = o.optBool("verbose", &v)
	}
	return id, e
}

func (s *Server) ollamaShow(w http.ResponseWriter, r *http.Request) {
	id, ok := readRequest(s, w, r, writeOllamaError, parseOllamaShow)
	if !ok {
		return
	}
	m, e := s.findModel(r, id)
	if e != nil {
		writeOllamaError(w, e)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"modelfile":  fmt.Sprintf("# served by the meshp2p swarm (fingerprint %s, %d layers)\nFROM %s\n", m.Fingerprint, m.NLayer, m.ID),
		"parameters": "",
		"template":   "",
		"details":    ollamaDetails{Format: "gguf"},
		"model_info": map[string]any{"general.name": m.Name, "meshp2p.fingerprint": m.Fingerprint, "meshp2p.n_layer": m.NLayer},
		// The swarm renders chats with the model's chat template, and
		// tool calls are grammar-constrained or parsed out of the text.
		"capabilities": []string{"completion", "tools"},
		"modified_at":  ollamaModified(m),
	})
}

func (s *Server) ollamaVersion(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		writeOllamaError(w, methodNotAllowed(r, "GET"))
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"version": s.cfg.OllamaVersion})
}

// ollamaUnsupported answers Ollama's model-management endpoints: the
// swarm's models are the peers' (GET /api/tags lists them).
func (s *Server) ollamaUnsupported(w http.ResponseWriter, r *http.Request) {
	writeOllamaError(w, newError(http.StatusNotImplemented, "invalid_request_error", "unsupported_endpoint", "",
		"%s is not supported: the swarm's peers serve the models (GET /api/tags lists them; docs/api.md lists the endpoints)", r.URL.Path))
}

// writeOllamaError writes e as Ollama's {"error": "…"} with e's status.
func writeOllamaError(w http.ResponseWriter, e *Error) {
	errorHeaders(w, e)
	writeJSON(w, e.Status, map[string]string{"error": messageNaming(e)})
}
