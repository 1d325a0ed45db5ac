package api

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Config configures a Server.
type Config struct {
	Backend Backend
	// APIKey, if set, is required on every model endpoint of every API
	// shape (compared in constant time; the table at Server lists the
	// paths and headers).
	APIKey string
	// CORSOrigins lists the origins browsers may call from ("*": any);
	// empty: no CORS headers at all.
	CORSOrigins []string
	// MaxActive generations run at once, MaxQueue more wait for a slot;
	// beyond that a request gets 429 with Retry-After (0: the defaults;
	// MaxQueue < 0: no queue).
	MaxActive, MaxQueue int
	// MaxBody bounds a request body (0: DefaultMaxBody); larger: 413.
	MaxBody int64
	// MaxConns bounds open connections (0: DefaultMaxConns); further
	// ones wait in the kernel's accept queue.
	MaxConns int
	// OllamaVersion is what GET /api/version reports (""
	// DefaultOllamaVersion): Ollama clients compare it to enable features.
	OllamaVersion string
	Logger        *slog.Logger
}

// Server is the HTTP API. It is an http.Handler; Handle mounts extra
// handlers (status pages, metrics) beside the API, outside the API key.
//
// The paths the API owns, and what Config.APIKey requires on each (the
// key is compared as SHA-256 digests, in constant time; a missing or
// wrong key gets a 401 in the path's own error shape):
//
//	path                                  key in                                        401 body
//	/v1/messages, /v1/messages/…          x-api-key: KEY or Authorization: Bearer KEY   Anthropic's error object
//	/v1/… (chat/completions, completions,
//	  models, responses, unknown paths)   Authorization: Bearer KEY                     OpenAI's error object
//	/api/chat, /api/generate, /api/tags,
//	  /api/show, Ollama's model-management
//	  paths (pull, push, create, copy,
//	  delete, embed, embeddings: 501)     Authorization: Bearer KEY                     Ollama's {"error": …}
//	/api/version                          none (it reveals a version string only)       –
//	anything mounted with Handle          none (Handle refuses the paths above)         –
type Server struct {
	cfg     Config
	log     *slog.Logger
	mux     *http.ServeMux // everything
	v1      *http.ServeMux // /v1/, behind the key
	limit   *limiter
	keyHash [32]byte
}

// New returns a server for cfg.
func New(cfg Config) *Server {
	if cfg.MaxActive <= 0 {
		cfg.MaxActive = DefaultMaxActive
	}
	if cfg.MaxQueue == 0 {
		cfg.MaxQueue = DefaultMaxQueue
	}
	cfg.MaxQueue = max(cfg.MaxQueue, 0)
	if cfg.MaxBody <= 0 {
		cfg.MaxBody = DefaultMaxBody
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.OllamaVersion == "" {
		cfg.OllamaVersion = DefaultOllamaVersion
	}
	s := &Server{cfg: cfg, log: cfg.Logger, mux: http.NewServeMux(), v1: http.NewServeMux(),
		limit: newLimiter(cfg.MaxActive, cfg.MaxQueue), keyHash: sha256.Sum256([]byte(cfg.APIKey))}
	s.v1.HandleFunc("POST /v1/chat/completions", s.chat)
	s.v1.HandleFunc("POST /v1/completions", s.completions)
	s.v1.HandleFunc("GET /v1/models", s.models)
	s.v1.HandleFunc("GET /v1/models/{id}", s.model)
	s.v1.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, newError(http.StatusNotFound, "invalid_request_error", "unknown_url", "",
			"unknown endpoint %s %s (docs/api.md lists the endpoints)", r.Method, r.URL.Path))
	})
	s.v1.HandleFunc("POST /v1/responses", s.responses)
	s.mux.Handle("/v1/", s.auth(s.v1, writeError, false))
	// Anthropic's Messages API: its own error shape, and x-api-key.
	s.mux.Handle("/v1/messages", s.auth(http.HandlerFunc(s.anthropicMessages), writeAnthropicError, true))
	s.mux.Handle("/v1/messages/", s.auth(http.HandlerFunc(s.anthropicNotFound), writeAnthropicError, true))
	// Ollama's API: exact paths, so that other /api/… paths (the node's
	// /api/status) stay mountable.
	for path, h := range map[string]http.HandlerFunc{"/api/chat": s.ollamaChat, "/api/generate": s.ollamaGenerate,
		"/api/tags": s.ollamaTags, "/api/show": s.ollamaShow} {
		s.mux.Handle(path, s.auth(h, writeOllamaError, false))
	}
	for _, path := range ollamaUnsupportedPaths {
		s.mux.Handle(path, s.auth(http.HandlerFunc(s.ollamaUnsupported), writeOllamaError, false))
	}
	s.mux.HandleFunc("/api/version", s.ollamaVersion)
	return s
}

