package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strconv"
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
	// State: "served" (a route covers it) or "warmable" (standby peers,
	// Offers of them, load it when it is asked for).
	State  string `json:"state"`
	Offers int    `json:"offers,omitempty"`
}

func (s *Server) chat(w http.ResponseWriter, r *http.Request) {
	if req, ok := readRequest(s, w, r, writeError, parseChat); ok {
		s.generate(w, r, req, true)
	}
}

func (s *Server) completions(w http.ResponseWriter, r *http.Request) {
	if req, ok := readRequest(s, w, r, writeError, parseCompletion); ok {
		s.generate(w, r, req, false)
	}
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
		Meshp2p: &modelExtension{Name: m.Name, Fingerprint: m.Fingerprint, NLayer: m.NLayer, State: modelState(m), Offers: m.Offers}}
}

func modelState(m Model) string {
	if m.Warmable {
		return "warmable"
	}
	return "served"
}

// MinPrefix is the shortest fingerprint prefix that names a model (as
// route.MinPrefix).
const MinPrefix = 16

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func (s *Server) generate(w http.ResponseWriter, r *http.Request, req *request, chat bool) {
	release, ok := s.admit(w, r, writeError)
	if !ok {
		return
	}
	defer release()
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	g := s.startRun(ctx, &req.gen)
	id, object := "cmpl-"+randomID(), "text_completion"
	if chat {
		id, object = "chatcmpl-"+randomID(), "chat.completion"
	}
	base := completion{ID: id, Object: object, Created: time.Now().Unix(), Model: req.gen.Model}
	var status int
	if req.stream {
		status = s.stream(ctx, cancel, w, g, req, chat, base)
	} else {
		status = s.respond(w, r, g, req, chat, base)
	}
	s.logRun(r, req.gen.Model, req.stream, status, g)
}

// respond writes a whole (non-streamed) completion.
func (s *Server) respond(w http.ResponseWriter, r *http.Request, g *run, req *request, chat bool, c completion) int {
	u := g.wait()
	if u.Err != nil {
		if r.Context().Err() != nil {
			return 0 // the client left
		}
		e := asError(u.Err)
		writeError(w, e)
		return e.Status
	}
	res := u.Res
	fill(&c, res)
	fr := finish(res)
	ch := choice{FinishReason: &fr}
	if chat {
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
	ch.Logprobs = logprobsOut(req, chat, u.Logprobs, 0)
	c.Choices = []choice{ch}
	c.Usage = usageOf(res)
	w.Header().Set("X-Meshp2p-Reroutes", strconv.Itoa(res.Reroutes))
	writeJSON(w, http.StatusOK, c)
	return http.StatusOK
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

// stream writes the generation as server-sent events: the headers and (for
// chat) the role chunk once the first token arrived, so that errors before
// it (unknown model, no route) still get their HTTP status; then a chunk
// per piece of final text; the finish_reason chunk; the usage chunk when
// asked; data: [DONE]. A failed write (the client left) cancels the
// generation, which frees every hop.
func (s *Server) stream(ctx context.Context, cancel context.CancelFunc, w http.ResponseWriter, g *run, req *request, chat bool, c completion) int {
	c.Object = map[bool]string{true: "chat.completion.chunk", false: "text_completion"}[chat]
	e := &sseWriter{w: w, rc: http.NewResponseController(w), c: c, chat: chat}
	started, offset := false, 0
	// routeNew: the route changed since a chunk last carried it (the first
	// route too); the next chunk carries it.
	routeNew := false
	for {
		u, ok := g.next(ctx)
		if !ok {
			return 0
		}
		routeNew = routeNew || u.Rerouted
		if u.Done && u.Err != nil {
			return e.fail(ctx, started, asError(u.Err))
		}
		if !started && (u.Tokens > 0 || u.Done) {
			started = true
			if !e.start(u.Route) {
				cancel()
				continue
			}
		}
		if !started {
			continue
		}
		if u.Text != "" || len(u.ToolCalls) > 0 || len(u.Logprobs) > 0 || (routeNew && !u.Done) {
			var ext *extension
			if routeNew {
				ext = &extension{Fingerprint: u.Route.Fingerprint, Reroutes: u.Route.Reroutes, Route: u.Route.Hops}
				routeNew = false
			}
			k := e.chunk(u.Text, nil, ext)
			if chat && len(u.ToolCalls) > 0 {
				k.Choices[0].Delta.ToolCalls = toolCallDeltasOut(u.ToolCalls)
				if u.Text == "" {
					k.Choices[0].Delta.Content = nil
				}
			}
			k.Choices[0].Logprobs = logprobsOut(req, chat, u.Logprobs, offset)
			offset += len(u.Text)
			if !e.send(k) {
				cancel()
				continue
			}
		}
		if u.Done {
			e.finish(u.Res, req.includeUsage)
			return http.StatusOK
		}
	}
}

// sseWriter writes one completion's server-sent events.
type sseWriter struct {
	w    http.ResponseWriter
	rc   *http.ResponseController
	c    completion // id, object, created, model of every chunk
	chat bool
}

// send writes one event; false when the client is gone.
func (e *sseWriter) send(v any) bool {
	b, err := json.Marshal(v)
	if err != nil {
		return false
	}
	_ = e.rc.SetWriteDeadline(time.Now().Add(WriteTimeout))
	if _, err := e.w.Write(append(append([]byte("data: "), b...), '\n', '\n')); err != nil {
		return false
	}
	return e.rc.Flush() == nil
}

// chunk is a chunk carrying text (a delta for chat), a finish reason and
// the meshp2p extension when set.
func (e *sseWriter) chunk(text string, fr *string, ext *extension) completion {
	k := e.c
	k.Meshp2p = ext
	if e.chat {
		k.Choices = []choice{{Delta: &chatMessage{Content: &text}, FinishReason: fr}}
	} else {
		k.Choices = []choice{{Text: &text, FinishReason: fr}}
	}
	return k
}

// start writes the headers and, for chat, the role chunk; false when the
// client is gone.
func (e *sseWriter) start(info RouteInfo) bool {
	if info.Model != "" {
		e.c.Model = info.Model
	}
	e.c.SystemFingerprint = info.Fingerprint
	h := e.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	e.w.WriteHeader(http.StatusOK)
	if !e.chat {
		return true
	}
	k := e.chunk("", nil, nil)
	k.Choices[0].Delta.Role = "assistant"
	return e.send(k)
}

// fail reports a failed generation: its status before the stream started,
// an error event after (the status is already 200); 0 when the client left.
func (e *sseWriter) fail(ctx context.Context, started bool, err *Error) int {
	if ctx.Err() != nil {
		return 0
	}
	if !started {
		writeError(e.w, err)
		return err.Status
	}
	e.send(map[string]*Error{"error": err})
	return http.StatusOK
}

// finish writes the finish_reason chunk, the usage chunk when asked, and
// data: [DONE].
func (e *sseWriter) finish(res *GenerateResult, includeUsage bool) {
	fr := finish(res)
	last := e.chunk("", &fr, final(res))
	if e.chat {
		last.Choices[0].Delta = &chatMessage{}
	}
	ok := e.send(last)
	if ok && includeUsage {
		u := e.c
		u.Choices = []choice{}
		u.Usage = usageOf(res)
		u.Meshp2p = last.Meshp2p
		ok = e.send(u)
	}
	if ok {
		_ = e.rc.SetWriteDeadline(time.Now().Add(WriteTimeout))
		_, _ = e.w.Write([]byte("data: [DONE]\n\n"))
		_ = e.rc.Flush()
	}
}

func randomID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
