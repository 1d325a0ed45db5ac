package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/neuron-tai/meshp2p/internal/testbin"
	"github.com/neuron-tai/meshp2p/internal/testmodels/chatmodel"
	"github.com/neuron-tai/meshp2p/p2p"
)

// cliProc is a meshp2p process this test started (stopped by its PID).
type cliProc struct {
	cmd      *exec.Cmd
	out, log *syncBuf
	peerID   string
	addr     string
}

func launch(t *testing.T, bin string, args ...string) *cliProc {
	t.Helper()
	p := &cliProc{cmd: exec.Command(bin, args...), out: &syncBuf{}, log: &syncBuf{}}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill() // by PID; a no-op for one already killed
		_ = p.cmd.Wait()
	})
	return p
}

// startCLI runs `meshp2p start` and waits for its node.json.
func startCLI(t *testing.T, bin, dir string, args ...string) *cliProc {
	t.Helper()
	return startCLIAs(t, bin, "start", dir, args...)
}

// startCLIAs runs `meshp2p <cmd>` (start or tracker) and waits for its
// node.json.
func startCLIAs(t *testing.T, bin, cmd, dir string, args ...string) *cliProc {
	t.Helper()
	p := launch(t, bin, append([]string{cmd, "--data-dir", dir}, args...)...)
	var info struct {
		PeerID string   `json:"peer_id"`
		Addrs  []string `json:"addrs"`
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if b, err := os.ReadFile(filepath.Join(dir, "node.json")); err == nil && json.Unmarshal(b, &info) == nil && len(info.Addrs) > 0 {
			p.peerID, p.addr = info.PeerID, info.Addrs[0]
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("start %v: no node.json\n%s", args, p.log.String())
		}
	}
}

// apiURL waits for the "api: URL" line a process prints once it listens.
func apiURL(t *testing.T, p *cliProc) string {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		sc := bufio.NewScanner(strings.NewReader(p.out.String()))
		for sc.Scan() {
			if u, ok := strings.CutPrefix(sc.Text(), "api:"); ok {
				return strings.TrimSpace(u)
			}
		}
	}
	t.Fatalf("no api line\nstdout %s\nstderr %s", p.out.String(), p.log.String())
	return ""
}