// ollamaUnsupportedPaths are Ollama's model-management endpoints, answered
// with a 501 in Ollama's error shape.
var ollamaUnsupportedPaths = []string{"/api/pull", "/api/push", "/api/create", "/api/copy", "/api/delete",
	"/api/embed", "/api/embeddings"}

// apiOwned reports whether path (a ServeMux pattern's path) is one the
// API serves (the table at Server).
func apiOwned(path string) bool {
	if path == "/v1" || strings.HasPrefix(path, "/v1/") {
		return true
	}
	switch strings.TrimSuffix(path, "/") {
	case "/api/chat", "/api/generate", "/api/tags", "/api/show", "/api/version":
		return true
	}
	for _, p := range ollamaUnsupportedPaths {
		if strings.TrimSuffix(path, "/") == p {
			return true
		}
	}
	return false
}

// Handle mounts h at pattern (http.ServeMux syntax) beside the API. Such
// handlers are not behind the API key; patterns for the API's own paths
// (/v1/…, Ollama's /api/chat, /api/generate, /api/tags, /api/show,
// /api/version and model-management paths) are refused. Other /api/…
// paths (e.g. /api/status) and "/" may be mounted.
func (s *Server) Handle(pattern string, h http.Handler) {
	p := pattern[strings.IndexByte(pattern, ' ')+1:]
	if i := strings.IndexByte(p, '/'); i > 0 {
		p = p[i:] // after a host
	}
	if apiOwned(p) {
		panic("api: Handle: " + p + " belongs to the API")
	}
	s.mux.Handle(pattern, h)
}

// ServeHTTP routes a request, adding CORS headers when configured.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.cors(w, r) {
		return
	}
	s.mux.ServeHTTP(w, r)
}

