package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/neuron-tai/meshp2p/internal/sdktest"
	"github.com/neuron-tai/meshp2p/internal/testbin"
	"github.com/neuron-tai/meshp2p/internal/testmodels/chatmodel"
)

// agentSwarm is the loopback swarm of the agent API tests: a head, two
// replicas of the middle (each with --metrics, so a test finds the one a
// session runs on), a tail, and `meshp2p serve --api` in front, all
// started as the README says. The model is stories260K with Qwen2.5's
// published chat template (tools, Hermes <tool_call> syntax): the model
// knows nothing of tools, so the tests assert grammar-forced calls and
// round trips, not judgement.
type agentSwarm struct {
	t     *testing.T
	bin   string
	model string
	dir   string
	net   []string
	boot  []string
	mids  map[string]*midProc // by name
	base  string              // the gateway's /v1 URL
	serve *cliProc
	head  *cliProc
}

type midProc struct {
	p       *cliProc
	metrics string // http://host:port
}

const agentKey = "agent-key"

func newAgentSwarm(t *testing.T) *agentSwarm {
	t.Helper()
	tmpl, err := os.ReadFile(filepath.Join("..", "..", "chattmpl", "testdata", "Qwen-Qwen2.5-7B-Instruct.jinja"))
	if err != nil {
		t.Fatal(err)
	}
	s := &agentSwarm{t: t, bin: testbin.CLI(t), model: chatmodel.WithTemplate(t, "stories-tools", string(tmpl)), dir: t.TempDir(),
		net: []string{"--network", "agenttest", "--listen", "/ip4/127.0.0.1/tcp/0"}, mids: map[string]*midProc{}}
	s.head = s.node("head", "0-2")
	s.boot = []string{"--bootstrap", s.head.addr}
	for _, name := range []string{"midA", "midB"} {
		s.startMid(name)
	}
	s.node("tail", "4-5", s.boot...)
	s.serve = launch(t, s.bin, append([]string{"serve", "--api", "127.0.0.1:0", "--api-key", agentKey}, append(s.net, s.boot...)...)...)
	s.base = apiURL(t, s.serve)
	c := s.openai()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		page, err := c.Models.List(context.Background())
		if err == nil && len(page.Data) == 1 && page.Data[0].ID == "stories-tools" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the gateway never listed the model: %v %v", page, err)
		}
	}
	return s
}

func (s *agentSwarm) node(name, layers string, extra ...string) *cliProc {
	args := append([]string{"--model", s.model, "--layers", layers, "--threads", "1"}, s.net...)
	return startCLI(s.t, s.bin, filepath.Join(s.dir, name), append(args, extra...)...)
}

// startMid (re)starts a middle replica with its metrics server.
func (s *agentSwarm) startMid(name string) {
	dir := filepath.Join(s.dir, name)
	_ = os.Remove(filepath.Join(dir, "node.json")) // a restart waits for its new one
	p := s.node(name, "2-4", append(append([]string{}, s.boot...), "--metrics", "127.0.0.1:0")...)
	var url string
	for deadline := time.Now().Add(30 * time.Second); url == ""; time.Sleep(20 * time.Millisecond) {
		for _, line := range strings.Split(p.out.String(), "\n") {
			if rest, ok := strings.CutPrefix(line, "metrics:"); ok {
				url = strings.TrimSuffix(strings.Fields(rest)[0], "/metrics")
			}
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("%s printed no metrics URL:\n%s", name, p.out.String())
		}
	}
	s.mids[name] = &midProc{p: p, metrics: url}
}

func (s *agentSwarm) openai() openai.Client {
	return openai.NewClient(option.WithBaseURL(s.base+"/"), option.WithAPIKey(agentKey), option.WithMaxRetries(0))
}

// root is the gateway's URL without /v1.
func (s *agentSwarm) root() string { return strings.TrimSuffix(s.base, "/v1") }

