package api

import "time"

// Every default and bound of the API, each with its reason (docs/api.md
// and docs/limits.md list them for users).

// Defaults of Config.
const (
	DefaultMaxActive = 8       // generations running at once
	DefaultMaxQueue  = 64      // generations waiting for a slot
	DefaultMaxBody   = 1 << 20 // request body bytes
	DefaultMaxConns  = 512     // open HTTP connections
	// BodyReadTimeout bounds reading a request's body (the headers have
	// HeaderReadTimeout), so a client trickling bytes cannot hold a
	// connection.
	BodyReadTimeout   = 30 * time.Second
	HeaderReadTimeout = 10 * time.Second
	// IdleTimeout closes a kept-alive connection nobody uses.
	IdleTimeout = 2 * time.Minute
	// ShutdownTimeout is how long Serve waits for requests in flight when
	// its context ends.
	ShutdownTimeout = 5 * time.Second
	// WriteTimeout bounds each write of a response or SSE event: a client
	// that stops reading is dropped and its generation cancelled, which
	// frees every hop.
	WriteTimeout = 30 * time.Second
	// DefaultChatMaxTokens is a chat completion's length when the request
	// gives no max_tokens (`serve --api-max-tokens`).
	DefaultChatMaxTokens = 512
	// UnavailableRetry is the Retry-After of a 503 for a model with a
	// missing layer range: long enough for a restarted node to load and
	// re-advertise a small shard or a self-placing node to move, short
	// enough that a client does not miss the model's return by much.
	UnavailableRetry = 10 * time.Second
)

// Request limits (docs/api.md).
const (
	MaxStops       = 4     // stop strings per request (OpenAI's limit)
	MaxStopBytes   = 256   // bytes per stop string
	MaxMessages    = 1024  // chat turns per request
	MaxTokensLimit = 65536 // the largest max_tokens accepted
	// DefaultCompletionMaxTokens is /v1/completions' max_tokens when none
	// is given (OpenAI's default, 16).
	DefaultCompletionMaxTokens = 16
	// MaxTopK bounds the top_k extension (a vocabulary's size at most).
	MaxTopK = 1 << 20
)

// Limits of tools, schemas and log-probabilities (docs/api.md,
// docs/limits.md). A grammar's size is bounded again where it is compiled
// (session.MaxGrammarBytes) and its cost per token at the tail.
const (
	MaxTools          = 128      // functions per request
	MaxToolNameBytes  = 64       // OpenAI's: [a-zA-Z0-9_-]{1,64}
	MaxSchemaBytes    = 64 << 10 // one JSON schema (tool parameters or response_format), as JSON
	MaxToolsBytes     = 256 << 10
	MaxTopLogprobs    = 20 // OpenAI's bound for top_logprobs
	MaxToolCallsTurn  = 16 // calls parsed out of one assistant turn
	MaxSchemaDepth    = 32 // nesting of a JSON schema
	MaxToolCallIDSize = 128
)

// DefaultOllamaVersion is what GET /api/version reports by default
// (Config.OllamaVersion): the Ollama release whose API the /api/
// endpoints follow (github.com/ollama/ollama in go.mod). Ollama clients
// compare it to enable features (tools, structured outputs).
const DefaultOllamaVersion = "0.17.4"
