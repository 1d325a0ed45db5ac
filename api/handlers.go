package api

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// OpenAI response objects. finish_reason and logprobs are present as null
// where OpenAI sends null.

type usage struct {
	PromptTokens        int           `json:"prompt_tokens"`
	CompletionTokens    int           `json:"completion_tokens"`
	TotalTokens         int           `json:"total_tokens"`
	PromptTokensDetails promptDetails `json:"prompt_tokens_details"`
}

// promptDetails: cached_tokens are the prompt tokens the hops reused from
// their prefix caches (OpenAI's prompt caching field).
type promptDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

func usageOf(res *GenerateResult) *usage {
	return &usage{res.PromptTokens, res.CompletionTokens, res.PromptTokens + res.CompletionTokens, promptDetails{res.CachedTokens}}
}

// extension is meshp2p's own field on responses and chunks: the route and
// how often the generation re-routed around a failed hop.
type extension struct {
	Fingerprint string `json:"fingerprint,omitempty"`
	Reroutes    int    `json:"reroutes"`
	Route       []Hop  `json:"route,omitempty"`
	// Speculation (on the final chunk and non-streamed responses): the
	// mean proposals accepted per verification window and their counts.
	AcceptedPerWindow *float64  `json:"accepted_per_window,omitempty"`
	Speculation       *SpecInfo `json:"speculation,omitempty"`
}

// final is the extension of a finished generation.
func final(res *GenerateResult) *extension {
	ext := &extension{Fingerprint: res.Fingerprint, Reroutes: res.Reroutes, Route: res.Route}
	if sp := res.Speculation; sp != nil {
		apw := sp.AcceptedPerWindow
		ext.AcceptedPerWindow, ext.Speculation = &apw, sp
	}
	return ext
}

// chatMessage is a response message (Content null when it only calls
// tools) or a chunk's delta (Content omitted when it carries none).
type chatMessage struct {
	Role      string     `json:"role,omitempty"`
	Content   *string    `json:"content"`
	ToolCalls []toolCall `json:"tool_calls,omitempty"`
}

// MarshalJSON omits a delta's absent content, keeps a message's null.
func (m *chatMessage) MarshalJSON() ([]byte, error) {
	type plain chatMessage
	if m.Content == nil && m.Role == "" {
		return json.Marshal(struct {
			ToolCalls []toolCall `json:"tool_calls,omitempty"`
		}{m.ToolCalls})
	}
	return json.Marshal((*plain)(m))
}

type toolCall struct {
	Index    *int         `json:"index,omitempty"` // stream deltas only
	ID       string       `json:"id,omitempty"`
	Type     string       `json:"type,omitempty"`
	Function toolFunction `json:"function"`
}

type toolFunction struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"`
}

func toolCallsOut(calls []ToolCall) []toolCall {
	out := make([]toolCall, len(calls))
	for i, c := range calls {
		out[i] = toolCall{ID: c.ID, Type: "function", Function: toolFunction{Name: c.Name, Arguments: c.Arguments}}
	}
	return out
}

func toolCallDeltasOut(ds []ToolCallDelta) []toolCall {
	out := make([]toolCall, len(ds))
	for i, d := range ds {
		out[i] = toolCall{Index: &d.Index, ID: d.ID, Function: toolFunction{Name: d.Name, Arguments: d.Arguments}}
		if d.ID != "" {
			out[i].Type = "function"
		}
	}
	return out
}

type choice struct {
	Index        int          `json:"index"`
	Message      *chatMessage `json:"message,omitempty"`
	Delta        *chatMessage `json:"delta,omitempty"`
	Text         *string      `json:"text,omitempty"`
	Logprobs     any          `json:"logprobs"`
	FinishReason *string      `json:"finish_reason"`
}

type completion struct {
	ID                string     `json:"id"`
	Object            string     `json:"object"`
	Created           int64      `json:"created"`
	Model             string     `json:"model"`
	SystemFingerprint string     `json:"system_fingerprint,omitempty"`
	Choices           []choice   `json:"choices"`
	Usage             *usage     `json:"usage,omitempty"`
	Meshp2p           *extension `json:"meshp2p,omitempty"`
}

type modelObject struct {
	ID      string          `json:"id"`
	Object  string          `json:"object"`
	Created int64           `json:"created"`
	OwnedBy string          `json:"owned_by"`
	Meshp2p *modelExtension `json:"meshp2p,omitempty"`
}