// killActiveMid freezes the head (the generation waits instead of racing
// this search to its end: 300 tokens of a small model take well under a
// second on a quiet machine), waits (bounded) until a middle replica has
// a session open, SIGKILLs it (by PID), thaws the head and starts the
// killed replica again, so the next test has a spare.
func (s *agentSwarm) killActiveMid() string {
	s.t.Helper()
	thaw := freeze(s.t, s.head)
	defer thaw()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		for name, m := range s.mids {
			var doc struct {
				Counters struct {
					SessionsActive int `json:"sessions_active"`
				} `json:"counters"`
				Node struct {
					Sessions int `json:"sessions"`
				} `json:"node"`
			}
			resp, err := http.Get(m.metrics + "/api/status")
			if err != nil {
				continue
			}
			err = json.NewDecoder(resp.Body).Decode(&doc)
			resp.Body.Close()
			if err != nil || (doc.Counters.SessionsActive == 0 && doc.Node.Sessions == 0) {
				continue
			}
			if err := m.p.cmd.Process.Kill(); err != nil {
				s.t.Fatal(err)
			}
			_ = m.p.cmd.Wait()
			thaw() // before the restart: it bootstraps from the head
			s.startMid(name)
			return name
		}
	}
	s.t.Fatal("no middle replica ever had a session open")
	return ""
}

// reroutes counts the generations the gateway logged as re-routed.
func (s *agentSwarm) reroutes() int {
	return strings.Count(s.serve.log.String(), "re-routed around failed hops")
}

// waitReroutes waits (bounded: the gateway logs once its handler returned)
// until the gateway logged n re-routed generations: the kill hit a
// session in flight.
func (s *agentSwarm) waitReroutes(n int) {
	s.t.Helper()
	for deadline := time.Now().Add(10 * time.Second); s.reroutes() < n; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			s.t.Fatalf("the gateway logged %d re-routed generations, want %d:\n%s", s.reroutes(), n, s.serve.log.String())
		}
	}
}

// sseEvents reads a server-sent-event stream: (event name, data) pairs;
// onFirst runs once after the first data line.
func sseEvents(t *testing.T, r io.Reader, onFirst func()) [][2]string {
	t.Helper()
	var out [][2]string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	name := ""
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, "event: "); ok {
			name = v
		}
		if v, ok := strings.CutPrefix(line, "data: "); ok {
			out = append(out, [2]string{name, v})
			name = ""
			if len(out) == 1 && onFirst != nil {
				onFirst()
			}
		}
	}
	return out
}

func (s *agentSwarm) post(path, body string, hdr ...string) *http.Response {
	s.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, s.root()+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+agentKey)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		s.t.Fatalf("POST %s: %d %s", path, resp.StatusCode, b)
	}
	return resp
}

var weatherTool = openai.ChatCompletionToolUnionParam{OfFunction: &openai.ChatCompletionFunctionToolParam{Function: openai.FunctionDefinitionParam{
	Name: "get_weather", Description: openai.String("The weather in a city"),
	Parameters: openai.FunctionParameters{"type": "object", "properties": map[string]any{
		"city": map[string]any{"type": "string", "maxLength": 10},
		"unit": map[string]any{"enum": []string{"c", "f"}}},
		"required": []string{"city", "unit"}, "additionalProperties": false}}}}

var timeTool = openai.ChatCompletionToolUnionParam{OfFunction: &openai.ChatCompletionFunctionToolParam{Function: openai.FunctionDefinitionParam{
	Name: "get_time", Parameters: openai.FunctionParameters{"type": "object", "properties": map[string]any{
		"zone": map[string]any{"type": "string", "maxLength": 6}}, "required": []string{"zone"}, "additionalProperties": false}}}}

