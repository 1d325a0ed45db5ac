package p2p

import (
	"context"
	"fmt"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/peer"
)

// MaxTopicMessage bounds one message on a topic joined with Join: gossipsub
// reads no larger message (adverts keep their own, smaller bound).
const MaxTopicMessage = 1 << 20

// TopicVerdict is a topic validator's verdict on one message.
type TopicVerdict int

const (
	// TopicAccept delivers the message here and forwards it.
	TopicAccept TopicVerdict = iota
	// TopicIgnore drops it without penalty (duplicates, over a rate).
	TopicIgnore
	// TopicReject drops it and lowers the forwarder's gossip score
	// (malformed or forged: three push a peer out of the mesh).
	TopicReject
)

// TopicValidator judges a message before it is delivered or forwarded:
// from is its signed author (gossipsub's strict signing). It must be cheap:
// it runs on gossipsub's validation pipeline.
type TopicValidator func(ctx context.Context, from peer.ID, data []byte) TopicVerdict

// Topic is a swarm-scoped gossip topic other than the adverts'.
type Topic struct {
	topic *pubsub.Topic
	sub   *pubsub.Subscription
}

// Join joins the swarm's topic name ("/meshp2p/<network>/<name>") with
// validate as its validator; messages are at most MaxTopicMessage bytes,
// and invalid ones weigh on the forwarder's score as invalid adverts do.
func (d *Discovery) Join(name string, validate TopicValidator) (*Topic, error) {
	full := "/meshp2p/" + d.n.cfg.Network + "/" + name
	v := func(ctx context.Context, from peer.ID, msg *pubsub.Message) pubsub.ValidationResult {
		switch validate(ctx, msg.GetFrom(), msg.GetData()) {
		case TopicAccept:
			return pubsub.ValidationAccept
		case TopicIgnore:
			return pubsub.ValidationIgnore
		default:
			return pubsub.ValidationReject
		}
	}
	if err := d.ps.RegisterTopicValidator(full, v); err != nil {
		return nil, fmt.Errorf("registering the validator of %s: %w", full, err)
	}
	t, err := d.ps.Join(full)
	if err != nil {
		_ = d.ps.UnregisterTopicValidator(full)
		return nil, fmt.Errorf("joining %s: %w", full, err)
	}
	if err := t.SetScoreParams(&pubsub.TopicScoreParams{
		TopicWeight:                    1,
		TimeInMeshWeight:               0.01,
		TimeInMeshQuantum:              time.Second,
		TimeInMeshCap:                  300,
		InvalidMessageDeliveriesWeight: -100,
		InvalidMessageDeliveriesDecay:  pubsub.ScoreParameterDecay(time.Hour),
	}); err != nil {
		d.log.Debug("topic without score parameters", "topic", full, "err", err)
	}
	sub, err := t.Subscribe(pubsub.WithBufferSize(16))
	if err != nil {
		_ = t.Close()
		_ = d.ps.UnregisterTopicValidator(full)
		return nil, fmt.Errorf("subscribing to %s: %w", full, err)
	}
	return &Topic{topic: t, sub: sub}, nil
}

// Publish signs and sends data to the topic (at most MaxTopicMessage
// bytes); this node's own validator sees it first.
func (t *Topic) Publish(ctx context.Context, data []byte) error {
	if len(data) > MaxTopicMessage {
		return fmt.Errorf("%w: %d bytes, more than the %d a topic carries", ErrAdvertTooLarge, len(data), MaxTopicMessage)
	}
	return t.topic.Publish(ctx, data)
}

// Next blocks for the next accepted message (its author and bytes), this
// node's own included.
func (t *Topic) Next(ctx context.Context) (peer.ID, []byte, error) {
	m, err := t.sub.Next(ctx)
	if err != nil {
		return "", nil, err
	}
	return m.GetFrom(), m.GetData(), nil
}

// Close leaves the topic.
func (t *Topic) Close() {
	t.sub.Cancel()
	_ = t.topic.Close()
}

// Peers is how many peers this node knows on the topic.
func (t *Topic) Peers() int { return len(t.topic.ListPeers()) }
