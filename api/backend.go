// Package api serves an OpenAI-compatible HTTP API (chat completions,
// completions, models) in front of a Backend that runs generations, so
// any OpenAI client can talk to the swarm. It holds the HTTP side only:
// request validation, text assembly (UTF-8 and stop strings across token
// boundaries), SSE framing, auth, CORS and bounded concurrency. It has no
// cgo and never imports the engine or the node: Swarm implements Backend
// over a client.Client (the origin side, shared with `meshp2p generate`),
// and OpenAI error objects are built only here; see docs/api.md.
package api

import "context"

// Backend runs generations for the API. Swarm implements it over the
// swarm.
type Backend interface {
	// Models lists every model that can be routed now.
	Models(ctx context.Context) ([]Model, error)
	// Generate runs req. After every generated token it calls onText with
	// the text that became final ("" when none did: never inside a UTF-8
	// character, never a possible start of a stop string, never a stop
	// string; client.Stream), and the rest before it returns. It ends the
	// text at the first of req.Stops. Errors should be *Error
	// (ModelNotFound, Unavailable, BadRequest) where the client can act on
	// them.
	Generate(ctx context.Context, req *GenerateRequest, onText func(delta string)) (*GenerateResult, error)
}

// Model is one model the backend can route.
type Model struct {
	ID          string // what clients pass as "model" (the name, or the fingerprint when names clash)
	Name        string
	Fingerprint string
	NLayer      int
	Created     int64 // unix seconds; stable for the backend's life
}

// Message is one chat turn after validation (roles system, user,
// assistant; text content).
type Message struct {
	Role    string
	Content string
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
	// Stops end the text at the first of them (the stop string is not
	// returned).
	Stops []string
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
	// Length is true when the generation stopped at MaxTokens (else it
	// ended on an end-of-generation token or a stop string).
	Length   bool
	Reroutes int
	Route    []Hop
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
