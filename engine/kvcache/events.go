package kvcache

import "slices"

// The prefix cache keeps a bounded log of the keys it stores and evicts, so
// that a router can keep an index of what each worker holds and send a
// conversation back to the worker that has its pages. A reader takes a
// snapshot (CacheSnapshot) and then follows the log from the sequence
// number the snapshot gave (CacheEventsSince); a reader that falls behind
// the log's bound is told so and takes a new snapshot. The log costs the
// cache nothing but its append: it never blocks an Alloc or an eviction.

// CacheEvent is one change to the set of keys the prefix cache holds.
type CacheEvent struct {
	Hash Hash
	// Stored is true when the key was added, false when it was evicted.
	Stored bool
}

// DefaultCacheLogEvents bounds the event log: enough for the events of
// several load-report intervals at any prompt rate a worker sustains.
const DefaultCacheLogEvents = 1 << 15

// eventLog is the prefix cache's change log, guarded by Pool.mu.
type eventLog struct {
	events []CacheEvent
	first  uint64 // the sequence number of events[0]
	limit  int
}

func (l *eventLog) add(h Hash, stored bool) {
	if l.limit <= 0 {
		l.limit = DefaultCacheLogEvents
	}
	if len(l.events) >= l.limit {
		// Drop the older half: amortised O(1) per event, and a reader
		// behind the cut learns that it must resynchronise.
		drop := len(l.events) / 2
		l.events = slices.Delete(l.events, 0, drop)
		l.first += uint64(drop)
	}
	l.events = append(l.events, CacheEvent{Hash: h, Stored: stored})
}

func (l *eventLog) next() uint64 { return l.first + uint64(len(l.events)) }

// CacheInfo is what a reader needs to name pages as the cache does: the
// seed of PageHashes and the page size. Enabled is false while the cache
// is off (the rest is then zero).
type CacheInfo struct {
	Enabled  bool
	Seed     Hash
	PageSize int
}

// CacheInfo returns the cache's seed and page size.
func (p *Pool) CacheInfo() CacheInfo {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cache == nil {
		return CacheInfo{}
	}
	return CacheInfo{Enabled: true, Seed: p.cache.seed, PageSize: p.layout.PageSize}
}

// CacheSnapshot returns the keys of every cached page and the sequence
// number from which CacheEventsSince continues the picture. Both are nil
// and 0 while the cache is off.
func (p *Pool) CacheSnapshot() (hashes []Hash, next uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cache == nil {
		return nil, 0
	}
	hashes = make([]Hash, 0, len(p.cache.byHash))
	for h := range p.cache.byHash {
		hashes = append(hashes, h)
	}
	return hashes, p.cache.log.next()
}

// CacheEventsSince returns the cache's changes from sequence number seq on,
// oldest first, at most max of them (max ≤ 0: all), and the sequence
// number that follows them. ok is false when the log no longer holds seq
// (the reader fell behind its bound, or seq is not one it gave out) or the
// cache is off: the reader must take a new snapshot.
func (p *Pool) CacheEventsSince(seq uint64, max int) (events []CacheEvent, next uint64, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cache == nil {
		return nil, 0, false
	}
	l := &p.cache.log
	if seq < l.first || seq > l.next() {
		return nil, l.next(), false
	}
	tail := l.events[seq-l.first:]
	if max > 0 && len(tail) > max {
		tail = tail[:max]
	}
	return slices.Clone(tail), seq + uint64(len(tail)), true
}