type modelExtension struct {
	Name        string `json:"name"`
	Fingerprint string `json:"fingerprint"`
	NLayer      int    `json:"n_layer"`
	// State: "served" (a route covers it), "warmable" (standby peers,
	// Offers of them, load it when it is asked for) or "unavailable" (it
	// was served and has lost the layers MissingLayers: a request gets 503
	// with Retry-After until a peer serves them again).
	State         string `json:"state"`
	Offers        int    `json:"offers,omitempty"`
	MissingLayers string `json:"missing_layers,omitempty"`
}

func (s *Server) chat(w http.ResponseWriter, r *http.Request)        { s.openAI(w, r, parseChat) }
func (s *Server) completions(w http.ResponseWriter, r *http.Request) { s.openAI(w, r, parseCompletion) }

// openAI answers a chat or completion request (parse tells which) through
// the driver every shape shares (serveGen).
func (s *Server) openAI(w http.ResponseWriter, r *http.Request, parse func([]byte) (*request, *Error)) {
	req, ok := readRequest(s, w, r, writeError, parse)
	if !ok {
		return
	}
	base := completion{ID: "cmpl-", Object: "text_completion", Created: time.Now().Unix(), Model: req.gen.Model}
	if req.chat {
		base.ID, base.Object = "chatcmpl-", "chat.completion"
	}
	base.ID += randomID()
	s.serveGen(w, r, &req.gen, req.stream, shape{
		writeErr: writeError,
		respond:  func(u update) any { return req.respond(base, u) },
		stream: func(ew *eventWriter) streamer {
			c := base
			if req.chat {
				c.Object = "chat.completion.chunk"
			}
			return &openAIStream{ew: ew, req: req, c: c}
		},
	})
}

func (s *Server) models(w http.ResponseWriter, r *http.Request) {
	ms, err := s.cfg.Backend.Models(r.Context())
	if err != nil {
		writeError(w, asError(err))
		return
	}
	list := struct {
		Object string        `json:"object"`
		Data   []modelObject `json:"data"`
	}{Object: "list", Data: []modelObject{}}
	for _, m := range ms {
		list.Data = append(list.Data, toModelObject(m))
	}
	writeJSON(w, http.StatusOK, list)
}

// model answers GET /v1/models/{id}: the id as listed, the fingerprint or
// a unique fingerprint prefix of MinPrefix+ hex characters.
func (s *Server) model(w http.ResponseWriter, r *http.Request) {
	m, e := s.findModel(r, r.PathValue("id"))
	if e != nil {
		writeError(w, e)
		return
	}
	writeJSON(w, http.StatusOK, toModelObject(m))
}

// findModel finds the model id names (GET /v1/models/{id}, Ollama's
// /api/show and load requests): its listed id, its fingerprint or a unique
// fingerprint prefix of MinPrefix+ hex characters.
func (s *Server) findModel(r *http.Request, id string) (Model, *Error) {
	ms, err := s.cfg.Backend.Models(r.Context())
	if err != nil {
		return Model{}, asError(err)
	}
	var found []Model
	for _, m := range ms {
		if m.ID == id || m.Fingerprint == id || (len(id) >= MinPrefix && strings.HasPrefix(m.Fingerprint, id)) {
			found = append(found, m)
		}
	}
	if len(found) != 1 {
		return Model{}, ModelNotFound(id)
	}
	return found[0], nil
}

func toModelObject(m Model) modelObject {
	return modelObject{ID: m.ID, Object: "model", Created: m.Created, OwnedBy: "meshp2p",
		Meshp2p: &modelExtension{Name: m.Name, Fingerprint: m.Fingerprint, NLayer: m.NLayer, State: modelState(m), Offers: m.Offers,
			MissingLayers: missingLayers(m)}}
}

func modelState(m Model) string {
	switch {
	case m.Warmable:
		return "warmable"
	case m.Unavailable:
		return "unavailable"
	}
	return "served"
}

// missingLayers is an unavailable model's gap as half-open "A-B" ("" when
// it has none).
func missingLayers(m Model) string {
	if !m.Unavailable {
		return ""
	}
	return fmt.Sprintf("%d-%d", m.MissingStart, m.MissingEnd)
}

