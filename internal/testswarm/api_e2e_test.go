package testswarm_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/neuron-tai/meshp2p/api"
	"github.com/neuron-tai/meshp2p/client"
	"github.com/neuron-tai/meshp2p/engine"
	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/internal/testmodels"
	"github.com/neuron-tai/meshp2p/internal/testmodels/chatmodel"
	"github.com/neuron-tai/meshp2p/internal/testmodels/local"
	"github.com/neuron-tai/meshp2p/internal/testmodels/synthmodel"
	"github.com/neuron-tai/meshp2p/internal/testswarm"
	"github.com/neuron-tai/meshp2p/node"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/session"
)

// reference is what `generate --local` prints for prompt: the whole model
// in-process, greedy, tokens up to the first end-of-generation token, and
// their text.
type reference struct {
	tokens []int32
	pieces []string
	text   string
}

func localReference(t *testing.T, model string, prompt []int32, n int) reference {
	t.Helper()
	return referenceOf(t, model, local.Tokens(t, model, prompt, n, nil))
}

func referenceOf(t *testing.T, model string, toks []int32) reference {
	t.Helper()
	v, err := engine.LoadModel(context.Background(), model, engine.LoadOptions{VocabOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	var r reference
	for _, tok := range toks {
		r.tokens = append(r.tokens, tok)
		if v.IsEOG(tok) {
			break
		}
		p, err := v.TokenPiece(tok, false)
		if err != nil {
			t.Fatal(err)
		}
		r.pieces = append(r.pieces, p)
		r.text += p
	}
	return r
}

func promptOf(t *testing.T, model string, chat bool, text string) []int32 {
	t.Helper()
	v, err := engine.LoadModel(context.Background(), model, engine.LoadOptions{VocabOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	if !chat {
		toks, err := v.Tokenize(text, true, false)
		if err != nil {
			t.Fatal(err)
		}
		return toks
	}
	p, err := v.ApplyChatTemplate([]engine.ChatMessage{{Role: "user", Content: text}}, true)
	if err != nil {
		t.Fatal(err)
	}
	toks, err := v.Tokenize(p, true, true)
	if err != nil {
		t.Fatal(err)
	}
	return toks
}

// The official OpenAI Go SDK against a gateway on a real 3-node loopback
// swarm: chat and completions, streamed and not, equal the whole model
// in-process; stop strings that span tokens; models; errors; 8 concurrent
// streams sharing the route; a client that leaves frees every hop.
func TestGatewayOpenAISDK(t *testing.T) {
	model := chatmodel.ChatStories(t)
	tn := testswarm.New(t)
	var hops []*node.Node
	for _, r := range gguf.EvenSplit(5, 3) {
		hops = append(hops, tn.Shard(model, &r, func(c *node.Config) { c.Engine.MaxSessions, c.Engine.NCtx = 8, 1024 }))
	}
	// A second model whose layers 2-4 nobody serves: known, not routable.
	partial := synthmodel.Llama(t, "partial", 4)
	tn.Shard(partial, &gguf.Range{Start: 0, End: 2}, nil)
	c := tn.Client()
	fp := waitModel(t, c, "stories-chat").Fingerprint
	for deadline := time.Now().Add(20 * time.Second); len(c.Table().Shards("")) < 4; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the partial model's shard never reached the client")
		}
	}
	g := api.NewSwarm(c, api.SwarmConfig{})
	srv := httptest.NewServer(api.New(api.Config{Backend: g, APIKey: "test-key"}))
	defer srv.Close()
	client := openai.NewClient(option.WithBaseURL(srv.URL+"/v1/"), option.WithAPIKey("test-key"), option.WithMaxRetries(0))
	ctx := context.Background()

	chatRef := localReference(t, model, promptOf(t, model, true, "Tell me a story"), 40)
	compRef := localReference(t, model, promptOf(t, model, false, "Once upon a time"), 48)
	if len(compRef.pieces) < 20 {
		t.Fatalf("reference completion too short to test with: %q", compRef.text)
	}
	chatParams := func(m string) openai.ChatCompletionNewParams {
		return openai.ChatCompletionNewParams{Model: m, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Tell me a story")},
			MaxTokens: openai.Int(40), Temperature: openai.Float(0)}
	}
	wantFinish := func(ref reference, max int) string {
		if len(ref.tokens) < max {
			return "stop"
		}
		return "length"
	}

	t.Run("chat", func(t *testing.T) {
		for _, m := range []string{"stories-chat", fp, fp[:16]} {
			resp, err := client.Chat.Completions.New(ctx, chatParams(m))
			if err != nil {
				t.Fatal(err)
			}
			if got := resp.Choices[0].Message.Content; got != chatRef.text {
				t.Fatalf("model %q: chat %q, local %q", m, got, chatRef.text)
			}
			if resp.Model != "stories-chat" || resp.Object != "chat.completion" || !strings.HasPrefix(resp.ID, "chatcmpl-") ||
				string(resp.Choices[0].FinishReason) != wantFinish(chatRef, 40) || resp.Usage.CompletionTokens != int64(len(chatRef.tokens)) ||
				resp.Usage.PromptTokens == 0 || resp.Usage.TotalTokens != resp.Usage.PromptTokens+resp.Usage.CompletionTokens {
				t.Fatalf("response %s", resp.RawJSON())
			}
		}
		t.Logf("chat: %d tokens %q", len(chatRef.tokens), chatRef.text)
	})

	t.Run("chat stream", func(t *testing.T) {
		p := chatParams("stories-chat")
		p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
		st := client.Chat.Completions.NewStreaming(ctx, p)
		var text, role, finish string
		var usage int64
		n, routes, lastReroutes := 0, 0, -1
		for st.Next() {
			ch := st.Current()
			n++
			if e, ok := meshp2pExt(t, ch.RawJSON()); ok {
				if len(e.Route) == 3 {
					routes++
				}
				lastReroutes = e.Reroutes
			}
			if ch.Usage.TotalTokens > 0 {
				usage = ch.Usage.CompletionTokens
			}
			if len(ch.Choices) == 0 {
				continue
			}
			if ch.Choices[0].Delta.Role != "" {
				role = ch.Choices[0].Delta.Role
			}
			text += ch.Choices[0].Delta.Content
			if ch.Choices[0].FinishReason != "" {
				finish = ch.Choices[0].FinishReason
			}
		}
		if err := st.Err(); err != nil {
			t.Fatal(err)
		}
		if text != chatRef.text || role != "assistant" || finish != wantFinish(chatRef, 40) || usage != int64(len(chatRef.tokens)) {
			t.Fatalf("stream: text %q role %q finish %q usage %d (%d chunks); local %q", text, role, finish, usage, n, chatRef.text)
		}
		// The route rides on the first delta, the finish and the usage
		// chunk, with the re-route count.
		if routes != 3 || lastReroutes != 0 {
			t.Fatalf("route metadata on %d chunks, last reroutes %d", routes, lastReroutes)
		}
	})

	compParams := func(max int64) openai.CompletionNewParams {
		return openai.CompletionNewParams{Model: "stories-chat", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon a time")},
			MaxTokens: openai.Int(max), Temperature: openai.Float(0)}
	}
	t.Run("completions", func(t *testing.T) {
		resp, err := client.Completions.New(ctx, compParams(48))
		if err != nil {
			t.Fatal(err)
		}
		if resp.Choices[0].Text != compRef.text || string(resp.Choices[0].FinishReason) != wantFinish(compRef, 48) || resp.Object != "text_completion" {
			t.Fatalf("completion %q (%s), local %q", resp.Choices[0].Text, resp.Choices[0].FinishReason, compRef.text)
		}
		st := client.Completions.NewStreaming(ctx, compParams(48))
		text := ""
		for st.Next() {
			if ch := st.Current(); len(ch.Choices) > 0 {
				text += ch.Choices[0].Text
			}
		}
		if err := st.Err(); err != nil || text != compRef.text {
			t.Fatalf("streamed completion %q (%v), local %q", text, err, compRef.text)
		}
	})

	t.Run("sampling and penalties", func(t *testing.T) {
		// temperature, top_p, seed and the penalties reach the tail: the
		// swarm samples exactly as the whole model in-process with the
		// same parameters (OpenAI has no top-k or min-p: both off).
		prompt := promptOf(t, model, false, "Once upon a time")
		for _, sp := range []*meshp2pb.SamplingParams{
			{Temperature: 0.9, TopP: 0.95, Seed: 1 << 40},
			{FrequencyPenalty: 1.5, TopP: 1, RepeatLastN: -1},
			{PresencePenalty: 1.2, Temperature: 0.7, TopP: 1, Seed: 7, RepeatLastN: -1},
		} {
			want := referenceOf(t, model, local.Tokens(t, model, prompt, 32, sp))
			p := compParams(32)
			p.Temperature, p.TopP, p.Seed = openai.Float(float64(sp.Temperature)), openai.Float(float64(sp.TopP)), openai.Int(int64(sp.Seed))
			p.FrequencyPenalty, p.PresencePenalty = openai.Float(float64(sp.FrequencyPenalty)), openai.Float(float64(sp.PresencePenalty))
			resp, err := client.Completions.New(ctx, p)
			if err != nil {
				t.Fatal(err)
			}
			if resp.Choices[0].Text != want.text {
				t.Fatalf("%v: api %q, local %q", sp, resp.Choices[0].Text, want.text)
			}
			if want.text == compRef.text {
				t.Fatalf("%v: sampled text equals greedy; the parameters did nothing", sp)
			}
		}
	})

	t.Run("stop across tokens", func(t *testing.T) {
		// A stop string made of the end of one token and the start of
		// the next.
		k := -1
		for i := 5; i+1 < len(compRef.pieces); i++ {
			if len(compRef.pieces[i]) >= 2 && len(strings.TrimSpace(compRef.pieces[i+1])) >= 2 {
				k = i
				break
			}
		}
		if k < 0 {
			t.Fatal("no two adjacent pieces to build a stop string from")
		}
		stop := compRef.pieces[k][len(compRef.pieces[k])-2:] + compRef.pieces[k+1][:2]
		want := compRef.text[:strings.Index(compRef.text, stop)]
		p := compParams(48)
		p.Stop = openai.CompletionNewParamsStopUnion{OfStringArray: []string{"never-appears", stop}}
		st := client.Completions.NewStreaming(ctx, p)
		text, finish := "", ""
		for st.Next() {
			if ch := st.Current(); len(ch.Choices) > 0 {
				text += ch.Choices[0].Text
				finish += string(ch.Choices[0].FinishReason)
			}
		}
		if err := st.Err(); err != nil || text != want || finish != "stop" {
			t.Fatalf("stop %q: got %q finish %q (%v), want %q", stop, text, finish, err, want)
		}
	})

	t.Run("models", func(t *testing.T) {
		page, err := client.Models.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Data) != 1 || page.Data[0].ID != "stories-chat" || page.Data[0].Created == 0 {
			t.Fatalf("models %s (the partial model must not be listed)", page.RawJSON())
		}
		for _, id := range []string{"stories-chat", fp} {
			m, err := client.Models.Get(ctx, id)
			if err != nil || m.ID != "stories-chat" || m.Created != page.Data[0].Created {
				t.Fatalf("get %q: %v %v", id, m, err)
			}
		}
	})

	t.Run("errors", func(t *testing.T) {
		var e *openai.Error
		_, err := client.Chat.Completions.New(ctx, chatParams("no-such-model"))
		if !errors.As(err, &e) || e.StatusCode != 404 || e.Code != "model_not_found" {
			t.Fatalf("unknown model: %v", err)
		}
		p := chatParams("stories-chat")
		p.N = openai.Int(2)
		if _, err := client.Chat.Completions.New(ctx, p); !errors.As(err, &e) || e.StatusCode != 400 || e.Param != "n" {
			t.Fatalf("n=2: %v", err)
		}
		_, err = client.Chat.Completions.New(ctx, chatParams("partial"))
		if !errors.As(err, &e) || e.StatusCode != 503 || !strings.Contains(e.Message, "layers 2-4 of 4") {
			t.Fatalf("model without a route: %v", err)
		}
		t.Logf("503 as the client sees it: %s", e.Message)
		// More than the hops' 1024-cell context: refused up front.
		p = chatParams("stories-chat")
		p.MaxTokens = openai.Int(2000)
		if _, err := client.Chat.Completions.New(ctx, p); !errors.As(err, &e) || e.StatusCode != 400 || e.Param != "max_tokens" {
			t.Fatalf("max_tokens beyond the context: %v", err)
		}
		bad := openai.NewClient(option.WithBaseURL(srv.URL+"/v1/"), option.WithAPIKey("wrong"), option.WithMaxRetries(0))
		if _, err := bad.Models.List(ctx); !errors.As(err, &e) || e.StatusCode != 401 {
			t.Fatalf("wrong key: %v", err)
		}
	})

	t.Run("concurrent streams", func(t *testing.T) {
		const streams = 8
		var peak atomic.Int64
		stopWatch := make(chan struct{})
		watched := make(chan struct{})
		go func() {
			defer close(watched)
			for {
				peak.Store(max(peak.Load(), int64(hops[0].Hop().Sessions())))
				select {
				case <-stopWatch:
					return
				case <-time.After(time.Millisecond):
				}
			}
		}()
		var wg sync.WaitGroup
		errs := make(chan error, streams)
		for range streams {
			wg.Add(1)
			go func() {
				defer wg.Done()
				st := client.Completions.NewStreaming(ctx, compParams(48))
				text := ""
				for st.Next() {
					if ch := st.Current(); len(ch.Choices) > 0 {
						text += ch.Choices[0].Text
					}
				}
				if err := st.Err(); err != nil {
					errs <- err
				} else if text == "" {
					errs <- errors.New("empty text")
				}
			}()
		}
		wg.Wait()
		close(stopWatch)
		<-watched
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if peak.Load() < 2 {
			t.Fatalf("the head never held two sessions at once (peak %d): the streams did not share the route", peak.Load())
		}
		t.Logf("%d concurrent streams; the head held up to %d sessions at once", streams, peak.Load())
	})

	t.Run("client disconnect frees every hop", func(t *testing.T) {
		sctx, cancel := context.WithCancel(ctx)
		p := compParams(400)
		st := client.Completions.NewStreaming(sctx, p)
		for i := 0; i < 3 && st.Next(); i++ {
		}
		if err := st.Err(); err != nil || hops[0].Hop().Sessions() == 0 {
			t.Fatalf("no session on the head while streaming (%v)", err)
		}
		cancel()
		st.Close()
		left := time.Now()
		for _, h := range hops {
			for h.Hop().Sessions() > 0 || h.Shard().Capacity().FreeSessions != h.Shard().Capacity().MaxSessions {
				if time.Since(left) > time.Second {
					t.Fatalf("hop %s still holds a session %s after the client left", h.P2P().ID(), time.Since(left))
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
		t.Logf("every hop free %s after the client left", time.Since(left))
	})
}

// meshp2pExt reads the meshp2p extension field of a response or chunk.
func meshp2pExt(t *testing.T, raw string) (ext struct {
	Reroutes int       `json:"reroutes"`
	Route    []api.Hop `json:"route"`
}, ok bool) {
	t.Helper()
	var v struct {
		M *json.RawMessage `json:"meshp2p"`
	}
	if json.Unmarshal([]byte(raw), &v) != nil || v.M == nil {
		return ext, false
	}
	return ext, json.Unmarshal(*v.M, &ext) == nil
}

// A generation the swarm refuses (here: a hop that admits only route
// tickets, and a gateway that plans locally, without one) is a 503 that
// says why, not a 500.
func TestGatewaySwarmRefusalIs503(t *testing.T) {
	model := testmodels.Path(t, "stories260K.gguf")
	tn := testswarm.New(t)
	stranger := testswarm.New(t).Peer() // a tracker id the hop trusts; it never signs anything here
	tn.Shard(model, &gguf.Range{Start: 0, End: 5}, func(c *node.Config) {
		c.Hop.Admit = session.TicketAdmission(session.TicketPolicy{Network: tn.Network, Trusted: []peer.ID{stranger.P2P().ID()}})
	})
	c := tn.Client()
	waitModel(t, c, "stories260K")
	g := api.NewSwarm(c, api.SwarmConfig{})
	_, err := g.Generate(context.Background(), &api.GenerateRequest{Model: "stories260K", Prompt: "Once upon a time", MaxTokens: 4}, func(api.Delta) {})
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Status != 503 || ae.Code != "generation_failed" || !strings.Contains(ae.Message, "TICKET") {
		t.Fatalf("want a 503 generation_failed naming the ticket refusal, got %v (%#v)", err, ae)
	}
	t.Logf("the client sees: %s", ae.Message)
}

// waitModel waits until the client can route model.
func waitModel(t *testing.T, c *client.Client, model string) client.Model {
	t.Helper()
	m, err := c.Resolve(context.Background(), model, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return m
}
