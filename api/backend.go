// Package api serves the swarm over HTTP in the shapes clients speak —
// OpenAI chat completions, completions, models and Responses, Anthropic
// Messages, Ollama's /api/ — in front of one Backend that runs
// generations, so any of those clients can talk to the swarm. It holds the
// HTTP side only: request validation, SSE framing, auth, CORS and bounded
// concurrency; text assembly (UTF-8 and stop strings across token
// boundaries) is the client's (client.Stream), under the Backend. Every
// shape takes the same path (shapes.go): its body is parsed field by field
// into a GenerateRequest (jobj, parseAll: errors name the field at fault),
// checked by checkGen, run by serveGen and answered whole or streamed by
// one driver (drive) through the shape's streamer; a file per shape holds
// only what is its own. Messages, tool calls, log-probabilities and models
// are client's types. It has no cgo and never imports the engine or the
// node: Swarm implements Backend over a client.Client (the origin side,
// shared with `meshp2p generate`), and OpenAI error objects are built only
// here; see docs/api.md.
package api

import (
	"context"
	"encoding/json"

	"github.com/neuron-tai/meshp2p/client"
)

// Backend runs generations for the API. Swarm implements it over the
// swarm.
type Backend interface {
	// Models lists every model that can be routed now.
	Models(ctx context.Context) ([]Model, error)
	// Generate runs req. After every generated token it calls onDelta
	// with what became final: text ("" when none did: never inside a
	// UTF-8 character, never a possible start of a stop string, never a
	// stop string; client.Stream), tool-call fragments (when req.Tools
	// are in play, text that turned out to be a tool call is reported as
	// ToolCalls, never as Text) and the token's log-probabilities (with
	// req.Logprobs); the rest before it returns. It ends the text at the
	// first of req.Stops. Errors should be *Error (ModelNotFound,
	// Unavailable, BadRequest) where the client can act on them.
	Generate(ctx context.Context, req *GenerateRequest, onDelta func(Delta)) (*GenerateResult, error)
}

// The types the API shares with the client (one translation, into
// session, happens there): a model the backend can route (ID is what
// clients pass as "model": the name, or the fingerprint when names clash;
// Warmable: nobody serves it now, Offers standby peers offer to load it
// when asked, and a request meanwhile gets 503 model_warming with
// Retry-After), a chat turn after validation (roles system, user,
// assistant with text and/or ToolCalls, tool: the result of the call
// ToolCallID, as Content), a function call (id, name, arguments as JSON
// object text), a streamed fragment of one (the first carries ID and Name,
// the rest pieces of Arguments, as OpenAI streams them), and a token's
// log-probabilities (computed at the tail from the logits that chose it,
// before any sampling filter; with GenerateRequest.TopLogprobs > 0 the
// most likely alternatives, most likely first).
type (
	Model         = client.Model
	Message       = client.Message
	ToolCall      = client.ToolCall
	ToolCallDelta = client.ToolCallDelta
	TokenLogprob  = client.TokenLogprob
	TopLogprob    = client.TopLogprob
)

// Tool is a function the model may call (client.Tool: name, description
// and Parameters, its JSON schema: an object schema; nil: any object).
type Tool struct {
	client.Tool
	// Strict asks for the arguments to be constrained by Parameters even
	// when the call is not forced (it always is with ToolChoice required
	// or a named function).
	Strict bool
}

// Tool choice modes (ToolChoice.Mode).
const (
	ToolAuto     = client.ToolAuto     // the model decides (the default with tools)
	ToolNone     = client.ToolNone     // no calls: tools only inform the prompt
	ToolRequired = client.ToolRequired // at least one call, grammar-constrained
	ToolFunction = client.ToolFunction // a call of ToolChoice.Name, grammar-constrained
)

// ToolChoice says whether and which tools the model must call.
type ToolChoice struct {
	Mode string // ToolAuto ("" counts as auto), ToolNone, ToolRequired, ToolFunction
	Name string // ToolFunction: the function
}

// Response formats (ResponseFormat.Type).
const (
	FormatText       = "text"        // free text (the default)
	FormatJSONObject = "json_object" // any JSON object, grammar-constrained
	FormatJSONSchema = "json_schema" // JSON valid against Schema, grammar-constrained
)

