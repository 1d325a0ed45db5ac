package api

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"
)

// run is one generation in flight, shared by every API shape: the backend
// runs in its own goroutine and the handler writes what it produced, so a
// slow client never stalls the route (what it has not read yet is
// bounded by max_tokens).
type run struct {
	mu      sync.Mutex
	pending update // produced, not yet taken
	all     update // everything produced (Text, ToolCalls, Logprobs)
	tokens  int
	info    RouteInfo
	infoSeq int
	seenSeq int
	notify  chan struct{}
	done    chan struct{}
	res     *GenerateResult
	err     error
	start   time.Time
}

// update is what a run produced since the previous one was taken.
type update struct {
	Text      string
	ToolCalls []ToolCallDelta
	Logprobs  []TokenLogprob
	// Deltas are the same text, fragments and logprobs in the order the
	// backend produced them (Text and ToolCalls merge them: a shape whose
	// events depend on the order, e.g. a text block closed by a call,
	// walks Deltas).
	Deltas []Delta
	// Tokens is the count of tokens generated so far (0: the first has
	// not arrived: nothing may be written yet, errors keep their status).
	Tokens int
	// Route is the route now; Rerouted is true when it changed since the
	// last update (the first route included; in the updates drive hands a
	// streamer, since the streamer's last one).
	Route    RouteInfo
	Rerouted bool
	// Done: the generation ended with Res (and Err when it failed).
	Done bool
	Res  *GenerateResult
	Err  error
}

// startRun starts gen on the backend under ctx.
func (s *Server) startRun(ctx context.Context, gen *GenerateRequest) *run {
	g := &run{notify: make(chan struct{}, 1), done: make(chan struct{}), start: time.Now()}
	gen.OnRoute = func(ri RouteInfo) {
		g.mu.Lock()
		g.info, g.infoSeq = ri, g.infoSeq+1
		g.mu.Unlock()
		g.signal()
	}
	go func() {
		defer close(g.done)
		res, err := s.cfg.Backend.Generate(ctx, gen, func(d Delta) {
			g.mu.Lock()
			g.tokens++
			for _, u := range []*update{&g.pending, &g.all} {
				u.Text += d.Text
				u.ToolCalls = append(u.ToolCalls, d.ToolCalls...)
				u.Logprobs = append(u.Logprobs, d.Logprobs...)
			}
			if d.Text != "" || len(d.ToolCalls) > 0 || len(d.Logprobs) > 0 {
				g.pending.Deltas = append(g.pending.Deltas, d)
			}
			g.mu.Unlock()
			g.signal()
		})
		g.mu.Lock()
		g.res, g.err = res, err
		g.mu.Unlock()
	}()
	return g
}

func (g *run) signal() {
	select {
	case g.notify <- struct{}{}:
	default:
	}
}

// next waits for news and takes it; false when ctx ended first (the run
// is then over too: its context is ctx or a child).
func (g *run) next(ctx context.Context) (update, bool) {
	var done bool
	select {
	case <-g.notify:
	case <-g.done:
		done = true
	case <-ctx.Done():
		<-g.done
		return update{}, false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	u := g.pending
	g.pending = update{}
	u.Tokens, u.Route = g.tokens, g.info
	if g.infoSeq != g.seenSeq {
		u.Rerouted, g.seenSeq = true, g.infoSeq
	}
	if done {
		u.Done, u.Res, u.Err = true, g.res, g.err
	}
	return u, true
}

// wait waits for the end and returns everything the run produced.
func (g *run) wait() update {
	<-g.done
	g.mu.Lock()
	defer g.mu.Unlock()
	u := g.all
	u.Tokens, u.Route, u.Done, u.Res, u.Err = g.tokens, g.info, true, g.res, g.err
	return u
}

// admit takes a generation slot (waiting in the queue), writing the error
// with write when there is none; release must be called when done.
func (s *Server) admit(w http.ResponseWriter, r *http.Request, write func(http.ResponseWriter, *Error)) (release func(), ok bool) {
	release, err := s.limit.acquire(r.Context())
	if err != nil {
		if e := (*Error)(nil); errors.As(err, &e) {
			write(w, e)
		}
		return nil, false
	}
	return release, true
}

// logRun logs a finished request (WARN when it re-routed).
func (s *Server) logRun(r *http.Request, model string, stream bool, status int, g *run) {
	<-g.done
	attrs := []any{"path", r.URL.Path, "model", model, "stream", stream, "status", status, "ms", time.Since(g.start).Milliseconds()}
	if g.res != nil {
		attrs = append(attrs, "completion_tokens", g.res.CompletionTokens, "reroutes", g.res.Reroutes)
		if g.res.Reroutes > 0 {
			s.log.Warn("api generation re-routed around failed hops", attrs...)
			return
		}
	}
	if g.err != nil && status != 0 {
		attrs = append(attrs, "err", g.err)
	}
	s.log.Info("api request", attrs...)
}
