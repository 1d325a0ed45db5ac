package client

import "time"

// The client's defaults, each with its reason. The route-session
// protocol's timeouts live in session/defaults.go, the vocabulary
// transfer's in vocab (vocab.TransferTimeout).
const (
	// DefaultWait is how long `generate` waits for peers covering the
	// model (nodes may still be starting).
	DefaultWait = 30 * time.Second
	// APIResolveWait bounds how long an API request for a model the table
	// does not know waits for discovery before it is answered 404: a
	// gateway's table is kept warm, so a longer wait only delays the
	// answer to a typo.
	APIResolveWait = 3 * time.Second
	// WaitLookupTimeout and WaitLookupInterval: how Resolve re-pulls
	// adverts from connected peers and asks the DHT while it waits for
	// peers covering the model (the pull on connect usually answers first;
	// this covers peers that learnt of the model after we connected).
	WaitLookupTimeout  = 5 * time.Second
	WaitLookupInterval = 2 * time.Second
	// SettleGap: a client waiting for a route takes the swarm's adverts as
	// all there is once it has pulled from every connected peer twice,
	// SettleGap apart (p2p.Discovery.Settle); then a model or layers
	// nobody serves fail at once instead of after the whole wait. The
	// second look catches an advert that was on its way to the peer
	// during the first (it takes milliseconds on a live link).
	SettleGap = time.Second
	// WaitUnreachableCheck is how often Resolve checks whether every
	// bootstrap peer refused us for a reason waiting will not fix.
	WaitUnreachableCheck = 250 * time.Millisecond
	// MaxVocabSources bounds the peers one vocabulary fetch asks (the
	// next when one fails or after vocab.HedgeDelay, each transfer for up
	// to vocab.TransferTimeout) before it gives up.
	MaxVocabSources = 4
	// MaxVocabs bounds the vocabularies a client keeps loaded (one per
	// model; a gateway serving many models).
	MaxVocabs = 32
	// RefreshInterval is how often a long-lived client (the API gateway,
	// Config.RefreshAdverts) re-pulls adverts from its peers, on top of
	// gossip, to keep its table current.
	RefreshInterval = 30 * time.Second
	// LookupTimeout bounds one such pull.
	LookupTimeout = 3 * time.Second
)
