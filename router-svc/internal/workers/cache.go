package workers

import (
	"math"
	"sync"
	"time"

	"github.com/baton-serving/baton/engine/kvcache"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
)

// The router's picture of each worker's prefix cache. Workers send the
// keys of the pages they store and evict beside their load reports
// (WatchLoadRequest.cache_events); a worker's index starts from the
// snapshot its stream opens with and follows the changes after it. When
// the stream breaks, the index is forgotten at once — the worker is scored
// as holding nothing — until a new stream's snapshot arrives: a worker
// that died or restarted holds none of what it used to.

// cacheIndex is one worker's cached page keys.
//
// Beside the keys the worker reported, it keeps those of the prompts the
// router has just sent it (routed), for routedTTL: a conversation's next
// turn often arrives before the report that carries its previous turn's
// pages (think times shorter than --load-interval), and without them it
// would be scored as a stranger. A routed key is dropped when the worker
// reports it stored or evicted, when it expires, and with everything else
// when the stream breaks.
type cacheIndex struct {
	mu       sync.RWMutex
	enabled  bool
	seed     uint64
	pageSize int
	keys     map[uint64]struct{}
	routed   map[uint64]time.Time // keys of prompts routed here, not yet reported
	pruned   time.Time            // when routed was last swept for expired keys
}

// routedTTL is how long the keys of a prompt the router sent a worker
// count as held before the worker's own report says so.
const routedTTL = 10 * time.Second

// apply folds one report's changes in.
func (c *cacheIndex) apply(ev *batonv1.CacheEvents) {
	if ev == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !ev.GetEnabled() {
		c.enabled, c.keys, c.routed = false, nil, nil
		return
	}
	if ev.GetSnapshot() || c.keys == nil || c.seed != ev.GetSeed() || c.pageSize != int(ev.GetPageSize()) {
		// A change never arrives before its stream's snapshot, but a
		// worker that changed its keys' seed is taken as new too.
		c.keys = make(map[uint64]struct{}, len(ev.GetStored()))
	}
	c.enabled, c.seed, c.pageSize = true, ev.GetSeed(), int(ev.GetPageSize())
	for _, h := range ev.GetStored() {
		c.keys[h] = struct{}{}
		delete(c.routed, h)
	}
	for _, h := range ev.GetRemoved() {
		delete(c.keys, h)
		delete(c.routed, h)
	}
	// Expired routed keys are swept at most every half TTL, so that a
	// report does not walk a large map each time (holds ignores them
	// meanwhile).
	if now := time.Now(); len(c.routed) > 0 && now.Sub(c.pruned) > routedTTL/2 {
		c.pruned = now
		for h, at := range c.routed {
			if now.Sub(at) > routedTTL {
				delete(c.routed, h)
			}
		}
	}
}

// layout returns the seed and page size of the worker's keys, ok false
// while its cache is off or unknown.
func (c *cacheIndex) layout() (seed uint64, pageSize int, ok bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.seed, c.pageSize, c.enabled && c.pageSize > 0
}

// reset forgets everything: the worker is taken to hold nothing.
func (c *cacheIndex) reset() {
	c.mu.Lock()
	c.enabled, c.keys, c.routed = false, nil, nil
	c.mu.Unlock()
}

// NoteRouted notes that q's prompt was sent to the worker: its reusable pages
// count as held until the worker's reports take over (see cacheIndex). The
// router calls it when it routes the prompt and again when the request
// ends, which is when the worker offers the pages to its cache.
func (w *Worker) NoteRouted(q *Query) {
	c := &w.cache
	seed, ps, ok := c.layout()
	if q == nil || !ok {
		return
	}
	keys := q.pageKeys(seed, ps) // hashed outside the lock
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.enabled || c.seed != seed || c.pageSize != ps {
		return // reset or resynchronised meanwhile
	}
	for _, k := range keys {
		if _, ok := c.keys[k]; ok {
			continue
		}
		if c.routed == nil {
			c.routed = map[uint64]time.Time{}
		}
		c.routed[k] = now
	}
}

// CachePages is how many page keys the router's index holds for the worker
// by its reports (0 while its stream is down or its cache is off).
func (w *Worker) CachePages() int {
	w.cache.mu.RLock()
	defer w.cache.mu.RUnlock()
	return len(w.cache.keys)
}

// Prefix is how much of a prompt a worker holds by the router's index.
type Prefix struct {
	// Total is the prompt's reusable leading pages (full pages before the
	// one of its last token; 0 when the request reuses nothing, as with
	// prompt logprobs).
	Total int
	// Held is the leading run of them the index holds: reported by the
	// worker, or routed to it just now (the router's estimate, which
	// routing uses).
	Held int
	// Reported is the leading run the worker's own reports hold.
	Reported int
}

