package api

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// The chat parser's edge cases: null content and text count as empty,
// blank arguments as {}, max_tokens wins over max_completion_tokens, a
// float n of 1 passes, stream options other than include_usage only when
// false; Ollama's tool_choice goes through the same parser.
func TestOpenAIFieldEdges(t *testing.T) {
	b := &scripted{pieces: []string{"ok"}}
	s := New(Config{Backend: b})
	w := post(t, s, "/v1/chat/completions", `{"model":"tiny","messages":[{"role":"user","content":[{"type":"text","text":null}]},
		{"role":"assistant","tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":" "}}]},
		{"role":"tool","tool_call_id":"c1","content":null}],
		"max_completion_tokens":9,"max_tokens":7,"n":1.0,"stream":true,"stream_options":{"include_usage":false,"include_obfuscation":false}}`)
	if w.Code != http.StatusOK || !strings.HasSuffix(w.Body.String(), "data: [DONE]\n\n") {
		t.Fatalf("status %d: %s", w.Code, w.Body.String())
	}
	g := b.seen.Load()
	want := []Message{{Role: "user"}, {Role: "assistant", ToolCalls: []ToolCall{{ID: "c1", Name: "f", Arguments: "{}"}}},
		{Role: "tool", ToolCallID: "c1"}}
	if fmt.Sprint(g.Messages) != fmt.Sprint(want) || g.MaxTokens != 7 {
		t.Fatalf("backend saw %+v", g)
	}
	for _, c := range []struct{ body, param string }{
		{`{"model":"tiny","messages":[{"role":"user"}]}`, "messages[0].content"},
		{`{"model":"tiny","messages":[{"role":"user","content":[{"type":"text"}]}]}`, "messages[0].content[0].text"},
		{`{"model":"tiny","messages":[{"role":"user","content":"x"}],"stream":true,"stream_options":{"include_obfuscation":true}}`,
			"stream_options.include_obfuscation"},
	} {
		if w := post(t, s, "/v1/chat/completions", c.body); w.Code != 400 || decodeErr(t, w).Error.Param != c.param {
			t.Fatalf("%s: %d %s, want a 400 naming %s", c.body, w.Code, w.Body.String(), c.param)
		}
	}
	// standby: true asks, false refuses the one a long prompt gets,
	// absent (or null) leaves it to the prompt's length.
	for _, c := range []struct {
		field       string
		yes, refuse bool
	}{{``, false, false}, {`,"standby":null`, false, false}, {`,"standby":true`, true, false}, {`,"standby":false`, false, true}} {
		w := post(t, s, "/v1/chat/completions", `{"model":"tiny","messages":[{"role":"user","content":"x"}]`+c.field+`}`)
		if g := b.seen.Load(); w.Code != 200 || g.Standby != c.yes || g.NoStandby != c.refuse {
			t.Fatalf("%q: %d, standby %v, no standby %v", c.field, w.Code, g.Standby, g.NoStandby)
		}
	}
	w = post(t, s, "/api/chat", `{"model":"tiny","stream":false,"messages":[{"role":"user","content":"hi"}],
		"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"f"}}}`)
	if g := b.seen.Load(); w.Code != 200 || g.ToolChoice != (ToolChoice{Mode: ToolFunction, Name: "f"}) {
		t.Fatalf("ollama tool_choice: %d %+v", w.Code, g.ToolChoice)
	}
}

// rerouting produces "a" on route p1, re-routes to p2 once the client
// has read "a" (cont[0]), and produces "b" once it has read the route
// change (cont[1]).
type rerouting struct {
	scripted
	cont [2]chan struct{}
}

func (b *rerouting) Generate(ctx context.Context, req *GenerateRequest, onDelta func(Delta)) (*GenerateResult, error) {
	route := func(peer string, reroutes int) {
		req.OnRoute(RouteInfo{Model: "tiny", Fingerprint: "fp", Hops: []Hop{{Peer: peer, End: 5}}, Reroutes: reroutes})
	}
	wait := func(c chan struct{}) error {
		select {
		case <-c:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	route("p1", 0)
	onDelta(Delta{Text: "a"})
	if err := wait(b.cont[0]); err != nil {
		return nil, err
	}
	route("p2", 1)
	if err := wait(b.cont[1]); err != nil {
		return nil, err
	}
	onDelta(Delta{Text: "b"})
	return &GenerateResult{Model: "tiny", Fingerprint: "fp", PromptTokens: 1, CompletionTokens: 2, Reroutes: 1, Route: []Hop{{Peer: "p2", End: 5}}}, nil
}

// An OpenAI stream carries the route on the first chunk after it changed:
// the first content chunk, then a chunk of its own when the generation
// re-routes between tokens; the chunks between carry none.
func TestOpenAIStreamReroute(t *testing.T) {
	b := &rerouting{cont: [2]chan struct{}{make(chan struct{}), make(chan struct{})}}
	srv := httptest.NewServer(New(Config{Backend: b}))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"tiny","messages":[{"role":"user","content":"hi"}],"stream":true}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	var got []string // per chunk: its content and the route it carries
	for sc.Scan() {
		d, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || d == "[DONE]" {
			continue
		}
		var k struct {
			Choices []struct {
				Delta        struct{ Content string }
				FinishReason *string `json:"finish_reason"`
			}
			Meshp2p *extension
		}
		if err := json.Unmarshal([]byte(d), &k); err != nil {
			t.Fatalf("chunk %q: %v", d, err)
		}
		if k.Choices[0].FinishReason != nil {
			break
		}
		c := k.Choices[0].Delta.Content
		if k.Meshp2p != nil {
			c += fmt.Sprintf("@%s/%d", k.Meshp2p.Route[0].Peer, k.Meshp2p.Reroutes)
		}
		got = append(got, c)
		switch len(got) {
		case 2:
			close(b.cont[0])
		case 3:
			close(b.cont[1])
		}
	}
	if strings.Join(got, ",") != ",a@p1/0,@p2/1,b" {
		t.Fatalf("chunks %q, want the role chunk, a on p1, the re-route to p2 alone, then b", got)
	}
}
