package kvcache

import (
	"maps"
	"slices"
	"testing"
)

// replay applies events to a set of keys, as a router's index does.
func replay(set map[Hash]bool, evs []CacheEvent) {
	for _, e := range evs {
		if e.Stored {
			set[e.Hash] = true
		} else {
			delete(set, e.Hash)
		}
	}
}

func cachedKeys(p *Pool) map[Hash]bool {
	hs, _ := p.CacheSnapshot()
	set := map[Hash]bool{}
	for _, h := range hs {
		set[h] = true
	}
	return set
}

// TestCacheEventsFollowTheCache: a snapshot plus the events after it is
// always the cache's set of keys, through stores and evictions; a reader
// that fell behind the log's bound is told to resynchronise.
func TestCacheEventsFollowTheCache(t *testing.T) {
	p := cachedPool(t, 16, 6)
	if info := p.CacheInfo(); !info.Enabled || info.PageSize != 4 || info.Seed == 0 {
		t.Fatalf("CacheInfo = %+v", info)
	}
	snap, seq := p.CacheSnapshot()
	if len(snap) != 0 || seq != 0 {
		t.Fatalf("empty cache: snapshot %v at %d", snap, seq)
	}
	index := map[Hash]bool{}
	for round := range 12 {
		fill(t, p, seqTokens(100*round, 4*(1+round%4)))
		evs, next, ok := p.CacheEventsSince(seq, 0)
		if !ok {
			t.Fatalf("round %d: events since %d refused", round, seq)
		}
		replay(index, evs)
		seq = next
		if want := cachedKeys(p); !maps.Equal(index, want) {
			t.Fatalf("round %d: index %d keys, cache %d", round, len(index), len(want))
		}
	}
	if st := p.CacheStats(); st.Evictions == 0 {
		t.Fatal("the test evicted nothing")
	}
	// The keys are PageHashes' with the cache's seed.
	want := PageHashes(p.CacheInfo().Seed, seqTokens(1100, 16), 4, 4)
	for _, h := range want {
		if !index[h] {
			t.Errorf("the last prompt's page key %x is not in the index", h)
		}
	}
	// A bounded read continues where it stopped.
	fill(t, p, seqTokens(5000, 16))
	part, mid, ok := p.CacheEventsSince(seq, 2)
	rest, end, ok2 := p.CacheEventsSince(mid, 0)
	if !ok || !ok2 || len(part) != 2 || mid != seq+2 {
		t.Fatalf("bounded read: %d events to %d (%v), then %d to %d (%v)", len(part), mid, ok, len(rest), end, ok2)
	}
	replay(index, append(part, rest...))
	if !maps.Equal(index, cachedKeys(p)) {
		t.Fatal("bounded reads lost an event")
	}
	if _, _, ok := p.CacheEventsSince(end+1, 0); ok {
		t.Fatal("a sequence number from the future was accepted")
	}

	// Past the bound the oldest events go, and a reader there resyncs.
	p.mu.Lock()
	p.cache.log.limit = 8
	p.mu.Unlock()
	for round := range 6 {
		fill(t, p, seqTokens(9000+100*round, 16))
	}
	if _, _, ok := p.CacheEventsSince(end, 0); ok {
		t.Fatal("events the log dropped were served")
	}
	snap, seq = p.CacheSnapshot()
	index = map[Hash]bool{}
	replay(index, func() []CacheEvent {
		var evs []CacheEvent
		for _, h := range snap {
			evs = append(evs, CacheEvent{Hash: h, Stored: true})
		}
		return evs
	}())
	fill(t, p, seqTokens(20000, 8))
	evs, _, ok := p.CacheEventsSince(seq, 0)
	replay(index, evs)
	if !ok || !maps.Equal(index, cachedKeys(p)) {
		t.Fatalf("after a resync: ok %v, index %v, cache %v", ok, slices.Collect(maps.Keys(index)), slices.Collect(maps.Keys(cachedKeys(p))))
	}
}

func TestCacheEventsCacheOff(t *testing.T) {
	p := newPool(t, layout(0), 4)
	if info := p.CacheInfo(); info.Enabled {
		t.Fatalf("CacheInfo with the cache off: %+v", info)
	}
	if hs, seq := p.CacheSnapshot(); hs != nil || seq != 0 {
		t.Fatal("a snapshot of a cache that is off")
	}
	if _, _, ok := p.CacheEventsSince(0, 0); ok {
		t.Fatal("events of a cache that is off")
	}
}