func validator(t *testing.T, schema any) *jsonschema.Schema {
	t.Helper()
	b, _ := json.Marshal(schema)
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("s.json", doc); err != nil {
		t.Fatal(err)
	}
	v, err := c.Compile("s.json")
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func validates(t *testing.T, v *jsonschema.Schema, text string) {
	t.Helper()
	inst, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
	if err != nil {
		t.Fatalf("%q is not JSON: %v", text, err)
	}
	if err := v.Validate(inst); err != nil {
		t.Fatalf("%q does not validate: %v", text, err)
	}
}

// The official clients against one loopback swarm: openai-go on chat
// completions and Responses, @anthropic-ai/sdk and ollama from npm.
func TestAgentAPIs(t *testing.T) {
	if testing.Short() {
		t.Skip("starts five processes")
	}
	s := newAgentSwarm(t)
	t.Run("openai chat", func(t *testing.T) { agentOpenAIChat(t, s) })
	t.Run("openai responses", func(t *testing.T) { agentResponses(t, s) })
	t.Run("prefix cache", func(t *testing.T) { agentPrefixCache(t, s) })
	for _, script := range []string{sdktest.Anthropic, sdktest.Ollama} {
		t.Run(script, func(t *testing.T) { agentSDK(t, s, script) })
	}
}

// agentPrefixCache: a conversation's second turn through the gateway
// reports the prompt tokens the hops reused (`start`'s default
// --prefix-cache), and a middle replica counts them in its metrics.
func agentPrefixCache(t *testing.T, s *agentSwarm) {
	c := s.openai()
	msgs := []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Tell me a long story about a brave little robot who sails the sea with a cat")}
	ask := func() *openai.ChatCompletion {
		t.Helper()
		r, err := c.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "stories-tools", Messages: msgs,
			MaxTokens: openai.Int(40), Temperature: openai.Float(0)})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	r := ask()
	msgs = append(msgs, openai.AssistantMessage(r.Choices[0].Message.Content), openai.UserMessage("What did they find?"))
	r = ask()
	cached := r.Usage.PromptTokensDetails.CachedTokens
	if cached == 0 || cached >= r.Usage.PromptTokens {
		t.Fatalf("second turn: %d of %d prompt tokens cached", cached, r.Usage.PromptTokens)
	}
	reused := 0.0
	for _, m := range s.mids {
		resp, err := http.Get(m.metrics + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, line := range strings.Split(string(body), "\n") {
			if rest, ok := strings.CutPrefix(line, "meshp2p_hop_prefix_reused_tokens_total "); ok {
				v, _ := strconv.ParseFloat(rest, 64)
				reused += v
			}
		}
	}
	if reused < float64(cached) {
		t.Fatalf("the middle replicas reused %g positions, the gateway reports %d cached", reused, cached)
	}
	t.Logf("second turn: %d of %d prompt tokens cached", cached, r.Usage.PromptTokens)
}

// agentSDK runs one of the npm SDK scripts (api/testdata/sdk) against the
// swarm; each asserts content and exits non-zero when an assertion fails.
func agentSDK(t *testing.T, s *agentSwarm, script string) {
	if err := sdktest.Available(); err != nil {
		t.Skip(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sum, err := sdktest.Run(ctx, script, map[string]string{sdktest.EnvBaseURL: s.root(), sdktest.EnvAPIKey: agentKey,
		sdktest.EnvModel: "stories-tools", sdktest.EnvMaxTokens: "24"})
	if err != nil {
		t.Fatalf("%s: %v\ngateway log:\n%s", script, err, s.serve.log.String())
	}
	b, _ := json.Marshal(sum)
	t.Logf("%s: %s", script, b)
}

// agentResponses: a Responses round trip through openai-go: a forced
// function call, its output sent back as input items, the final text.
func agentResponses(t *testing.T, s *agentSwarm) {
	c := s.openai()
	ctx := context.Background()
	params := responses.ResponseNewParams{Model: "stories-tools", Temperature: openai.Float(0), MaxOutputTokens: openai.Int(120),
		Input:      responses.ResponseNewParamsInputUnion{OfString: openai.String("What is the weather in Paris?")},
		Tools:      []responses.ToolUnionParam{responses.ToolParamOfFunction("get_weather", weatherTool.OfFunction.Function.Parameters, true)},
		ToolChoice: responses.ResponseNewParamsToolChoiceUnion{OfFunctionTool: &responses.ToolChoiceFunctionParam{Name: "get_weather"}}}
	first, err := c.Responses.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	var call *responses.ResponseOutputItemUnion
	for i := range first.Output {
		if first.Output[i].Type == "function_call" {
			call = &first.Output[i]
		}
	}
	if call == nil || call.Name != "get_weather" || call.CallID == "" || first.Status != "completed" {
		t.Fatalf("first: %s", first.RawJSON())
	}
	validates(t, validator(t, weatherTool.OfFunction.Function.Parameters), call.Arguments.OfString)
	params.ToolChoice = responses.ResponseNewParamsToolChoiceUnion{OfToolChoiceMode: openai.Opt(responses.ToolChoiceOptionsNone)}
	params.MaxOutputTokens = openai.Int(30)
	params.Input = responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{
		responses.ResponseInputItemParamOfMessage("What is the weather in Paris?", responses.EasyInputMessageRoleUser),
		responses.ResponseInputItemParamOfFunctionCall(call.Arguments.OfString, call.CallID, call.Name),
		{OfFunctionCallOutput: &responses.ResponseInputItemFunctionCallOutputParam{CallID: openai.String(call.CallID),
			Output: responses.ResponseInputItemFunctionCallOutputOutputUnionParam{OfString: openai.String("18 degrees and sunny")}}},
	}}
	final, err := c.Responses.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if final.OutputText() == "" || final.Usage.InputTokens <= first.Usage.InputTokens {
		t.Fatalf("final: %s (first had %d input tokens)", final.RawJSON(), first.Usage.InputTokens)
	}
	t.Logf("responses round trip: %s(%s) → %q", call.Name, call.Arguments.OfString, final.OutputText())
}

// agentOpenAIChat: openai-go on chat completions: grammar-forced tool
// calls (named and required, streamed and not: the same calls), a tool
// round trip, json_schema output that validates, and log-probabilities.
func agentOpenAIChat(t *testing.T, s *agentSwarm) {
	c := s.openai()
	ctx := context.Background()
	user := []openai.ChatCompletionMessageParamUnion{openai.UserMessage("What is the weather in Paris?")}

	// A named function: exactly one call of it, arguments valid.
	named := openai.ChatCompletionNewParams{Model: "stories-tools", Messages: user, Temperature: openai.Float(0), MaxTokens: openai.Int(120),
		Tools:             []openai.ChatCompletionToolUnionParam{weatherTool, timeTool},
		ToolChoice:        openai.ChatCompletionToolChoiceOptionUnionParam{OfFunctionToolChoice: &openai.ChatCompletionNamedToolChoiceParam{Function: openai.ChatCompletionNamedToolChoiceFunctionParam{Name: "get_weather"}}},
		ParallelToolCalls: openai.Bool(false)}
	resp, err := c.Chat.Completions.New(ctx, named)
	if err != nil {
		t.Fatal(err)
	}
	ch := resp.Choices[0]
	if ch.FinishReason != "tool_calls" || len(ch.Message.ToolCalls) != 1 || ch.Message.ToolCalls[0].Function.Name != "get_weather" || ch.Message.ToolCalls[0].ID == "" {
		t.Fatalf("named call: %s", resp.RawJSON())
	}
	validates(t, validator(t, weatherTool.OfFunction.Function.Parameters), ch.Message.ToolCalls[0].Function.Arguments)
	t.Logf("named call: %s(%s)", ch.Message.ToolCalls[0].Function.Name, ch.Message.ToolCalls[0].Function.Arguments)

	// required, streamed: the accumulated calls equal the non-streamed
	// ones (greedy), each valid for its function.
	req := named
	req.ToolChoice = openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("required")}
	req.MaxTokens = openai.Int(200)
	whole, err := c.Chat.Completions.New(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	st := c.Chat.Completions.NewStreaming(ctx, req)
	acc := openai.ChatCompletionAccumulator{}
	deltas := 0
	for st.Next() {
		k := st.Current()
		acc.AddChunk(k)
		if len(k.Choices) > 0 && len(k.Choices[0].Delta.ToolCalls) > 0 {
			deltas++
		}
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	wc, sc := whole.Choices[0].Message.ToolCalls, acc.Choices[0].Message.ToolCalls
	if len(wc) == 0 || len(wc) != len(sc) || acc.Choices[0].FinishReason != "tool_calls" || deltas < 2 {
		t.Fatalf("required: whole %s, streamed %+v (%d tool-call deltas)", whole.RawJSON(), acc.Choices[0], deltas)
	}
	for i := range wc {
		if wc[i].Function.Name != sc[i].Function.Name || wc[i].Function.Arguments != sc[i].Function.Arguments {
			t.Fatalf("call %d: whole %+v streamed %+v", i, wc[i].Function, sc[i].Function)
		}
		params := weatherTool.OfFunction.Function.Parameters
		if wc[i].Function.Name == "get_time" {
			params = timeTool.OfFunction.Function.Parameters
		}
		validates(t, validator(t, params), wc[i].Function.Arguments)
	}

	// required + parallel: calls one after another (this model never
	// stops calling: the grammar allows 16), each complete one valid.
	req.ParallelToolCalls = openai.Bool(true)
	req.MaxTokens = openai.Int(400)
	par, err := c.Chat.Completions.New(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if pc := par.Choices[0].Message.ToolCalls; len(pc) < 2 {
		t.Fatalf("parallel: %s", par.RawJSON())
	} else {
		for _, call := range pc {
			params := weatherTool.OfFunction.Function.Parameters
			if call.Function.Name == "get_time" {
				params = timeTool.OfFunction.Function.Parameters
			}
			validates(t, validator(t, params), call.Function.Arguments)
		}
		t.Logf("parallel: %d calls, finish %s", len(pc), par.Choices[0].FinishReason)
	}

	// The round trip: the call, its result, the final answer (tool_choice
	// none: text). The tool result is rendered into the prompt.
	call := ch.Message.ToolCalls[0]
	trip := openai.ChatCompletionNewParams{Model: "stories-tools", Temperature: openai.Float(0), MaxTokens: openai.Int(40),
		Tools: []openai.ChatCompletionToolUnionParam{weatherTool, timeTool}, ToolChoice: openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("none")},
		Messages: append(append([]openai.ChatCompletionMessageParamUnion{}, user...), ch.Message.ToParam(),
			openai.ToolMessage("It is sunny and 21 degrees in Paris.", call.ID))}
	final, err := c.Chat.Completions.New(ctx, trip)
	if err != nil {
		t.Fatal(err)
	}
	if final.Choices[0].Message.Content == "" || len(final.Choices[0].Message.ToolCalls) != 0 || final.Usage.PromptTokens <= resp.Usage.PromptTokens {
		t.Fatalf("round trip: %s (first prompt %d tokens)", final.RawJSON(), resp.Usage.PromptTokens)
	}
	t.Logf("round trip: %d → %d prompt tokens, answer %q", resp.Usage.PromptTokens, final.Usage.PromptTokens, final.Choices[0].Message.Content)

	// json_schema (strict): the content validates.
	schema := map[string]any{"type": "object", "properties": map[string]any{
		"title": map[string]any{"type": "string", "maxLength": 12},
		"hero":  map[string]any{"type": "object", "properties": map[string]any{"name": map[string]any{"type": "string", "maxLength": 8}, "age": map[string]any{"type": "integer", "minimum": 1, "maximum": 99}}, "required": []string{"name", "age"}, "additionalProperties": false},
		"mood":  map[string]any{"enum": []string{"happy", "sad"}},
		"tags":  map[string]any{"type": "array", "items": map[string]any{"type": "string", "maxLength": 5}, "maxItems": 3}},
		"required": []string{"title", "hero", "mood", "tags"}, "additionalProperties": false}
	js, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "stories-tools", Temperature: openai.Float(0.7), Seed: openai.Int(9), MaxTokens: openai.Int(200),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Tell me a story as JSON")},
		ResponseFormat: openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONSchema: &openai.ResponseFormatJSONSchemaParam{JSONSchema: openai.ResponseFormatJSONSchemaJSONSchemaParam{
			Name: "story", Schema: schema, Strict: openai.Bool(true)}}}})
	if err != nil {
		t.Fatal(err)
	}
	if js.Choices[0].FinishReason != "stop" {
		t.Fatalf("json_schema: %s", js.RawJSON())
	}
	validates(t, validator(t, schema), js.Choices[0].Message.Content)
	t.Logf("json_schema: %s", js.Choices[0].Message.Content)

	// A schema the converter cannot handle: 400 naming it, before any hop.
	_, err = c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "stories-tools", MaxTokens: openai.Int(5),
		Messages: user, ResponseFormat: openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONSchema: &openai.ResponseFormatJSONSchemaParam{JSONSchema: openai.ResponseFormatJSONSchemaJSONSchemaParam{
			Name: "bad", Schema: map[string]any{"type": "string", "pattern": "[a-z]+"}}}}})
	var apiErr *openai.Error
	if !asAPIError(err, &apiErr) || apiErr.StatusCode != 400 || !strings.Contains(apiErr.Message, "must start with ^") {
		t.Fatalf("bad schema: %v", err)
	}

	// logprobs with top_logprobs: greedy picks the most likely token.
	lp, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "stories-tools", Temperature: openai.Float(0), MaxTokens: openai.Int(12),
		Messages: user, Logprobs: openai.Bool(true), TopLogprobs: openai.Int(5)})
	if err != nil {
		t.Fatal(err)
	}
	content := lp.Choices[0].Logprobs.Content
	// One entry per generated token of the text (an end-of-generation
	// token has none).
	if n := int(lp.Usage.CompletionTokens); len(content) == 0 || (len(content) != n && !(lp.Choices[0].FinishReason == "stop" && len(content) == n-1)) {
		t.Fatalf("logprobs for %d of %d tokens: %s", len(content), lp.Usage.CompletionTokens, lp.RawJSON())
	}
	text := ""
	for i, tok := range content {
		if len(tok.TopLogprobs) != 5 || tok.Logprob > 0 || tok.TopLogprobs[0].Token != tok.Token || tok.TopLogprobs[0].Logprob != tok.Logprob {
			t.Fatalf("token %d: %+v", i, tok)
		}
		for j := 1; j < 5; j++ {
			if tok.TopLogprobs[j].Logprob > tok.TopLogprobs[j-1].Logprob {
				t.Fatalf("token %d: top not sorted %+v", i, tok.TopLogprobs)
			}
		}
		text += tok.Token
	}
	if text != lp.Choices[0].Message.Content {
		t.Fatalf("logprob tokens %q do not spell the content %q", text, lp.Choices[0].Message.Content)
	}
}

