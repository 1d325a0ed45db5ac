package client

import (
	"context"
	"crypto/rand"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"google.golang.org/protobuf/proto"

	"github.com/neuron-tai/meshp2p/demand"
	"github.com/neuron-tai/meshp2p/p2p"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/route"
	"github.com/neuron-tai/meshp2p/session"
)

// A model nobody serves that peers offer: listed as warmable,
// answered with a *WarmingError (the retry, the offers) until the warming
// timeout, then ErrWarmingGaveUp (an ErrModelNotFound) — however the
// offers are renewed. A model nobody offers is not warming; one served
// again clears the wait.
func TestWarmingState(t *testing.T) {
	fp := strings.Repeat("cd", 32)
	tab := route.NewTable()
	for i := range 2 {
		k, _, _ := crypto.GenerateEd25519Key(rand.Reader)
		p, _ := peer.IDFromPrivateKey(k)
		body, _ := proto.Marshal(&meshp2pb.CapabilityAdvert{Offers: []*meshp2pb.ModelOffer{{ModelFingerprint: fp, ModelName: "bee", NLayer: 3, Bytes: 1 << 30, Pinned: i == 0}}})
		tab.Apply(p2p.Advert{Peer: p, Body: body, ExpiresAt: time.Now().Add(time.Minute)})
	}
	w := demand.NewWarm(demand.WarmConfig{Timeout: 300 * time.Millisecond, RetryAfter: 3 * time.Second})
	c := &Client{cfg: Config{Table: tab}, created: map[string]int64{}, warming: w, warmCfg: w.Config()}
	ms := c.Models()
	if len(ms) != 1 || !ms[0].Warmable || ms[0].Offers != 2 || ms[0].ID != "bee" || ms[0].NLayer != 3 {
		t.Fatalf("models: %+v", ms)
	}
	err, ok := c.warmingState(fp, "bee")
	var we *WarmingError
	if !ok || !errors.As(err, &we) || we.RetryAfter != 3*time.Second || we.Peers != 2 || we.Pinned != 1 || !strings.Contains(err.Error(), "retry in 3s") ||
		strings.Contains(err.Error(), "last route") {
		t.Fatalf("first ask: %v (%v)", err, ok)
	}
	c.cfg.Demand = demand.NewMeter(time.Now())
	c.countRefused("bee", err)
	if r, _ := c.cfg.Demand.Take(time.Now().Add(time.Second), "me"); r.Models[fp].Requests == 0 || r.Models[fp].Refused == 0 {
		t.Fatalf("a warming answer not counted as demand: %+v", r)
	}
	if _, ok := c.warmingState(strings.Repeat("ef", 32), "other"); ok {
		t.Fatal("a model nobody offers is warming")
	}
	time.Sleep(400 * time.Millisecond)
	err, _ = c.warmingState(fp, "bee")
	if !errors.Is(err, ErrWarmingGaveUp) || !errors.Is(err, ErrModelNotFound) || !strings.Contains(err.Error(), "no route appeared within 300ms") {
		t.Fatalf("after the timeout: %v", err)
	}
	c.countRefused("bee", err) // still demand: the model loads once a peer can
	if r, _ := c.cfg.Demand.Take(time.Now().Add(2*time.Second), "me"); r.Models[fp].Refused == 0 {
		t.Fatalf("a request after warming gave up not counted: %+v", r)
	}
	c.served(fp)
	if err, _ := c.warmingState(fp, "bee"); !errors.As(err, &we) {
		t.Fatalf("asked again after being served: %v, want warming", err)
	}
}

// stubHost only lets a test client count as one that fetches
// vocabularies; no stream is opened through it (no peer offers one).
type stubHost struct{ session.Host }

// Peers switching to a model advertise its planned windows before they
// load it, covering every layer with no vocabulary offered: the request is
// warming (503 with Retry-After from the API), not "no vocabulary" (a 503
// a client cannot time). Seen in TestManyModelsDemandMoves on a CI run.
func TestWarmingWhilePlannedWindowsCover(t *testing.T) {
	fp := strings.Repeat("ab", 32)
	tab := route.NewTable()
	for i := range 2 {
		k, _, _ := crypto.GenerateEd25519Key(rand.Reader)
		p, _ := peer.IDFromPrivateKey(k)
		body, _ := proto.Marshal(&meshp2pb.CapabilityAdvert{
			Shards: []*meshp2pb.ShardAdvert{{ModelFingerprint: fp, ModelName: "bee", NLayer: 4, Start: uint32(2 * i), End: uint32(2*i + 2),
				NEmbd: 8, WireDtypes: []meshp2pb.DType{meshp2pb.DType_DTYPE_F32}, Capacity: &meshp2pb.ShardCapacity{}}},
			Offers: []*meshp2pb.ModelOffer{{ModelFingerprint: fp, ModelName: "bee", NLayer: 4, Bytes: 1 << 20}},
		})
		tab.Apply(p2p.Advert{Peer: p, Body: body, ExpiresAt: time.Now().Add(time.Minute)})
	}
	if !tab.Covers(fp, 4) {
		t.Fatal("the planned windows do not cover the model: the test tests nothing")
	}
	w := demand.NewWarm(demand.WarmConfig{Timeout: time.Minute, RetryAfter: 2 * time.Second})
	c := &Client{cfg: Config{Table: tab, Host: stubHost{}, LoadVocab: func(context.Context, string) (Vocab, error) { return nil, errors.New("not called") }},
		log: slog.Default(), vocabs: map[string]*vocabEntry{}, created: map[string]int64{}, warming: w, warmCfg: w.Config()}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	defer c.Close()
	_, err := c.routable(context.Background(), "bee")
	var we *WarmingError
	if !errors.As(err, &we) || we.RetryAfter != 2*time.Second {
		t.Fatalf("covered by planned windows only: %v, want a WarmingError", err)
	}
}
