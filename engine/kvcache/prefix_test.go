package kvcache

import (
	"errors"
	"slices"
	"testing"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/kernels/quant"
)

// seqTokens returns n tokens starting at from (page size 4 in these tests).
func seqTokens(from, n int) []int32 {
	t := make([]int32, n)
	for i := range t {
		t[i] = int32(from + i)
	}
	return t
}

func cachedPool(t *testing.T, pages, maxCached int) *Pool {
	t.Helper()
	p := newPool(t, layout(quant.F32), pages)
	if err := p.EnableCache("model-a", maxCached); err != nil {
		t.Fatal(err)
	}
	return p
}

// fill computes (allocates) a sequence of tokens, offers it to the cache
// and releases it, as a finished request does.
func fill(t *testing.T, p *Pool, tokens []int32) []PageID {
	t.Helper()
	tb := p.NewTable()
	if err := tb.Grow(len(tokens)); err != nil {
		t.Fatal(err)
	}
	tb.Cache(tokens)
	pages := tb.Clone()
	if err := tb.Release(); err != nil {
		t.Fatal(err)
	}
	return pages
}

func TestChainHash(t *testing.T) {
	seed := PrefixSeed("m", "layout")
	a := ChainHash(seed, []int32{1, 2, 3, 4})
	if a != ChainHash(seed, []int32{1, 2, 3, 4}) {
		t.Fatal("hash not deterministic")
	}
	if a == ChainHash(seed, []int32{1, 2, 3, 5}) {
		t.Fatal("tokens not hashed")
	}
	if a == ChainHash(PrefixSeed("m2", "layout"), []int32{1, 2, 3, 4}) || a == ChainHash(PrefixSeed("m", "layout2"), []int32{1, 2, 3, 4}) {
		t.Fatal("fingerprint or layout not in the key")
	}
	// The second page's key covers the first: same tokens after a
	// different first page give another key.
	if ChainHash(a, []int32{5, 6, 7, 8}) == ChainHash(ChainHash(seed, []int32{9, 9, 9, 9}), []int32{5, 6, 7, 8}) {
		t.Fatal("chain does not cover earlier pages")
	}
	// A pool of another model keys the same tokens differently.
	p, q := cachedPool(t, 8, 8), newPool(t, layout(quant.F32), 8)
	if err := q.EnableCache("model-b", 8); err != nil {
		t.Fatal(err)
	}
	if p.cache.seed == q.cache.seed {
		t.Fatal("seed ignores the fingerprint")
	}
}

func TestPrefixMatchAndRefs(t *testing.T) {
	p := cachedPool(t, 8, 8)
	tok := seqTokens(0, 10) // two full pages and a partial one
	pages := fill(t, p, tok)
	st := p.Stats()
	if st.Cached != 2 || st.Used != 2 || st.Free != 6 {
		t.Fatalf("after the first sequence: %+v", st)
	}
	for _, id := range pages[:2] {
		if p.Refs(id) != 1 {
			t.Fatalf("cached page %d has %d refs, want 1 (the cache)", id, p.Refs(id))
		}
	}
	// A sequence sharing the first page and a half matches one page.
	other := append(seqTokens(0, 6), 99, 99)
	got := p.MatchPrefix(other, 8)
	if !slices.Equal(got, pages[:1]) || p.Refs(pages[0]) != 2 {
		t.Fatalf("match %v (refs %d), want %v with 2 refs", got, p.Refs(pages[0]), pages[:1])
	}
	if cs := p.CacheStats(); cs.Evictable != 1 {
		t.Fatalf("a held page is evictable: %+v", cs)
	}
	// The whole prefix, capped by maxPages.
	tb := p.NewTable()
	if n, err := tb.AttachPrefix(tok, 1); err != nil || n != 1 {
		t.Fatalf("attach capped at 1: %d %v", n, err)
	}
	if err := tb.Release(); err != nil {
		t.Fatal(err)
	}
	if err := p.Release(got...); err != nil {
		t.Fatal(err)
	}
	// Releasing a page that only the cache holds is a double free.
	if err := p.Release(pages[0]); !errors.Is(err, engine.ErrInvalidInput) || p.Refs(pages[0]) != 1 {
		t.Fatalf("release of a cache-only page: %v, refs %d", err, p.Refs(pages[0]))
	}
	// A non-matching first page matches nothing.
	if got := p.MatchPrefix(seqTokens(100, 8), 8); got != nil {
		t.Fatalf("matched %v", got)
	}
	if n := p.Flush(); n != 2 || p.Stats().Used != 0 || p.CacheStats().Evictions != 2 {
		t.Fatalf("flush freed %d: %+v %+v", n, p.Stats(), p.CacheStats())
	}
}