// MinPrefix is the shortest fingerprint prefix that names a model (as
// route.MinPrefix).
const MinPrefix = 16

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// respond is the whole (non-streamed) completion c of what u holds.
func (r *request) respond(c completion, u update) completion {
	res := u.Res
	fill(&c, res)
	fr := finish(res)
	ch := choice{FinishReason: &fr}
	if r.chat {
		msg := &chatMessage{Role: "assistant", Content: &u.Text}
		if len(res.ToolCalls) > 0 {
			msg.ToolCalls = toolCallsOut(res.ToolCalls)
			if u.Text == "" {
				msg.Content = nil
			}
		}
		ch.Message = msg
	} else {
		ch.Text = &u.Text
	}
	ch.Logprobs = logprobsOut(r, u.Logprobs, 0)
	c.Choices = []choice{ch}
	c.Usage = usageOf(res)
	return c
}

func fill(c *completion, res *GenerateResult) {
	if res.Model != "" {
		c.Model = res.Model
	}
	c.SystemFingerprint = res.Fingerprint
	c.Meshp2p = final(res)
}

// finish is OpenAI's finish_reason: length when max_tokens cut the turn
// (also inside a call), tool_calls when it made calls, else stop.
func finish(res *GenerateResult) string {
	switch {
	case res.Length:
		return "length"
	case len(res.ToolCalls) > 0:
		return "tool_calls"
	}
	return "stop"
}

// openAIStream writes a completion as OpenAI's server-sent events: (for
// chat) the role chunk once the first token arrived, then a chunk per
// update that carries something (its text, tool-call fragments and
// logprobs in one chunk: OpenAI's messages keep text and calls apart
// anyway), with the route when it changed (a chunk of its own when
// nothing else came with it), the finish_reason chunk, the usage chunk
// when asked, and data: [DONE].
type openAIStream struct {
	ew     *eventWriter
	req    *request
	c      completion // id, object, created, model of every chunk
	offset int        // the text's length so far (completions' text_offset)
}

// chunk is a chunk carrying text (a delta for chat), a finish reason and
// the meshp2p extension when set.
func (o *openAIStream) chunk(text string, fr *string, ext *extension) completion {
	k := o.c
	k.Meshp2p = ext
	if o.req.chat {
		k.Choices = []choice{{Delta: &chatMessage{Content: &text}, FinishReason: fr}}
	} else {
		k.Choices = []choice{{Text: &text, FinishReason: fr}}
	}
	return k
}

func (o *openAIStream) start(u update) bool {
	o.c.Model = modelOr(u.Route.Model, o.c.Model)
	o.c.SystemFingerprint = u.Route.Fingerprint
	o.ew.open("text/event-stream")
	if !o.req.chat {
		return true
	}
	k := o.chunk("", nil, nil)
	k.Choices[0].Delta.Role = "assistant"
	return o.ew.data(k)
}

func (o *openAIStream) delta(u update) bool {
	if u.Text == "" && len(u.ToolCalls) == 0 && len(u.Logprobs) == 0 && (!u.Rerouted || u.Done) {
		return true
	}
	var ext *extension
	if u.Rerouted {
		ext = &extension{Fingerprint: u.Route.Fingerprint, Reroutes: u.Route.Reroutes, Route: u.Route.Hops}
	}
	k := o.chunk(u.Text, nil, ext)
	if o.req.chat && len(u.ToolCalls) > 0 {
		k.Choices[0].Delta.ToolCalls = toolCallDeltasOut(u.ToolCalls)
		if u.Text == "" {
			k.Choices[0].Delta.Content = nil
		}
	}
	k.Choices[0].Logprobs = logprobsOut(o.req, u.Logprobs, o.offset)
	o.offset += len(u.Text)
	return o.ew.data(k)
}

func (o *openAIStream) finish(res *GenerateResult) {
	fr := finish(res)
	last := o.chunk("", &fr, final(res))
	if o.req.chat {
		last.Choices[0].Delta = &chatMessage{}
	}
	ok := o.ew.data(last)
	if ok && o.req.includeUsage {
		u := o.c
		u.Choices = []choice{}
		u.Usage = usageOf(res)
		u.Meshp2p = last.Meshp2p
		ok = o.ew.data(u)
	}
	if ok {
		o.ew.write([]byte("data: [DONE]\n\n"))
	}
}

func (o *openAIStream) fail(e *Error) { o.ew.data(map[string]*Error{"error": e}) }

func randomID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
