package kvcache

import (
	"container/list"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/baton-serving/baton/engine"
)

// The prefix cache keeps full pages after the sequences that computed them
// end, so that a later prompt starting with the same tokens attaches them
// instead of computing them again.
//
// A page is keyed by a chain hash: the key of page i covers the key of page
// i-1 and the PageSize tokens of page i, and the first page's parent is a
// seed made of the model fingerprint and the KV layout. Equal keys therefore
// mean equal prefixes (each entry also keeps its parent key and its tokens,
// which a match compares, so a hash collision cannot alias two prefixes).
//
// The cache is one more holder of each page it keeps: it owns one
// reference, exactly like a block table. A cached page with no other
// holder is evictable; those are kept in least-recently-used order (the
// moment the last sequence let go of it) and evicted when Alloc needs
// pages, when the cache reaches its cap, or on Flush. A page that a block
// table holds — a live request, or one whose pages a transfer reads or
// writes — has more than one reference and is never evicted.

// Hash is a prefix cache key.
type Hash uint64

// cacheEntry is one cached page.
type cacheEntry struct {
	hash, parent Hash
	tokens       []int32
	lru          *list.Element // non-nil while evictable (no holder but the cache)
}

// prefixCache is the Pool's cache state, guarded by Pool.mu.
type prefixCache struct {
	seed      Hash
	maxPages  int
	byHash    map[Hash]PageID
	entries   map[PageID]*cacheEntry
	lru       list.List // of PageID, least recently used first
	evictions uint64
	log       eventLog // keys stored and evicted, for routers' indexes
}

// PrefixSeed returns the parent key of a sequence's first page for a model
// fingerprint and the pool's layout: pages of another model or layout never
// match.
func PrefixSeed(fingerprint, layout string) Hash {
	h := sha256.New()
	h.Write([]byte("baton-prefix-v1\x00"))
	h.Write([]byte(fingerprint))
	h.Write([]byte{0})
	h.Write([]byte(layout))
	return Hash(binary.LittleEndian.Uint64(h.Sum(nil)))
}

// ChainHash returns the key of a page holding tokens whose preceding pages
// end in the key parent.
func ChainHash(parent Hash, tokens []int32) Hash {
	h := sha256.New()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(parent))
	h.Write(b[:])
	buf := make([]byte, 4*len(tokens))
	for i, t := range tokens {
		binary.LittleEndian.PutUint32(buf[4*i:], uint32(t))
	}
	h.Write(buf)
	return Hash(binary.LittleEndian.Uint64(h.Sum(nil)))
}

// PageHashes returns the keys of the first n full pages of tokens, pages of
// pageSize tokens, for a sequence whose first page's parent is seed: what a
// peer names the pages by (a decode worker telling prefill which leading
// pages it holds). It returns fewer when tokens has fewer full pages.
func PageHashes(seed Hash, tokens []int32, pageSize, n int) []Hash {
	if pageSize <= 0 {
		return nil
	}
	n = max(min(n, len(tokens)/pageSize), 0)
	out := make([]Hash, n)
	parent := seed
	for i := range out {
		parent = ChainHash(parent, tokens[i*pageSize:(i+1)*pageSize])
		out[i] = parent
	}
	return out
}

// PrefixHashes returns the keys under which this pool caches the first n
// full pages of tokens (PageHashes with the pool's seed), or nil when the
// cache is off.
func (p *Pool) PrefixHashes(tokens []int32, n int) []Hash {
	p.mu.Lock()
	c := p.cache
	p.mu.Unlock()
	if c == nil {
		return nil
	}
	return PageHashes(c.seed, tokens, p.layout.PageSize, n)
}

// EnableCache turns the prefix cache on. fingerprint names the model whose
// keys and values the pages hold; maxPages (in [0, Total]) caps the pages
// the cache keeps. Calling it again changes the cap, evicting what exceeds
// it, and keeps the seed.
func (p *Pool) EnableCache(fingerprint string, maxPages int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if maxPages < 0 || maxPages > len(p.refs) {
		return fmt.Errorf("kvcache: prefix cache of %d pages in a pool of %d: %w", maxPages, len(p.refs), engine.ErrInvalidInput)
	}
	if p.cache == nil {
		p.cache = &prefixCache{
			seed:    PrefixSeed(fingerprint, p.layout.String()),
			byHash:  make(map[Hash]PageID),
			entries: make(map[PageID]*cacheEntry),
		}
	}
	p.cache.maxPages = maxPages
	for len(p.cache.entries) > maxPages && p.evictOne() {
	}
	return nil
}

// CacheEnabled reports whether EnableCache was called.
func (p *Pool) CacheEnabled() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cache != nil
}

// CacheStats counts the prefix cache's pages.
type CacheStats struct {
	// Pages are the cached pages, Evictable those no sequence holds.
	Pages, Evictable, MaxPages int
	// Evictions counts the pages evicted since the pool was made.
	Evictions uint64
}

