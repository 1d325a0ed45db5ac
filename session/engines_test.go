package session

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/route"
)

// TestHopMovesRangeGracefully: a hop serving 0-3 moves to 3-6 while a
// generation runs through its old range: the new range admits at once,
// the old one refuses new sessions but the running one finishes with the
// reference tokens, and Drain returns when it has ended. A drain that runs
// out of time ends what is left, and the hop frees it.
func TestHopMovesRangeGracefully(t *testing.T) {
	a, b := startHop(t, 0, 3, nil), startHop(t, 3, 6, nil)
	o, c := newOrigin(t, stagePlanner{[][]*fakeHop{{a}, {b}}}, a, b)
	newEng := newFakeEngine(3, 6)
	drained := make(chan int, 1)
	var once sync.Once
	a.eng.mu.Lock()
	a.eng.onStep = func(steps int) {
		if steps >= 5 {
			once.Do(func() {
				if err := a.svc.AddEngine(newEng); err != nil {
					t.Error(err)
				}
				go func() { drained <- a.svc.Drain(context.Background(), 0, 3) }()
			})
		}
	}
	a.eng.mu.Unlock()
	prompt := []int32{5, 6, 7}
	res, err := o.Generate(context.Background(), GenerateRequest{Fingerprint: fakeFP, NLayer: fakeNLay, Prompt: prompt, MaxTokens: 40})
	if err != nil {
		t.Fatal(err)
	}
	if want := reference(prompt, 40, 0); !equal(res.Tokens, want) || res.Reroutes != 0 {
		t.Fatalf("tokens %v (reroutes %d), want %v", res.Tokens, res.Reroutes, want)
	}
	select {
	case n := <-drained:
		if n != 0 {
			t.Fatalf("drain ended %d sessions; the generation finished on its own", n)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("drain did not return after the session ended")
	}
	if r := a.svc.Ranges(); len(r) != 1 || r[0] != (ServedRange{3, 6, true}) {
		t.Fatalf("ranges after the move: %+v", r)
	}
	waitReleased(t, a, b)

	// The old range is gone: an origin still routing through it is told
	// NO_CAPACITY (it waits for a replica; nobody is blamed); the new
	// range serves.
	o.CapacityWait = 300 * time.Millisecond
	_, err = o.Generate(context.Background(), GenerateRequest{Fingerprint: fakeFP, NLayer: fakeNLay, Prompt: prompt, MaxTokens: 3})
	if frame.Code(err) != meshp2pb.ErrorCode_ERROR_CODE_NO_CAPACITY {
		t.Fatalf("a route through the old range: %v", err)
	}
	z := startHop(t, 0, 3, nil)
	connectAll(c, z.host, a.host)
	moved := route.Hop{Peer: a.host.ID(), Start: 3, End: 6, Addrs: a.host.Addrs()}
	o2 := &Origin{Dialer: c, Key: c.key(), Planner: fixedRoute{[]route.Hop{z.hop(), moved}}, Protocol: o.Protocol, RouteWait: -1, Logger: quiet}
	newEng.mu.Lock()
	newEng.onStep = func(int) { time.Sleep(20 * time.Millisecond) } // slow: the drain runs out first
	newEng.mu.Unlock()
	done := make(chan error, 1)
	go func() {
		_, err := o2.Generate(context.Background(), GenerateRequest{Fingerprint: fakeFP, NLayer: fakeNLay, Prompt: prompt, MaxTokens: 500})
		done <- err
	}()
	for a.svc.Sessions() == 0 {
		time.Sleep(5 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if n := a.svc.Drain(ctx, 3, 6); n != 1 {
		t.Fatalf("a drain out of time ended %d sessions, want 1", n)
	}
	if err := <-done; err == nil {
		t.Fatal("the generation drained away succeeded on a route with no replacement")
	}
	if len(a.svc.Ranges()) != 0 || a.svc.Sessions() != 0 {
		t.Fatalf("after the drain: ranges %+v, %d sessions", a.svc.Ranges(), a.svc.Sessions())
	}
	if err := a.svc.AddEngine(newFakeEngine(3, 6)); err != nil {
		t.Fatal(err)
	}
	if err := a.svc.AddEngine(newFakeEngine(3, 6)); err == nil {
		t.Fatal("a second engine for the same range was accepted")
	}
	// A range that stopped admitting refuses with NO_CAPACITY (retried
	// elsewhere, never held against the peer); an unknown one with
	// RANGE_MISMATCH.
	a.svc.StopAdmitting(3, 6)
	if _, he := a.svc.engineFor(fakeFP, 3, 6); he == nil || he.e.GetCode() != meshp2pb.ErrorCode_ERROR_CODE_NO_CAPACITY {
		t.Fatalf("draining range: %v", he)
	}
	if _, he := a.svc.engineFor(fakeFP, 1, 3); he == nil || he.e.GetCode() != meshp2pb.ErrorCode_ERROR_CODE_RANGE_MISMATCH {
		t.Fatalf("unknown range: %v", he)
	}
	// A range the hop moved away from (0-3, above) is NO_CAPACITY for a
	// while: an origin with the old advert retries elsewhere without
	// blaming the hop.
	if _, he := a.svc.engineFor(fakeFP, 0, 3); he == nil || he.e.GetCode() != meshp2pb.ErrorCode_ERROR_CODE_NO_CAPACITY {
		t.Fatalf("range moved away from: %v", he)
	}
}

type fixedRoute struct{ hops []route.Hop }

func (f fixedRoute) Plan(_ context.Context, req route.Request) (*route.Route, error) {
	if len(req.Exclude) > 0 {
		return nil, &route.NoRouteError{Fingerprint: req.Fingerprint, NLayer: req.NLayer}
	}
	return &route.Route{Fingerprint: req.Fingerprint, NLayer: req.NLayer, Epoch: req.Epoch, Hops: f.hops}, nil
}

// TestHopRetargetsToAnotherModel: a multi-model node's hop switches
// models only once its old ranges are drained (ErrHopBusy before); then
// sessions of the new model run with the reference tokens and sessions
// of the old one are refused MODEL_MISMATCH.
func TestHopRetargetsToAnotherModel(t *testing.T) {
	a, b := startHop(t, 0, 3, nil), startHop(t, 3, 6, nil)
	o, _ := newOrigin(t, stagePlanner{[][]*fakeHop{{a}, {b}}}, a, b)
	prompt := []int32{5, 6, 7}
	if _, err := o.Generate(context.Background(), GenerateRequest{Fingerprint: fakeFP, NLayer: fakeNLay, Prompt: prompt, MaxTokens: 4}); err != nil {
		t.Fatal(err)
	}
	otherFP := "ab" + fakeFP[2:]
	if err := a.svc.Retarget(otherFP, newFakeEngine(0, 3)); !errors.Is(err, ErrHopBusy) {
		t.Fatalf("retarget while serving: %v, want ErrHopBusy", err)
	}
	for _, h := range []*fakeHop{a, b} {
		r := h.svc.Ranges()[0]
		h.svc.Drain(context.Background(), r.Start, r.End)
		if err := h.svc.Retarget(otherFP, newFakeEngine(r.Start, r.End)); err != nil {
			t.Fatal(err)
		}
		if got := h.svc.Fingerprint(); got != otherFP {
			t.Fatalf("fingerprint after retarget: %.16s", got)
		}
	}
	o.CapacityWait = 200 * time.Millisecond
	_, err := o.Generate(context.Background(), GenerateRequest{Fingerprint: fakeFP, NLayer: fakeNLay, Prompt: prompt, MaxTokens: 4})
	if err == nil || !strings.Contains(err.Error(), "MODEL_MISMATCH") {
		t.Fatalf("old model after the switch: %v, want MODEL_MISMATCH", err)
	}
	res, err := o.Generate(context.Background(), GenerateRequest{Fingerprint: otherFP, NLayer: fakeNLay, Prompt: prompt, MaxTokens: 8})
	if err != nil {
		t.Fatal(err)
	}
	if want := reference(prompt, 8, 0); !equal(res.Tokens, want) {
		t.Fatalf("new model: %v, want %v", res.Tokens, want)
	}
}

// TestHopServesTwoModels: a multi-model node's hop serves another whole
// model beside its own (AddModel): sessions of both run with the reference
// tokens, only its own model's steps set its advertised speed, the other
// model drains on its own (DrainModel) and is then refused, and the own
// model cannot be retargeted onto it.
func TestHopServesTwoModels(t *testing.T) {
	a := startHop(t, 0, fakeNLay, nil)
	o, _ := newOrigin(t, stagePlanner{[][]*fakeHop{{a}}}, a)
	otherFP := "cd" + fakeFP[2:]
	if err := a.svc.AddModel(fakeFP, newFakeEngine(0, fakeNLay)); err == nil {
		t.Fatal("AddModel accepted the hop's own model")
	}
	if err := a.svc.AddModel(otherFP, newFakeEngine(0, fakeNLay)); err != nil {
		t.Fatal(err)
	}
	prompt := []int32{5, 6, 7}
	for _, fp := range []string{fakeFP, otherFP} {
		res, err := o.Generate(context.Background(), GenerateRequest{Fingerprint: fp, NLayer: fakeNLay, Prompt: prompt, MaxTokens: 8})
		if err != nil {
			t.Fatalf("model %.4s: %v", fp, err)
		}
		if want := reference(prompt, 8, 0); !equal(res.Tokens, want) {
			t.Fatalf("model %.4s: %v, want %v", fp, res.Tokens, want)
		}
	}
	steps := a.svc.DecodeSteps()
	if _, err := o.Generate(context.Background(), GenerateRequest{Fingerprint: otherFP, NLayer: fakeNLay, Prompt: prompt, MaxTokens: 8}); err != nil {
		t.Fatal(err)
	}
	if a.svc.DecodeSteps() != steps {
		t.Fatal("the other model's steps counted in the hop's own speed")
	}
	if r := a.svc.Ranges(); len(r) != 1 {
		t.Fatalf("ranges of the own model: %+v", r)
	}
	if err := a.svc.Retarget(otherFP, newFakeEngine(0, fakeNLay)); err == nil {
		t.Fatal("retargeted onto a model served beside")
	}
	a.svc.DrainModel(context.Background(), otherFP, 0, fakeNLay)
	o.CapacityWait = 200 * time.Millisecond
	if _, err := o.Generate(context.Background(), GenerateRequest{Fingerprint: otherFP, NLayer: fakeNLay, Prompt: prompt, MaxTokens: 4}); err == nil {
		t.Fatal("the drained model still served")
	}
	if _, err := o.Generate(context.Background(), GenerateRequest{Fingerprint: fakeFP, NLayer: fakeNLay, Prompt: prompt, MaxTokens: 4}); err != nil {
		t.Fatalf("the own model after the other drained: %v", err)
	}
}
