package p2p

import (
	"context"
	"encoding/base32"
	"fmt"
	"testing"
	"time"
)

// One peer cannot fill a DHT server with provider records: past its quota
// the records are dropped; honest peers keep theirs.
func TestProviderQuota(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	server := bootstrapNode(t, nil)
	client := func(c *Config) { withBootstrap(server)(c); c.DHTMode = DHTModeClient }
	flooder := newTestNode(t, client)
	honest := newTestNode(t, client)
	waitFor(ctx, t, "LAN routing tables", func() bool {
		return flooder.kad.LAN.RoutingTable().Size() > 0 && honest.kad.LAN.RoutingTable().Size() > 0
	})
	// Past kad-dht's 256-record write buffer, so the records reach the
	// datastore (and its quota).
	for i := range 300 {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_ = flooder.kad.LAN.Provide(pctx, keyCID("test", fmt.Sprintf("junk-%d", i)), true)
		cancel()
	}
	if err := honest.kad.LAN.Provide(ctx, keyCID("test", "real-model"), true); err != nil {
		t.Fatal(err)
	}
	enc := func(n *Node) string {
		return base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString([]byte(n.ID()))
	}
	store := server.provStores[0]
	if got := store.records(enc(flooder)); got != maxProviderKeysPerPeer {
		t.Fatalf("flooder holds %d provider records on the server, want the quota %d", got, maxProviderKeysPerPeer)
	}
	// ADD_PROVIDER is fire-and-forget: poll.
	waitFor(ctx, t, "the honest provider record on the server", func() bool {
		provs, err := server.kad.LAN.ProviderStore().GetProviders(ctx, keyCID("test", "real-model").Hash())
		return err == nil && len(provs) == 1 && provs[0].ID == honest.ID()
	})
}