func localText(t *testing.T, bin string, args ...string) (string, int) {
	t.Helper()
	out, err := exec.Command(bin, append([]string{"generate", "--local", "--json"}, args...)...).Output()
	if err != nil {
		t.Fatalf("generate --local: %v", err)
	}
	var res struct {
		Text   string  `json:"text"`
		Tokens []int32 `json:"tokens"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatal(err)
	}
	return res.Text, len(res.Tokens)
}

type apiExt struct {
	Reroutes    int `json:"reroutes"`
	Speculation *struct {
		Windows, Proposed, Accepted int
	} `json:"speculation"`
	Route []struct {
		Peer  string `json:"peer"`
		Start int    `json:"start"`
	} `json:"route"`
}

func chunkExt(raw string) *apiExt {
	var v struct {
		M *apiExt `json:"meshp2p"`
	}
	if json.Unmarshal([]byte(raw), &v) != nil {
		return nil
	}
	return v.M
}

// Through the real CLI: `meshp2p serve` in front of four `start`
// processes (head, two replicas of the middle, tail). The OpenAI SDK
// streams a 200-token chat while the route's middle process is SIGKILLed:
// the client sees no error, the text equals `generate --local --chat`, and
// the last chunk reports the re-route. `start --api` serves the same API.
func TestServeAPIAndHopKill(t *testing.T) {
	if testing.Short() {
		t.Skip("starts five processes")
	}
	bin := testbin.CLI(t)
	model := chatmodel.ChatStories(t)
	dir := t.TempDir()
	net := []string{"--network", "apitest", "--listen", "/ip4/127.0.0.1/tcp/0"}
	node := func(name, layers string, extra ...string) *cliProc {
		args := append([]string{"--model", model, "--layers", layers, "--threads", "1"}, net...)
		return startCLI(t, bin, filepath.Join(dir, name), append(args, extra...)...)
	}
	head := node("head", "0-2")
	boot := []string{"--bootstrap", head.addr}
	mids := []*cliProc{node("midA", "2-4", boot...), node("midB", "2-4", boot...)}
	tail := node("tail", "4-5", append(boot, "--api", "127.0.0.1:0")...)
	serve := launch(t, bin, append([]string{"serve", "--api", "127.0.0.1:0", "--api-key", "k"}, append(net, boot...)...)...)
	base := apiURL(t, serve)

	const prompt = "Tell me a story"
	want, wantTokens := localText(t, bin, "--chat", "--model", model, "--prompt", prompt, "--max-tokens", "200")
	if wantTokens < 100 {
		t.Fatalf("reference has only %d tokens", wantTokens)
	}
	client := openai.NewClient(option.WithBaseURL(base+"/"), option.WithAPIKey("k"), option.WithMaxRetries(0))
	ctx := context.Background()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		page, err := client.Models.List(ctx)
		if err == nil && len(page.Data) == 1 && page.Data[0].ID == "stories-chat" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the gateway never listed the model: %v %v", page, err)
		}
	}

	st := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "stories-chat",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)},
		MaxTokens: openai.Int(200), Temperature: openai.Float(0),
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}})
	var text string
	var killed *cliProc
	chunks, after := 0, 0
	var last *apiExt
	for st.Next() {
		ch := st.Current()
		chunks++
		if killed != nil {
			after++
		}
		if e := chunkExt(ch.RawJSON()); e != nil {
			last = e
			if killed == nil {
				for _, h := range e.Route {
					for _, m := range mids {
						if h.Start == 2 && h.Peer == m.peerID {
							killed = m
						}
					}
				}
				if killed == nil {
					t.Fatalf("route %+v has neither middle node", e.Route)
				}
				if err := killed.cmd.Process.Kill(); err != nil { // SIGKILL, by PID
					t.Fatal(err)
				}
			}
		}
		if len(ch.Choices) > 0 {
			text += ch.Choices[0].Delta.Content
		}
	}
	if err := st.Err(); err != nil {
		t.Fatalf("client saw an error after %d chunks: %v\nserve log:\n%s", chunks, err, serve.log.String())
	}
	if killed == nil || last == nil {
		t.Fatal("no route reported; nothing was killed")
	}
	t.Logf("killed the middle node after the first delta; %d chunks followed; last chunk %+v", after, *last)
	if text != want {
		t.Fatalf("text through the kill differs from --local:\napi   %q\nlocal %q", text, want)
	}
	if last.Reroutes != 1 {
		t.Fatalf("last chunk reports %d reroutes, want 1", last.Reroutes)
	}
	for _, h := range last.Route {
		if h.Peer == killed.peerID {
			t.Fatal("final route still names the killed node")
		}
	}
	// The gateway logs the re-route once the handler returns, which is
	// after the client has read the last chunk: wait for it (bounded).
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(serve.log.String(), "re-routed"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the gateway's log does not mention the re-route:\n%s", serve.log.String())
		}
	}

	// `start --api`: the tail serves the same API through its own
	// in-process gateway peer.
	wantShort, _ := localText(t, bin, "--model", model, "--prompt", "Once upon a time", "--max-tokens", "24")
	tc := openai.NewClient(option.WithBaseURL(apiURL(t, tail)+"/"), option.WithMaxRetries(0))
	var resp *openai.Completion
	var err error
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		resp, err = tc.Completions.New(ctx, openai.CompletionNewParams{Model: "stories-chat",
			Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon a time")},
			MaxTokens: openai.Int(24), Temperature: openai.Float(0)})
		if err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatalf("start --api: %v\n%s", err, tail.log.String())
	}
	if resp.Choices[0].Text != wantShort {
		t.Fatalf("start --api: %q, local %q", resp.Choices[0].Text, wantShort)
	}
	// Its gateway peer's identity is kept in the node's data directory
	// (a stable id other heads can trust) and printed.
	key, created, err := p2p.LoadOrCreateIdentity(gatewayDataDir(filepath.Join(dir, "tail")))
	if err != nil || created {
		t.Fatalf("no gateway identity in the tail's data dir (created now: %v): %v", created, err)
	}
	id, _ := peer.IDFromPrivateKey(key)
	if !strings.Contains(tail.out.String(), "api peer: "+id.String()) {
		t.Fatalf("start --api did not print its gateway peer %s:\n%s", id, tail.out.String())
	}

	// Losing a layer range: the other middle node is SIGKILLed too.
	var survivor *cliProc
	for _, m := range mids {
		if m != killed {
			survivor = m
		}
	}
	lostLayers(t, serve, base, survivor, head)
}

// lostLayers SIGKILLs gone, the last node serving layers 2-4 of the model
// behind the gateway serve at base: within seconds (p2p's liveness check,
// long before the advert's TTL) /v1/models says the model is unavailable
// and names the gap, a request gets a 503 with Retry-After and the gap in
// under 2 s, and the surviving node watching (a neighbour of gone) logs
// the death and the lost range.
func lostLayers(t *testing.T, serve *cliProc, base string, gone, watching *cliProc) {
	t.Helper()
	if err := gone.cmd.Process.Kill(); err != nil { // SIGKILL, by PID
		t.Fatal(err)
	}
	killed := time.Now()
	get := func(method, path, body string) (*http.Response, []byte) {
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer k")
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, b
	}
	type listed struct {
		Data []struct {
			ID      string `json:"id"`
			Meshp2p struct {
				State         string `json:"state"`
				MissingLayers string `json:"missing_layers"`
			} `json:"meshp2p"`
		} `json:"data"`
	}
	for {
		_, b := get(http.MethodGet, "/models", "")
		var l listed
		if err := json.Unmarshal(b, &l); err != nil {
			t.Fatalf("/v1/models: %v: %s", err, b)
		}
		if len(l.Data) == 1 && l.Data[0].Meshp2p.State == "unavailable" {
			if l.Data[0].Meshp2p.MissingLayers != "2-4" {
				t.Fatalf("/v1/models names the gap %q, want 2-4: %s", l.Data[0].Meshp2p.MissingLayers, b)
			}
			break
		}
		if time.Since(killed) > 30*time.Second {
			t.Fatalf("30 s after the last middle node died /v1/models still says %s\nserve log:\n%s", b, serve.log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("/v1/models said unavailable (missing 2-4) %v after the SIGKILL (advert TTL 6 min)", time.Since(killed).Round(time.Millisecond))
	asked := time.Now()
	resp, b := get(http.MethodPost, "/chat/completions", `{"model":"stories-chat","messages":[{"role":"user","content":"hi"}],"max_tokens":4}`)
	took := time.Since(asked)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(b), "2-4") {
		t.Fatalf("a request for the model with a gap: %d Retry-After %q %s", resp.StatusCode, resp.Header.Get("Retry-After"), b)
	}
	if took > 2*time.Second {
		t.Errorf("the 503 took %v, want under 2 s", took)
	}
	t.Logf("request for the model with a gap: 503 Retry-After %s in %v: %s", resp.Header.Get("Retry-After"), took.Round(time.Millisecond), strings.TrimSpace(string(b)))
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		l := watching.log.String()
		if strings.Contains(l, "peer died") && strings.Contains(l, "missing=2-4") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the head's log does not tell the death and the gap:\n%s", l)
		}
	}
}

// The gateway of `start --api` gets one identity in the data directory,
// the same on every start, and the node trusts it beside --trusted-client.
func TestTrustGateway(t *testing.T) {
	dir := gatewayDataDir(t.TempDir())
	other, _ := peer.Decode("12D3KooWBoci9eUurB9rJA2Hqs3UF28uuL1375WBkgniEZoWkGUE")
	a, err := trustGateway(dir, map[peer.ID]bool{other: true})
	if err != nil {
		t.Fatal(err)
	}
	b, err := trustGateway(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(a) != 2 || !a[other] || len(b) != 1 {
		t.Fatalf("trusted %v then %v", a, b)
	}
	for id := range b {
		if !a[id] {
			t.Fatalf("gateway id changed between starts: %v vs %v", a, b)
		}
	}
}

// `start --api` in a swarm whose hops admit only tracker-ticketed sessions
// (--require-ticket): its gateway asks the tracker for the route, as
// `serve --tracker` does, so the API works there too.
func TestStartAPIInTicketedSwarm(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three processes")
	}
	bin := testbin.CLI(t)
	model := chatmodel.ChatStories(t)
	dir := t.TempDir()
	net := []string{"--network", "apiticket", "--listen", "/ip4/127.0.0.1/tcp/0"}
	trk := startCLIAs(t, bin, "tracker", filepath.Join(dir, "trk"), append(net, "--reachability", "public")...)
	hop := append([]string{"--model", model, "--threads", "1", "--tracker", trk.addr, "--require-ticket"}, net...)
	startCLI(t, bin, filepath.Join(dir, "head"), append(hop, "--layers", "0-2")...)
	tail := startCLI(t, bin, filepath.Join(dir, "tail"), append(hop, "--layers", "2-5", "--api", "127.0.0.1:0")...)
	want, _ := localText(t, bin, "--model", model, "--prompt", "Once upon a time", "--max-tokens", "16")
	tc := openai.NewClient(option.WithBaseURL(apiURL(t, tail)+"/"), option.WithMaxRetries(0))
	var resp *openai.Completion
	var err error
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		resp, err = tc.Completions.New(context.Background(), openai.CompletionNewParams{Model: "stories-chat",
			Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon a time")},
			MaxTokens: openai.Int(16), Temperature: openai.Float(0)})
		if err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatalf("start --api in a ticketed swarm: %v\ntail log:\n%s", err, tail.log.String())
	}
	if resp.Choices[0].Text != want {
		t.Fatalf("start --api: %q, local %q", resp.Choices[0].Text, want)
	}
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(trk.log.String(), "route ticket issued"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the tracker issued no ticket:\n%s", trk.log.String())
		}
	}
}
