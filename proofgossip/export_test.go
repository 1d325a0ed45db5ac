package proofgossip

// Peers is how many peers this node knows on the proofs topic (tests).
func (g *Gossip) Peers() int { return g.topic.Peers() }

// Stats returns the counts so far (tests).
func (g *Gossip) Stats() Stats {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.stats
}