// Serve serves on ln until ctx ends, then shuts down (in-flight
// generations are cancelled).
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	hs := &http.Server{Handler: s, ReadHeaderTimeout: HeaderReadTimeout, IdleTimeout: IdleTimeout,
		MaxHeaderBytes: 64 << 10, ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
		BaseContext: func(net.Listener) context.Context { return ctx }}
	stop := context.AfterFunc(ctx, func() {
		sctx, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
		defer cancel()
		_ = hs.Shutdown(sctx)
		_ = hs.Close() // connections still open after the grace period
	})
	defer stop()
	err := hs.Serve(&limitListener{Listener: ln, slots: make(chan struct{}, s.cfg.MaxConns)})
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// auth requires the API key when one is set, as "Authorization: Bearer
// <key>" or, with xAPIKey (Anthropic's header), "x-api-key: <key>";
// write answers a missing or wrong key in the path's error shape. The
// comparison is between SHA-256 digests, in constant time, so neither the
// key's bytes nor its length leak through timing.
func (s *Server) auth(next http.Handler, write func(http.ResponseWriter, *Error), xAPIKey bool) http.Handler {
	if s.cfg.APIKey == "" {
		return next
	}
	unauthorized := errUnauthorized
	if xAPIKey {
		unauthorized = errUnauthorizedAnthropic
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		bearer, isBearer := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		ok := s.keyMatches(bearer, isBearer)
		if xAPIKey {
			k := r.Header.Get("X-Api-Key")
			okKey := s.keyMatches(k, k != "")
			ok = ok || okKey
		}
		if !ok {
			write(w, unauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// keyMatches reports whether got (present: the header carried it) is the
// API key, comparing digests in constant time.
func (s *Server) keyMatches(got string, present bool) bool {
	h := sha256.Sum256([]byte(got))
	return subtle.ConstantTimeCompare(h[:], s.keyHash[:]) == 1 && present
}

// cors adds the CORS headers for an allowed origin and answers preflight
// requests; it reports whether the request was answered.
func (s *Server) cors(w http.ResponseWriter, r *http.Request) bool {
	origin := r.Header.Get("Origin")
	if len(s.cfg.CORSOrigins) == 0 || origin == "" {
		return false
	}
	allowed := ""
	for _, o := range s.cfg.CORSOrigins {
		if o == "*" || o == origin {
			allowed = o
		}
	}
	if allowed == "" {
		return false
	}
	h := w.Header()
	h.Set("Access-Control-Allow-Origin", allowed)
	h.Add("Vary", "Origin")
	if r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
		h.Set("Access-Control-Allow-Methods", "GET, POST, OPTIONS")
		h.Set("Access-Control-Allow-Headers", corsHeaders(r.Header.Get("Access-Control-Request-Headers")))
		h.Add("Vary", "Access-Control-Request-Headers")
		h.Set("Access-Control-Max-Age", "600")
		w.WriteHeader(http.StatusNoContent)
		return true
	}
	return false
}

// corsAllowed are the request headers browsers may send: the API key's
// (Authorization, Anthropic's x-api-key) and the headers the Anthropic
// SDK sends (anthropic-version, anthropic-beta, and in a browser
// anthropic-dangerous-direct-browser-access).
const corsAllowed = "Authorization, Content-Type, X-Api-Key, Anthropic-Version, Anthropic-Beta, Anthropic-Dangerous-Direct-Browser-Access"

// corsHeaders is Access-Control-Allow-Headers for a preflight that asks
// for requested: corsAllowed, plus the X-Stainless-* headers the OpenAI
// and Anthropic SDKs add (their platform and retry reports) when asked for
// (16 at most).
func corsHeaders(requested string) string {
	out, n := corsAllowed, 0
	for _, h := range strings.Split(requested, ",") {
		h = strings.ToLower(strings.TrimSpace(h))
		if rest, ok := strings.CutPrefix(h, "x-stainless-"); ok && rest != "" && n < 16 &&
			strings.Trim(rest, "abcdefghijklmnopqrstuvwxyz0123456789-") == "" {
			out += ", " + h
			n++
		}
	}
	return out
}

// readBody reads a bounded body (413 beyond MaxBody).
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *Error) {
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(BodyReadTimeout))
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBody))
	_ = rc.SetReadDeadline(time.Time{})
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return nil, errTooLarge(s.cfg.MaxBody)
	case err != nil:
		return nil, BadRequest("", "reading the request body: %v", err)
	}
	return b, nil
}

// limiter bounds generations: active ones run, up to queue more wait.
type limiter struct {
	slots chan struct{}
	queue chan struct{}
}

func newLimiter(active, queue int) *limiter {
	return &limiter{slots: make(chan struct{}, active), queue: make(chan struct{}, queue)}
}

// acquire takes a slot, waiting in the queue if there is room; it returns
// errBusy when the queue is full too, ctx's error when the client left.
func (l *limiter) acquire(ctx context.Context) (release func(), err error) {
	release = func() { <-l.slots }
	select {
	case l.slots <- struct{}{}:
		return release, nil
	default:
	}
	select {
	case l.queue <- struct{}{}:
	default:
		return nil, errBusy
	}
	defer func() { <-l.queue }()
	select {
	case l.slots <- struct{}{}:
		return release, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// limitListener holds at most cap(slots) connections open at once.
type limitListener struct {
	net.Listener
	slots chan struct{}
}

func (l *limitListener) Accept() (net.Conn, error) {
	l.slots <- struct{}{}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	return &limitConn{Conn: c, release: func() { <-l.slots }}, nil
}

type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
