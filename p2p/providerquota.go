package p2p

import (
	"context"
	"errors"
	"strings"
	"sync"

	ds "github.com/ipfs/go-datastore"
	dssync "github.com/ipfs/go-datastore/sync"
)

// Provider-record quotas. kad-dht stores every ADD_PROVIDER a DHT server
// receives, for any key, for 48 hours, in an in-memory datastore with no
// bound: one peer could fill a server's memory with records for random
// keys. quotaStore wraps that datastore and refuses a new provider record
// when its provider already holds maxProviderKeysPerPeer records or the
// store holds maxProviderRecords. A meshp2p node provides the keys of its
// advert (at most DiscoveryConfig.MaxKeys, 64), so honest peers stay far
// below the per-peer quota.
const (
	maxProviderKeysPerPeer = 128
	maxProviderRecords     = 1 << 16
	providersPrefix        = "/providers/"
)

// ErrProviderQuota marks a provider record over quota (dropped).
var ErrProviderQuota = errors.New("provider record quota exceeded")

type quotaStore struct {
	ds.Batching
	mu      sync.Mutex
	owner   map[ds.Key]string // stored provider record → its provider
	perPeer map[string]int
	dropped int // records refused over quota
}

func newQuotaStore() *quotaStore {
	return &quotaStore{
		Batching: dssync.MutexWrap(ds.NewMapDatastore()),
		owner:    make(map[ds.Key]string),
		perPeer:  make(map[string]int),
	}
}

// provider returns the provider component of a provider-record key
// (/providers/<key>/<provider>), or "" for any other key.
func provider(k ds.Key) string {
	s := k.String()
	if !strings.HasPrefix(s, providersPrefix) {
		return ""
	}
	rest := s[len(providersPrefix):]
	i := strings.LastIndexByte(rest, '/')
	if i <= 0 || i == len(rest)-1 {
		return ""
	}
	return rest[i+1:]
}

// admit accounts for a Put of k; it fails when k is a new provider record
// over quota.
func (q *quotaStore) admit(k ds.Key) error {
	p := provider(k)
	if p == "" {
		return nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if _, ok := q.owner[k]; ok {
		return nil // a refresh of a record we hold
	}
	if q.perPeer[p] >= maxProviderKeysPerPeer || len(q.owner) >= maxProviderRecords {
		q.dropped++
		return ErrProviderQuota
	}
	q.owner[k] = p
	q.perPeer[p]++
	return nil
}

func (q *quotaStore) forget(k ds.Key) {
	q.mu.Lock()
	defer q.mu.Unlock()
	p, ok := q.owner[k]
	if !ok {
		return
	}
	delete(q.owner, k)
	if q.perPeer[p]--; q.perPeer[p] <= 0 {
		delete(q.perPeer, p)
	}
}

// records returns how many provider records p holds here.
func (q *quotaStore) records(p string) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.perPeer[p]
}

// Put stores k unless it is a provider record over quota, which is dropped
// without an error: kad-dht flushes buffered records in one batch, and an
// error would fail (and eventually discard) the honest records in it.
func (q *quotaStore) Put(ctx context.Context, k ds.Key, v []byte) error {
	if q.admit(k) != nil {
		return nil
	}
	return q.Batching.Put(ctx, k, v)
}

func (q *quotaStore) Delete(ctx context.Context, k ds.Key) error {
	q.forget(k)
	return q.Batching.Delete(ctx, k)
}

func (q *quotaStore) Batch(ctx context.Context) (ds.Batch, error) {
	b, err := q.Batching.Batch(ctx)
	if err != nil {
		return nil, err
	}
	return &quotaBatch{Batch: b, q: q}, nil
}

// quotaBatch accounts for puts and deletes as they are queued (the map
// datastore underneath never fails a commit).
type quotaBatch struct {
	ds.Batch
	q *quotaStore
}

func (b *quotaBatch) Put(ctx context.Context, k ds.Key, v []byte) error {
	if b.q.admit(k) != nil {
		return nil // dropped: see quotaStore.Put
	}
	return b.Batch.Put(ctx, k, v)
}

func (b *quotaBatch) Delete(ctx context.Context, k ds.Key) error {
	b.q.forget(k)
	return b.Batch.Delete(ctx, k)
}
