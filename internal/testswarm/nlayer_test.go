package testswarm_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"google.golang.org/protobuf/proto"

	"github.com/neuron-tai/meshp2p/client"
	"github.com/neuron-tai/meshp2p/internal/testmodels"
	"github.com/neuron-tai/meshp2p/internal/testswarm"
	"github.com/neuron-tai/meshp2p/node"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/route"
	"github.com/neuron-tai/meshp2p/tracker"
)

// hostileAdvert makes n publish one validly signed advert listing many
// in-bounds shards of model fp (named name) that all claim nLayer layers:
// the layer-count vote poisoning of issue 21 (attack 1), from one identity.
func hostileAdvert(t *testing.T, n *node.Node, fp, name string, nLayer, shards int) {
	t.Helper()
	ca := &meshp2pb.CapabilityAdvert{}
	for i := range shards {
		start := i % nLayer
		ca.Shards = append(ca.Shards, &meshp2pb.ShardAdvert{ModelFingerprint: fp, ModelName: name, NLayer: uint32(nLayer),
			Start: uint32(start), End: uint32(start + 1), NEmbd: 64, Arch: "llama"})
	}
	body, err := proto.Marshal(ca)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.P2P().Discovery().SetLocalAdvert([]string{fp, node.NameKey(name)}, body); err != nil {
		t.Fatal(err)
	}
}

// One identity advertising ~120 shards of the real model's fingerprint
// that claim another layer count does not stop a client from generating:
// the client plans with the layer count its verified vocabulary gives, and
// the liar's shards, of another count, are simply not used.
func TestLayerCountPoisoningOneIdentity(t *testing.T) {
	model := testmodels.Path(t, "stories260K.gguf")
	tn := testswarm.New(t)
	honest := tn.Shard(model, nil, nil)
	fp, nl := honest.Fingerprint(), honest.Info().NLayer
	liar := tn.Peer()
	hostileAdvert(t, liar, fp, "stories260K", nl-1, 120)
	c := tn.Client()
	// Wait until the client's table holds the hostile advert too.
	deadline := time.Now().Add(30 * time.Second)
	for {
		lies := 0
		for _, s := range c.Table().Shards(fp) {
			if s.Peer == liar.P2P().ID() {
				lies++
			}
		}
		if lies >= 100 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the client's table holds %d of the liar's shards after 30s", lies)
		}
		time.Sleep(50 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := c.Generate(ctx, client.Request{Model: "stories260K", Wait: 10 * time.Second, WaitForRoute: true,
		Prompt: client.Prompt{Text: "Once upon a time"}, MaxTokens: 4})
	if err != nil {
		t.Fatalf("generate with a poisoned layer-count vote: %v", err)
	}
	if res.Model.NLayer != nl || len(res.Tokens) == 0 {
		t.Fatalf("generated %d tokens over %d layers; want some over the model's %d", len(res.Tokens), res.Model.NLayer, nl)
	}
}

// The tracker too: it plans with the layer count the model's vocabulary
// proves (fetched from a peer that advertises it, verified against the
// fingerprint), so one identity's ~120 shards claiming another count do
// not make it refuse the real count; the liar's count is refused.
func TestTrackerLayerCountPoisoningOneIdentity(t *testing.T) {
	model := testmodels.Path(t, "stories260K.gguf")
	tn := testswarm.New(t)
	honest := tn.Shard(model, nil, nil)
	fp, nl := honest.Fingerprint(), honest.Info().NLayer
	pc := node.TestRelax(node.Preset(node.PresetRelay))
	pc.Network, pc.DataDir, pc.ListenAddrs = tn.Network, t.TempDir(), node.Preset(node.PresetTest).ListenAddrs
	pc.Bootstrap = []peer.AddrInfo{honest.P2P().AddrInfo()}
	tr, err := tracker.Start(context.Background(), tracker.Config{P2P: pc})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.Close() })
	liar := tn.Peer()
	hostileAdvert(t, liar, fp, "stories260K", nl-1, 120)
	deadline := time.Now().Add(30 * time.Second)
	for {
		lies, real := 0, 0
		for _, s := range tr.Table().Shards(fp) {
			if s.Peer == liar.P2P().ID() {
				lies++
			} else if s.NLayer == nl {
				real++
			}
		}
		if lies >= 100 && real > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the tracker's table holds %d of the liar's shards and %d honest ones after 30s", lies, real)
		}
		time.Sleep(50 * time.Millisecond)
	}
	origin := tn.Peer()
	// The origin checks each ticket's hops against its own table, as a
	// client does once it has resolved the model: wait until it holds
	// the honest shard (a peer just started may not yet).
	for !slices.ContainsFunc(origin.Table().Shards(fp), func(s route.Shard) bool { return s.Peer == honest.P2P().ID() }) {
		if time.Now().After(deadline) {
			t.Fatal("the origin never learnt the honest shard's advert")
		}
		time.Sleep(50 * time.Millisecond)
	}
	planner := origin.TrackerPlanner([]peer.AddrInfo{tr.P2P().AddrInfo()}, true)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	plan := func(n int) (*route.Route, error) {
		for {
			rt, err := planner.Plan(ctx, route.Request{Fingerprint: fp, NLayer: n, Epoch: 1})
			if !errors.Is(err, route.ErrTrackerBusy) || ctx.Err() != nil { // busy: verifying, retry
				return rt, err
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	rt, err := plan(nl)
	if err != nil {
		t.Fatalf("tracker with a poisoned layer-count vote: %v", err)
	}
	if len(rt.Hops) == 0 || rt.Hops[len(rt.Hops)-1].End != nl {
		t.Fatalf("route %v does not cover %d layers", rt.Hops, nl)
	}
	if _, err := plan(nl - 1); err == nil || !strings.Contains(err.Error(), "layers") {
		t.Fatalf("a route for the liar's %d layers: %v", nl-1, err)
	}
}
