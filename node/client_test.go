package node

import (
	"context"
	"time"

	"github.com/neuron-tai/meshp2p/client"
)

// waitForModel waits until client node c can route model, as `generate`
// does (client.Resolve), and returns its fingerprint and layer count.
func waitForModel(ctx context.Context, c *Node, model string, wait time.Duration) (string, int, error) {
	cl, err := client.New(client.Config{Swarm: c.P2P(), Table: c.Table(), Logger: c.log})
	if err != nil {
		return "", 0, err
	}
	defer cl.Close()
	m, err := cl.Resolve(ctx, model, wait)
	return m.Fingerprint, m.NLayer, err
}
