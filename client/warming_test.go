package client

import (
	"crypto/rand"
	"errors"
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
)

// A model nobody serves that standby peers offer: listed as warmable,
// answered with a *WarmingError (the retry, the offers) until the warming
// timeout, then ErrWarmingGaveUp (an ErrModelNotFound) — however the
// offers are renewed. A model nobody offers is not warming; one served
// again clears the wait.
func TestWarmingState(t *testing.T) {
	fp := strings.Repeat("cd", 32)
	tab := route.NewTable()
	for range 2 {
		k, _, _ := crypto.GenerateEd25519Key(rand.Reader)
		p, _ := peer.IDFromPrivateKey(k)
		body, _ := proto.Marshal(&meshp2pb.CapabilityAdvert{Offers: []*meshp2pb.ModelOffer{{ModelFingerprint: fp, ModelName: "bee", NLayer: 3, Bytes: 1 << 30}}})
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
	if !ok || !errors.As(err, &we) || we.RetryAfter != 3*time.Second || we.Peers != 2 || !strings.Contains(err.Error(), "retry in 3s") {
		t.Fatalf("first ask: %v (%v)", err, ok)
	}
	if _, ok := c.warmingState(strings.Repeat("ef", 32), "other"); ok {
		t.Fatal("a model nobody offers is warming")
	}
	time.Sleep(400 * time.Millisecond)
	err, _ = c.warmingState(fp, "bee")
	if !errors.Is(err, ErrWarmingGaveUp) || !errors.Is(err, ErrModelNotFound) || !strings.Contains(err.Error(), "no route appeared within 300ms") {
		t.Fatalf("after the timeout: %v", err)
	}
	c.served(fp)
	if err, _ := c.warmingState(fp, "bee"); !errors.As(err, &we) {
		t.Fatalf("asked again after being served: %v, want warming", err)
	}
}
