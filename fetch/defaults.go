package fetch

import "time"

// Defaults of the Fetcher, URL and Progress that are not wire limits
// (those, and the transfer bounds a Server enforces, are in server.go with
// the protocol).
const (
	// DefaultAttempts is how often the Fetcher tries one tensor (from
	// different sources) before the fetch fails: enough to get past a
	// few bad or departed sources without retrying a hopeless fetch
	// forever.
	DefaultAttempts = 6
	// maxBusy bounds the "busy" answers one tensor takes (busyRetry
	// apart) before they count as a failed attempt.
	maxBusy = 500
	// busyRetry is the pause before asking a busy source again: it
	// releases our previous stream after its last write, which is soon.
	busyRetry = 20 * time.Millisecond

	// DefaultURLRetries is how often a URL retries one range request after
	// its first attempt, DefaultURLBackoff the first wait between attempts,
	// doubling up to maxURLBackoff: rides out a server's or proxy's brief
	// hiccup without hammering it.
	DefaultURLRetries = 5
	DefaultURLBackoff = 250 * time.Millisecond
	maxURLBackoff     = 8 * time.Second

	// DefaultProgressInterval is how often a Progress reports while bytes
	// arrive.
	DefaultProgressInterval = time.Second
)