// ResponseFormat constrains the output text.
type ResponseFormat struct {
	Type   string // FormatText ("" counts as text), FormatJSONObject, FormatJSONSchema
	Name   string
	Schema json.RawMessage // FormatJSONSchema
	Strict bool
}

// Delta is what became final after one token (Backend.Generate).
type Delta struct {
	Text      string
	ToolCalls []ToolCallDelta
	// Logprobs are the log-probabilities of the tokens generated since
	// the last delta (with GenerateRequest.Logprobs).
	Logprobs []TokenLogprob
}

// GenerateRequest is a validated generation.
type GenerateRequest struct {
	Model    string    // as the client gave it: name, fingerprint or a 16+ hex prefix
	Messages []Message // chat: rendered with the model's chat template
	Prompt   string    // completions: tokenized as is
	// MaxTokens is the most tokens to generate (0: the backend's default).
	MaxTokens        int
	Temperature      float32 // 0: greedy
	TopP             float32 // 1: off
	PresencePenalty  float32
	FrequencyPenalty float32
	Seed             uint64
	// Extensions (llama.cpp server's names): top_k (0: off), min_p (0:
	// off), repeat_penalty (1: off, over the last 64 tokens).
	TopK          int
	MinP          float32
	RepeatPenalty float32
	// Standby (extension) asks for a hot standby of one hop of the route:
	// a failure of that hop then costs no prefill (long prompts get one
	// anyway, unless the request says "standby": false: NoStandby;
	// session.GenerateRequest).
	Standby, NoStandby bool
	// Stops end the text at the first of them (the stop string is not
	// returned).
	Stops []string
	// Tools the model may call, and whether it must (Tools empty: no
	// tool calls). ParallelToolCalls lets it make several calls in one
	// turn.
	Tools             []Tool
	ToolChoice        ToolChoice
	ParallelToolCalls bool
	// Format constrains the text (JSON object, JSON schema) by a grammar.
	Format ResponseFormat
	// Logprobs asks for each token's log-probability, TopLogprobs (0 to
	// MaxTopLogprobs) for that many alternatives per token.
	Logprobs    bool
	TopLogprobs int
	// OnRoute, if set, is called with each route the generation runs on:
	// the first, then one per re-route.
	OnRoute func(RouteInfo)
}

// RouteInfo describes the route a generation runs on now.
type RouteInfo struct {
	Model       string // the model's id (Model.ID)
	Fingerprint string
	Hops        []Hop
	Reroutes    int // re-routes so far
}

// Hop is one hop of a route, as the API reports it.
type Hop struct {
	Peer  string `json:"peer"`
	Start int    `json:"start"`
	End   int    `json:"end"`
}

// GenerateResult is what a finished generation reports.
type GenerateResult struct {
	Model            string // the model's id (Model.ID)
	Fingerprint      string
	PromptTokens     int
	CompletionTokens int
	// CachedTokens are the prompt tokens the swarm's hops reused from
	// their prefix caches (usage's cached_tokens, cache_read_input_tokens).
	CachedTokens int
	// Length is true when the generation stopped at MaxTokens (else it
	// ended on an end-of-generation token or a stop string).
	Length bool
	// Stop is the stop string that ended the text ("" when none did).
	Stop string
	// ToolCalls are the calls the model made (its whole text was calls,
	// or ended in them: finish_reason tool_calls).
	ToolCalls []ToolCall
	Reroutes  int
	Route     []Hop
	// Speculation is what speculative decoding did (nil: it was off).
	Speculation *SpecInfo
}

// SpecInfo counts a generation's speculative decoding: verification
// windows, proposals verified and accepted, their mean per window, and the
// most proposals one window carried (K) and windows in flight at once (W).
type SpecInfo struct {
	Mode              string  `json:"mode"`
	Proposer          string  `json:"proposer"`
	Windows           int     `json:"windows"`
	Proposed          int     `json:"proposed"`
	Accepted          int     `json:"accepted"`
	AcceptedPerWindow float64 `json:"accepted_per_window"`
	K                 int     `json:"k"`
	W                 int     `json:"w"`
}