// CachedPrefix returns how much of q's prompt the worker's prefix cache
// holds, by the router's index.
func (w *Worker) CachedPrefix(q *Query) Prefix {
	if q == nil || q.NoReuse {
		return Prefix{}
	}
	c := &w.cache
	seed, ps, ok := c.layout()
	if !ok {
		ps = int(w.Info().GetKvLayout().GetPageSizeTokens())
		if ps <= 0 {
			ps = kvcache.DefaultPageSize
		}
		return Prefix{Total: q.reusable(ps)}
	}
	keys := q.pageKeys(seed, ps) // hashed outside the lock
	now := time.Now()
	out := Prefix{Total: len(keys)}
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.seed != seed || c.pageSize != ps {
		return out
	}
	reported := true
	for _, k := range keys {
		if _, ok := c.keys[k]; ok && reported {
			out.Reported++
		} else {
			reported = false
			if at, ok := c.routed[k]; !ok || now.Sub(at) > routedTTL {
				break
			}
		}
		out.Held++
	}
	return out
}

// Query is what a pick knows of the request it routes: its prompt, whose
// page keys the cache-aware scorer computes once for each (seed, page
// size) among the workers. A Query is used by one pick at a time.
type Query struct {
	// Tokens is the prompt.
	Tokens []int32
	// NoReuse: the request computes its whole prompt whatever the workers
	// hold (it asks for prompt logprobs).
	NoReuse bool

	mu   sync.Mutex
	keys map[queryKey][]uint64
}

type queryKey struct {
	seed     uint64
	pageSize int
}

// reusable is how many of the prompt's pages a worker could attach from
// its cache: full pages only, and never the one holding the last prompt
// token, which a request always computes (its logits start the output).
func (q *Query) reusable(pageSize int) int {
	if pageSize <= 0 || len(q.Tokens) == 0 {
		return 0
	}
	return (len(q.Tokens) - 1) / pageSize
}

func (q *Query) pageKeys(seed uint64, pageSize int) []uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	k := queryKey{seed, pageSize}
	if ks, ok := q.keys[k]; ok {
		return ks
	}
	hs := kvcache.PageHashes(kvcache.Hash(seed), q.Tokens, pageSize, q.reusable(pageSize))
	ks := make([]uint64, len(hs))
	for i, h := range hs {
		ks[i] = uint64(h)
	}
	if q.keys == nil {
		q.keys = map[queryKey][]uint64{}
	}
	q.keys[k] = ks
	return ks
}

// CacheScorer prefers the worker whose prefix cache holds the most of the
// prompt: the share of the prompt's reusable leading pages that the
// router's index of the worker holds, in [0, 1] (0 for every worker when
// the prompt has no full page to reuse, or the pick has no Query), and 0
// for a worker more than CacheAwareMaxImbalance busier than the least
// loaded candidate.
type CacheScorer struct{}

// Name implements Scorer.
func (CacheScorer) Name() string { return "prefix-cache" }

// Score implements Scorer.
func (CacheScorer) Score(q *Query, ws []*Worker, scores []float64) {
	if q == nil || q.NoReuse || len(ws) == 0 {
		return
	}
	// The guard counts requests only: the KV fraction that Load adds
	// breaks ties between equally busy workers, and counted here it made
	// a holder exactly CacheAwareMaxImbalance requests ahead (4 + 0.004)
	// lose its conversations to an idle worker.
	least := int64(math.MaxInt64)
	for _, w := range ws {
		least = min(least, Requests(w))
	}
	for i, w := range ws {
		if Requests(w)-least > CacheAwareMaxImbalance {
			continue // too far behind the least loaded: load decides
		}
		if p := w.CachedPrefix(q); p.Total > 0 {
			scores[i] = float64(p.Held) / float64(p.Total)
		}
	}
}

// CacheAwareMaxImbalance is how many more requests (Requests) than the
// least loaded candidate a worker may have and still be scored by what it holds.
// Past it the worker scores as holding nothing, so that load decides: a
// prefix every request shares (a system prompt, tool definitions) would
// otherwise pin all traffic to the first worker that computed it, since a
// worker holding the whole prompt outscores any idle stranger by the
// weights alone (2/3 against at most 1/3). SGLang's router guards its
// cache-aware policy with a balance threshold the same way.
const CacheAwareMaxImbalance = 4
