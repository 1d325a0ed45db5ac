package dashboard

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/neuron-tai/meshp2p/metrics"
	"github.com/neuron-tai/meshp2p/status"
)

// The routes mount on another server's mux (the API server's) next to
// its own, with the CSP on the page and its files, and nothing the page
// loads comes from another origin.
func TestRegisterOnAnotherMux(t *testing.T) {
	m := metrics.New()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, `{"data":[]}`) })
	Register(mux, Options{Metrics: m.Handler(), Status: func(context.Context) *status.Document {
		return &status.Document{Version: status.Version, Self: status.Self{Role: "node"}}
	}})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	get := func(path string) (*http.Response, string) {
		r, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Body.Close()
		b, _ := io.ReadAll(r.Body)
		return r, string(b)
	}
	for _, p := range []string{"/", "/ui/app.js", "/ui/app.css"} {
		r, body := get(p)
		if r.StatusCode != 200 || r.Header.Get("Content-Security-Policy") != CSP || len(body) == 0 {
			t.Errorf("GET %s: %d, CSP %q", p, r.StatusCode, r.Header.Get("Content-Security-Policy"))
		}
		for _, bad := range []string{"http://", "https://", "//cdn", "innerHTML", "eval("} {
			if strings.Contains(body, bad) {
				t.Errorf("%s contains %q", p, bad)
			}
		}
	}
	if r, _ := get("/v1/models"); r.StatusCode != 200 {
		t.Errorf("the other mux's route is gone: %d", r.StatusCode)
	}
	if r, _ := get("/nothing"); r.StatusCode != 404 {
		t.Errorf("GET /nothing: %d", r.StatusCode)
	}
	r, body := get("/api/status")
	var doc status.Document
	if r.StatusCode != 200 || r.Header.Get("Content-Type") != "application/json" || json.Unmarshal([]byte(body), &doc) != nil || doc.Self.Role != "node" {
		t.Errorf("GET /api/status: %d %q", r.StatusCode, body)
	}
	if r, body := get("/metrics"); r.StatusCode != 200 || !strings.Contains(body, "go_goroutines") {
		t.Errorf("GET /metrics: %d", r.StatusCode)
	}
}
