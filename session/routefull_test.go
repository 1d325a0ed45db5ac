package session

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/neuron-tai/meshp2p/route"
)

// fullFor is a planner whose first n plans find every peer of some layers
// full (route.ErrRouteFull), as a burst of sessions makes adverts say.
type fullFor struct {
	route.Planner
	n     int32
	calls atomic.Int32
	// opaque: the refusal does not say "full" (a tracker's); the origin
	// learns it from Covered.
	opaque bool
}

func (p *fullFor) Plan(ctx context.Context, req route.Request) (*route.Route, error) {
	if p.calls.Add(1) <= p.n {
		return nil, &route.NoRouteError{Fingerprint: req.Fingerprint, NLayer: req.NLayer, MissingStart: 2, MissingEnd: 4, Full: !p.opaque}
	}
	return p.Planner.Plan(ctx, req)
}

// A plan that finds only full peers is waited out beside the NO_CAPACITY
// retry (the wait the API gateway used to do on its own), within
// CapacityWait; a model whose layers nobody serves is reported at once.
func TestOriginWaitsOutFullRoutes(t *testing.T) {
	hops := threeHops(t)
	stages := [][]*fakeHop{{hops[0]}, {hops[1]}, {hops[2]}}
	for _, tc := range []struct {
		name     string
		full     int32
		wait     time.Duration
		wantErr  error
		retries  int
		minCalls int32
		opaque   bool
		covered  func(string, int) bool
	}{
		{"full twice, then room", 2, 0, nil, 2, 3, false, nil},
		{"full for longer than the wait", 1 << 20, 600 * time.Millisecond, route.ErrRouteFull, 0, 2, false, nil},
		{"a refusal that cannot say full, layers covered", 2, 0, nil, 2, 3, true, func(string, int) bool { return true }},
		{"a refusal that cannot say full, layers not covered", 2, 0, route.ErrNoRoute, 0, 1, true, func(string, int) bool { return false }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pl := &fullFor{Planner: stagePlanner{stages}, n: tc.full, opaque: tc.opaque}
			o, _ := newOrigin(t, pl, hops...)
			o.CapacityWait, o.Covered = tc.wait, tc.covered
			res, err := o.Generate(context.Background(), GenerateRequest{Fingerprint: fakeFP, NLayer: fakeNLay, Prompt: []int32{5, 6}, MaxTokens: 4})
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
				t.Fatalf("err %v, want %v", err, tc.wantErr)
			}
			if pl.calls.Load() < tc.minCalls {
				t.Fatalf("planned %d times, want at least %d", pl.calls.Load(), tc.minCalls)
			}
			if tc.wantErr == nil && (res.CapacityRetries != tc.retries || len(res.Tokens) != 4 || res.Reroutes != 0) {
				t.Fatalf("result %+v", res)
			}
		})
	}
	// Layers nobody serves: no wait at all.
	o, _ := newOrigin(t, noRoute{}, hops...)
	start := time.Now()
	_, err := o.Generate(context.Background(), GenerateRequest{Fingerprint: fakeFP, NLayer: fakeNLay, Prompt: []int32{5}, MaxTokens: 2})
	if !errors.Is(err, route.ErrNoRoute) || errors.Is(err, route.ErrRouteFull) || time.Since(start) > 2*time.Second {
		t.Fatalf("err %v after %s", err, time.Since(start))
	}
}

// noRoute plans nothing: layers 2-4 have no peer at all.
type noRoute struct{}

func (noRoute) Plan(_ context.Context, req route.Request) (*route.Route, error) {
	return nil, &route.NoRouteError{Fingerprint: req.Fingerprint, NLayer: req.NLayer, MissingStart: 2, MissingEnd: 4}
}