func asAPIError(err error, target **openai.Error) bool {
	e, ok := err.(*openai.Error)
	if ok {
		*target = e
	}
	return ok
}

// Each API shape's stream completes unchanged when the middle hop it runs
// through is SIGKILLed after the first event: OpenAI chat, Anthropic
// Messages, Ollama chat and OpenAI Responses, each against the same
// request without a kill.
func TestAgentAPIsSurviveHopKill(t *testing.T) {
	if testing.Short() {
		t.Skip("starts five processes")
	}
	s := newAgentSwarm(t)
	const prompt = "Tell me a story about a cat"
	cases := []struct {
		name, path, body string
		hdr              []string
		text             func(events [][2]string) (string, error)
	}{
		{"openai chat", "/v1/chat/completions",
			`{"model":"stories-tools","stream":true,"temperature":0,"max_tokens":300,"messages":[{"role":"user","content":"` + prompt + `"}]}`, nil,
			func(ev [][2]string) (string, error) {
				out := ""
				for _, e := range ev {
					if e[1] == "[DONE]" {
						return out, nil
					}
					var k struct {
						Choices []struct{ Delta struct{ Content string } }
						Error   any
					}
					if err := json.Unmarshal([]byte(e[1]), &k); err != nil || k.Error != nil {
						return out, fmt.Errorf("event %s: %v", e[1], err)
					}
					if len(k.Choices) > 0 {
						out += k.Choices[0].Delta.Content
					}
				}
				return out, fmt.Errorf("no [DONE]")
			}},
		// A grammar-forced call: the tail's grammar state is rebuilt from
		// the tokens so far on the replacement route.
		{"openai forced tool calls", "/v1/chat/completions",
			`{"model":"stories-tools","stream":true,"temperature":0,"max_tokens":300,"tool_choice":"required","messages":[{"role":"user","content":"` + prompt + `"}],
			  "tools":[{"type":"function","function":{"name":"tell","parameters":{"type":"object","properties":{"story":{"type":"string"},"moral":{"enum":["be kind","share"]}},"required":["story","moral"],"additionalProperties":false}}}]}`, nil,
			func(ev [][2]string) (string, error) {
				out, done := "", false
				for _, e := range ev {
					if e[1] == "[DONE]" {
						done = true
						continue
					}
					var k struct {
						Choices []struct {
							Delta struct {
								Content   string
								ToolCalls []struct {
									Index    int
									Function struct{ Name, Arguments string }
								} `json:"tool_calls"`
							}
						}
						Error any
					}
					if err := json.Unmarshal([]byte(e[1]), &k); err != nil || k.Error != nil {
						return out, fmt.Errorf("event %s: %v", e[1], err)
					}
					for _, c := range k.Choices {
						out += c.Delta.Content
						for _, tc := range c.Delta.ToolCalls {
							out += fmt.Sprintf("[%d %s]%s", tc.Index, tc.Function.Name, tc.Function.Arguments)
						}
					}
				}
				if !done || !strings.Contains(out, "[0 tell]") {
					return out, fmt.Errorf("no [DONE] or no call")
				}
				return out, nil
			}},
		{"anthropic messages", "/v1/messages",
			`{"model":"stories-tools","stream":true,"temperature":0,"max_tokens":300,"messages":[{"role":"user","content":"` + prompt + `"}]}`,
			[]string{"x-api-key", agentKey, "anthropic-version", "2023-06-01"},
			func(ev [][2]string) (string, error) {
				out, stopped := "", false
				for _, e := range ev {
					var k struct {
						Type  string
						Delta struct{ Type, Text string }
					}
					if err := json.Unmarshal([]byte(e[1]), &k); err != nil || k.Type == "error" {
						return out, fmt.Errorf("event %s: %v", e[1], err)
					}
					if k.Type == "content_block_delta" && k.Delta.Type == "text_delta" {
						out += k.Delta.Text
					}
					stopped = stopped || k.Type == "message_stop"
				}
				if !stopped {
					return out, fmt.Errorf("no message_stop")
				}
				return out, nil
			}},
		{"responses", "/v1/responses",
			`{"model":"stories-tools","stream":true,"temperature":0,"max_output_tokens":300,"input":"` + prompt + `"}`, nil,
			func(ev [][2]string) (string, error) {
				out, done := "", false
				for _, e := range ev {
					var k struct{ Type, Delta string }
					if err := json.Unmarshal([]byte(e[1]), &k); err != nil || k.Type == "error" || k.Type == "response.failed" {
						return out, fmt.Errorf("event %s: %v", e[1], err)
					}
					if k.Type == "response.output_text.delta" {
						out += k.Delta
					}
					// max_output_tokens ends it as incomplete.
					done = done || k.Type == "response.completed" || k.Type == "response.incomplete"
				}
				if !done {
					return out, fmt.Errorf("no response.completed or response.incomplete")
				}
				return out, nil
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp := s.post(tc.path, tc.body, tc.hdr...)
			want, err := tc.text(sseEvents(t, resp.Body, nil))
			resp.Body.Close()
			if err != nil || len(want) < 200 {
				t.Fatalf("reference run: %q %v", want, err)
			}
			before := s.reroutes()
			resp = s.post(tc.path, tc.body, tc.hdr...)
			var killed string
			got, err := tc.text(sseEvents(t, resp.Body, func() { killed = s.killActiveMid() }))
			resp.Body.Close()
			if err != nil {
				t.Fatalf("stream after killing %s: %v\n%s", killed, err, s.serve.log.String())
			}
			if got != want {
				t.Fatalf("text through the kill of %s differs:\ngot  %q\nwant %q", killed, got, want)
			}
			s.waitReroutes(before + 1)
			t.Logf("killed %s after the first event; %d bytes of text, unchanged", killed, len(got))
		})
	}
	// Ollama streams NDJSON.
	t.Run("ollama chat", func(t *testing.T) {
		body := `{"model":"stories-tools","stream":true,"options":{"temperature":0,"num_predict":300},"messages":[{"role":"user","content":"` + prompt + `"}]}`
		read := func(onFirst func()) (string, error) {
			resp := s.post("/api/chat", body)
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			sc.Buffer(make([]byte, 1<<20), 1<<20)
			out, n, done := "", 0, false
			for sc.Scan() {
				var k struct {
					Message struct{ Content string }
					Done    bool
					Error   string
				}
				if err := json.Unmarshal(sc.Bytes(), &k); err != nil || k.Error != "" {
					return out, fmt.Errorf("line %s: %v", sc.Text(), err)
				}
				out += k.Message.Content
				done = done || k.Done
				if n++; n == 1 && onFirst != nil {
					onFirst()
				}
			}
			if !done {
				return out, fmt.Errorf("no done line")
			}
			return out, nil
		}
		want, err := read(nil)
		if err != nil || len(want) < 200 {
			t.Fatalf("reference run: %q %v", want, err)
		}
		before := s.reroutes()
		var killed string
		got, err := read(func() { killed = s.killActiveMid() })
		if err != nil || got != want {
			t.Fatalf("ollama stream through the kill of %s: %v\ngot  %q\nwant %q", killed, err, got, want)
		}
		s.waitReroutes(before + 1)
	})
}