func TestPrefixLRUEviction(t *testing.T) {
	p := cachedPool(t, 4, 4)
	a := fill(t, p, seqTokens(0, 4))   // oldest
	b := fill(t, p, seqTokens(100, 4)) // then
	c := fill(t, p, seqTokens(200, 4))
	// Using a makes it the most recent.
	got := p.MatchPrefix(seqTokens(0, 4), 1)
	if err := p.Release(got...); err != nil {
		t.Fatal(err)
	}
	// Two pages needed, one free: b (least recently used) goes.
	ids, err := p.Alloc(2)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(ids, b[0]) || p.CacheStats().Evictions != 1 {
		t.Fatalf("allocated %v, want b's page %v evicted", ids, b)
	}
	if m := p.MatchPrefix(seqTokens(100, 4), 1); m != nil {
		t.Fatalf("evicted prefix still matches: %v", m)
	}
	// c is next, then a.
	more, err := p.Alloc(1)
	if err != nil || more[0] != c[0] {
		t.Fatalf("next eviction %v %v, want c %v", more, err, c)
	}
	_ = a
	if err := p.Release(append(ids, more...)...); err != nil {
		t.Fatal(err)
	}
}

func TestPrefixNeverEvictsHeld(t *testing.T) {
	p := cachedPool(t, 4, 4)
	fill(t, p, seqTokens(0, 8))
	held := p.MatchPrefix(seqTokens(0, 8), 2) // a live request holds both
	if len(held) != 2 {
		t.Fatal(held)
	}
	if _, err := p.Alloc(3); !errors.Is(err, engine.ErrKVCacheFull) {
		t.Fatalf("alloc of 3 with 2 free and 2 held: %v", err)
	}
	if n := p.Flush(); n != 0 {
		t.Fatalf("flush freed %d held pages", n)
	}
	ids, err := p.Alloc(2)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range held {
		if p.Refs(id) != 2 {
			t.Fatalf("held page %d: %d refs", id, p.Refs(id))
		}
	}
	// An alloc that cannot succeed evicts nothing.
	if err := p.Release(held[1]); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Alloc(2); !errors.Is(err, engine.ErrKVCacheFull) || p.CacheStats().Pages != 2 {
		t.Fatalf("failed alloc: %v, cache %+v", err, p.CacheStats())
	}
	if err := p.Release(append(ids, held[0])...); err != nil {
		t.Fatal(err)
	}
	p.Flush()
	if st := p.Stats(); st.Used != 0 || st.Shared != 0 {
		t.Fatalf("after flush: %+v", st)
	}
}

func TestPrefixMaxPages(t *testing.T) {
	p := cachedPool(t, 8, 2)
	fill(t, p, seqTokens(0, 12)) // three full pages, cap 2
	if cs := p.CacheStats(); cs.Pages != 2 {
		t.Fatalf("cap 2 kept %d", cs.Pages)
	}
	// The cap evicts the least recently used to take a newer page.
	fill(t, p, seqTokens(100, 4))
	if cs := p.CacheStats(); cs.Pages != 2 || cs.Evictions != 1 {
		t.Fatalf("after another page: %+v", cs)
	}
	if err := p.EnableCache("model-a", 0); err != nil || p.Stats().Used != 0 {
		t.Fatalf("cap 0: %v %+v", err, p.Stats())
	}
	if n := fill(t, p, seqTokens(0, 4)); p.Stats().Cached != 0 {
		t.Fatalf("cap 0 cached %v", n)
	}
	if err := p.EnableCache("model-a", 9); !errors.Is(err, engine.ErrInvalidInput) {
		t.Fatalf("cap above the pool: %v", err)
	}
	// Off: nothing is cached.
	q := newPool(t, layout(quant.F32), 4)
	if n := q.Insert(seqTokens(0, 4), []PageID{0}); n != 0 || q.MatchPrefix(seqTokens(0, 4), 1) != nil {
		t.Fatal("a pool without a cache cached")
	}
}

// The hashes a peer is told are the keys the cache matches by: a pool with
// the same fingerprint and layout computes them from the tokens alone.
func TestPrefixHashesAreCacheKeys(t *testing.T) {
	p := cachedPool(t, 8, 8)
	tokens := seqTokens(10, 14) // 3 full pages of 4 and 2 tokens
	pages := fill(t, p, tokens)
	hs := p.PrefixHashes(tokens, 10)
	if len(hs) != 3 {
		t.Fatalf("%d hashes for 3 full pages", len(hs))
	}
	for i, h := range hs {
		if id, ok := p.cache.byHash[h]; !ok || id != pages[i] {
			t.Errorf("hash %d: cached page %d (%v), want %d", i, id, ok, pages[i])
		}
	}
	seed := PrefixSeed("model-a", p.Layout().String())
	if got := PageHashes(seed, tokens, p.Layout().PageSize, 2); !slices.Equal(got, hs[:2]) {
		t.Errorf("PageHashes = %v, want %v", got, hs[:2])
	}
	if got := PageHashes(PrefixSeed("model-b", p.Layout().String()), tokens, p.Layout().PageSize, 3); slices.Equal(got, hs) {
		t.Error("another model's pages have the same keys")
	}
	if got := newPool(t, layout(quant.F32), 4).PrefixHashes(tokens, 3); got != nil {
		t.Errorf("cache off: %v, want nil", got)
	}
}
