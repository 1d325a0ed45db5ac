package dashboard

import (
	"context"
	"encoding/json"
	"fmt"
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

// /api/status serves the demand and the node's choice between its models
// under the JSON names the page reads, and the page reads each of them
// (the browser test, TestDashboardShowsDemand, checks how they are drawn;
// this one needs no browser).
func TestStatusServesDemand(t *testing.T) {
	doc := &status.Document{Version: status.Version,
		Self: status.Self{Role: "node", Placement: &status.Placement{ModelReason: "no model lacks capacity"}},
		Demand: []status.ModelDemand{{Fingerprint: "0123456789abcdef0123", Name: "m", Requests: 1.5, Queued: 0.5, Refused: 0.25,
			TokensPerSec: 250, Offers: 2, State: "warming"}}}
	srv := httptest.NewServer(Handler(Options{Status: func(context.Context) *status.Document { return doc }}))
	defer srv.Close()
	r, err := http.Get(srv.URL + "/api/status")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	var got struct {
		Self struct {
			Placement map[string]any `json:"placement"`
		} `json:"self"`
		Demand []map[string]any `json:"demand"`
	}
	if err := json.NewDecoder(r.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"fingerprint": "0123456789abcdef0123", "name": "m", "requests_per_sec": 1.5, "queued_per_sec": 0.5,
		"refused_per_sec": 0.25, "tokens_per_sec": 250.0, "offers": 2.0, "state": "warming"}
	if len(got.Demand) != 1 || fmt.Sprint(got.Demand[0]) != fmt.Sprint(want) {
		t.Errorf("demand %v, want [%v]", got.Demand, want)
	}
	if got.Self.Placement["model_reason"] != "no model lacks capacity" {
		t.Errorf("self.placement %v: no model_reason", got.Self.Placement)
	}
	js, err := files.ReadFile("web/app.js")
	if err != nil {
		t.Fatal(err)
	}
	html, err := files.ReadFile("web/index.html")
	if err != nil {
		t.Fatal(err)
	}
	for k := range want {
		if !strings.Contains(string(js), "d."+k) {
			t.Errorf("app.js does not read demand's %q", k)
		}
	}
	for _, s := range []string{"doc.demand", "model_reason", "no demand reported yet"} {
		if !strings.Contains(string(js), s) {
			t.Errorf("app.js lacks %q", s)
		}
	}
	if !strings.Contains(string(html), `id="demand-list"`) {
		t.Error(`index.html has no id="demand-list"`)
	}
}