// CacheStats returns the prefix cache's counts (zero when it is off).
func (p *Pool) CacheStats() CacheStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.cache
	if c == nil {
		return CacheStats{}
	}
	return CacheStats{Pages: len(c.entries), Evictable: c.lru.Len(), MaxPages: c.maxPages, Evictions: c.evictions}
}

// CachedPages returns the cached pages in ascending order, for auditors.
func (p *Pool) CachedPages() []PageID {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cache == nil {
		return nil
	}
	ids := make([]PageID, 0, len(p.cache.entries))
	for id := range p.cache.entries {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// Flush evicts every cached page that no sequence holds and returns how
// many it freed.
func (p *Pool) Flush() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for p.cache != nil && p.evictOne() {
		n++
	}
	return n
}

// evictOne frees the least recently used evictable page; it reports false
// when there is none. p.mu is held.
func (p *Pool) evictOne() bool {
	c := p.cache
	if c == nil || c.lru.Len() == 0 {
		return false
	}
	id := c.lru.Remove(c.lru.Front()).(PageID)
	e := c.entries[id]
	delete(c.entries, id)
	delete(c.byHash, e.hash)
	c.evictions++
	c.log.add(e.hash, false)
	// The cache's reference was the last one.
	p.refs[id] = 0
	p.free = append(p.free, id)
	return true
}

// evictable returns how many pages eviction could free now. p.mu is held.
func (p *Pool) evictable() int {
	if p.cache == nil {
		return 0
	}
	return p.cache.lru.Len()
}

// onRetained and onReleased keep the LRU list equal to the cached pages
// whose only holder is the cache. p.mu is held; refs is the new count.
func (p *Pool) onRetained(id PageID) {
	if p.cache == nil {
		return
	}
	if e := p.cache.entries[id]; e != nil && e.lru != nil {
		p.cache.lru.Remove(e.lru)
		e.lru = nil
	}
}

func (p *Pool) onReleased(id PageID) {
	if p.cache == nil || p.refs[id] != 1 {
		return
	}
	if e := p.cache.entries[id]; e != nil && e.lru == nil {
		e.lru = p.cache.lru.PushBack(id)
	}
}

// MatchPrefix returns the cached pages that hold the longest run of full
// pages at the start of tokens, at most maxPages of them, each with a new
// reference the caller owns (release them as any other page). It returns
// nil when the cache is off or nothing matches.
func (p *Pool) MatchPrefix(tokens []int32, maxPages int) []PageID {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.cache
	if c == nil {
		return nil
	}
	ps := p.layout.PageSize
	var ids []PageID
	parent := c.seed
	for i := 0; i < maxPages && (i+1)*ps <= len(tokens); i++ {
		page := tokens[i*ps : (i+1)*ps]
		h := ChainHash(parent, page)
		id, ok := c.byHash[h]
		if !ok {
			break
		}
		if e := c.entries[id]; e.parent != parent || !slices.Equal(e.tokens, page) {
			break
		}
		ids = append(ids, id)
		parent = h
	}
	for _, id := range ids {
		if p.refs[id] == 1 {
			p.shared++
		}
		p.refs[id]++
		p.onRetained(id)
	}
	return ids
}

// Insert offers a sequence's full pages to the cache: pages[i] holds
// tokens[i*PageSize : (i+1)*PageSize] for every full page of tokens (pages
// past them are ignored). A page whose key is already cached is skipped —
// the cached one stays — and so is everything after a key the cache cannot
// take (it is full of pages that sequences hold). The cache takes its own
// reference; the caller keeps its own. It returns how many pages were added.
func (p *Pool) Insert(tokens []int32, pages []PageID) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.cache
	if c == nil {
		return 0
	}
	ps := p.layout.PageSize
	parent := c.seed
	added := 0
	for i := 0; i < len(pages) && (i+1)*ps <= len(tokens); i++ {
		page := tokens[i*ps : (i+1)*ps]
		h := ChainHash(parent, page)
		id := pages[i]
		if !p.valid(id) || p.refs[id] == 0 {
			return added // not the caller's page: nothing after it either
		}
		if old, ok := c.byHash[h]; ok {
			if e := c.entries[old]; e.parent != parent || !slices.Equal(e.tokens, page) {
				return added // a collision: keep the cached prefix, add nothing past it
			}
			parent = h
			continue
		}
		if _, cached := c.entries[id]; cached {
			return added // the page is cached under another prefix
		}
		for len(c.entries) >= c.maxPages {
			if !p.evictOne() {
				return added
			}
		}
		c.byHash[h] = id
		c.entries[id] = &cacheEntry{hash: h, parent: parent, tokens: slices.Clone(page)}
		c.log.add(h, true)
		if p.refs[id] == 1 {
			p.shared++
		}
		p.refs[id]++
		added++
		parent = h
	}
	return added
}

// cachedOnly reports whether the cache is page id's only holder. p.mu is
// held.
func (p *Pool) cachedOnly(id PageID) bool {
	if p.cache == nil {
		return false
	}
	e := p.cache.entries[id]
	return e != nil && e.lru != nil
}
