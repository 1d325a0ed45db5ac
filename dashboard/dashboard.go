// Package dashboard serves a node's observability over HTTP from one
// handler: Prometheus metrics at /metrics, the status document at
// /api/status, and a web dashboard at / whose files are embedded in the
// binary (plain HTML, CSS and JavaScript; no CDN, no external requests;
// a self-only Content-Security-Policy). Register mounts the same routes
// on another mux (the API server's), whose /v1/chat/completions the
// dashboard's chat panel then streams from.
package dashboard

import (
	"context"
	"embed"
	"encoding/json"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/neuron-tai/meshp2p/status"
)

//go:embed web
var files embed.FS

// CSP allows the page to load its own files and talk to its own origin
// only.
const CSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// StatusTimeout bounds building one status document (its peer probes).
const StatusTimeout = 5 * time.Second

// Options are what the handler serves.
type Options struct {
	// Metrics serves /metrics (nil: not served).
	Metrics http.Handler
	// Status builds the document /api/status serves (nil: not served).
	Status func(ctx context.Context) *status.Document
	Logger *slog.Logger
}

// Handler returns a mux serving /metrics, /api/status and the dashboard.
func Handler(o Options) http.Handler {
	mux := http.NewServeMux()
	Register(mux, o)
	return mux
}

// Register adds the routes to mux: GET /metrics, GET /api/status,
// GET / (the dashboard) and GET /ui/ (its files).
func Register(mux *http.ServeMux, o Options) {
	if o.Metrics != nil {
		mux.Handle("GET /metrics", o.Metrics)
	}
	if o.Status != nil {
		mux.HandleFunc("GET /api/status", func(w http.ResponseWriter, r *http.Request) {
			ctx, cancel := context.WithTimeout(r.Context(), StatusTimeout)
			defer cancel()
			doc := o.Status(ctx)
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Cache-Control", "no-store")
			enc := json.NewEncoder(w)
			enc.SetIndent("", "  ")
			_ = enc.Encode(doc)
		})
	}
	web, _ := fs.Sub(files, "web")
	static := http.StripPrefix("/ui/", http.FileServerFS(web))
	mux.Handle("GET /ui/", secure(static))
	mux.Handle("GET /{$}", secure(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := fs.ReadFile(web, "index.html")
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-cache")
		_, _ = w.Write(b)
	})))
}

func secure(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", CSP)
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Referrer-Policy", "no-referrer")
		h.ServeHTTP(w, r)
	})
}

// Server is a running HTTP server for Handler.
type Server struct {
	srv *http.Server
	ln  net.Listener
}

// Listen serves h on addr (host:port; port 0 picks one) until Close.
func Listen(addr string, h http.Handler, log *slog.Logger) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	s := &Server{ln: ln, srv: &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		MaxHeaderBytes: 64 << 10, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops the server, giving open requests a moment to finish.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return s.srv.Shutdown(ctx)
}
