package client

import (
	"slices"

	"github.com/neuron-tai/meshp2p/route"
)

// vocabSources are the peers advertising model fp that serve its
// vocabulary, the ones the origin's failure memory avoids last: a peer
// blamed for a failed generation (in this run or, for `generate`, an
// earlier one: internal/failfile) is asked only when no other peer that
// holds the vocabulary gave it, so a silent liar does not cost the
// vocabulary's transfer timeout again.
func (c *Client) vocabSources(fp string) []route.Shard {
	var out []route.Shard
	for _, s := range c.cfg.Table.Shards(fp) {
		if s.HasVocab {
			out = append(out, s)
		}
	}
	if c.cfg.Origin == nil || c.cfg.Origin.Failures == nil {
		return out
	}
	avoided := func(s route.Shard) int {
		if c.cfg.Origin.Failures.Avoided(s.Peer) {
			return 1
		}
		return 0
	}
	slices.SortStableFunc(out, func(a, b route.Shard) int { return avoided(a) - avoided(b) })
	return out
}
