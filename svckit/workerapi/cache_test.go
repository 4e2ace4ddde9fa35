package workerapi

import (
	"maps"
	"testing"

	"github.com/baton-serving/baton/engine/kvcache"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/kernels"
	"github.com/baton-serving/baton/kernels/quant"
)

// apply folds one report's cache changes into an index, as the router does.
func apply(index map[uint64]bool, ev *batonv1.CacheEvents) {
	if ev.GetSnapshot() {
		clear(index)
	}
	for _, h := range ev.GetStored() {
		index[h] = true
	}
	for _, h := range ev.GetRemoved() {
		delete(index, h)
	}
}

func keysOf(p *kvcache.Pool) map[uint64]bool {
	hs, _ := p.CacheSnapshot()
	out := map[uint64]bool{}
	for _, h := range hs {
		out[uint64(h)] = true
	}
	return out
}

// finish computes a sequence of tokens and offers it to the cache, as a
// finished request does.
func finish(t *testing.T, p *kvcache.Pool, first, n int) {
	t.Helper()
	tokens := make([]int32, n)
	for i := range tokens {
		tokens[i] = int32(first + i)
	}
	tb := p.NewTable()
	if err := tb.Grow(n); err != nil {
		t.Fatal(err)
	}
	tb.Cache(tokens)
	if err := tb.Release(); err != nil {
		t.Fatal(err)
	}
}

// TestCacheWatch: the reports of one WatchLoad stream rebuild the worker's
// cache exactly, first from a snapshot and then from the changes, with
// stored and removed disjoint; a stream that fell behind the log gets a
// new snapshot; a worker whose cache is off says so.
func TestCacheWatch(t *testing.T) {
	p, err := kvcache.New(kernels.KVLayout{Layers: 1, KVHeads: 1, HeadDim: 4, PageSize: 4, DType: quant.F32}, 12)
	if err != nil {
		t.Fatal(err)
	}
	off := &cacheWatch{log: p}
	if ev := off.next(); ev.GetEnabled() || !ev.GetSnapshot() || len(ev.GetStored()) != 0 {
		t.Fatalf("a cache that is off: %v", ev)
	}
	if err := p.EnableCache("m", 8); err != nil {
		t.Fatal(err)
	}
	finish(t, p, 0, 16)
	cw := &cacheWatch{log: p}
	index := map[uint64]bool{}
	ev := cw.next()
	if !ev.GetEnabled() || !ev.GetSnapshot() || ev.GetPageSize() != 4 || ev.GetSeed() != uint64(p.CacheInfo().Seed) || len(ev.GetStored()) != 4 {
		t.Fatalf("first report: %v", ev)
	}
	apply(index, ev)
	for round := range 8 {
		// Store and evict, some keys twice within one report.
		finish(t, p, 1000*(round+1), 8+4*(round%3))
		finish(t, p, 0, 16)
		ev := cw.next()
		if ev.GetSnapshot() {
			t.Fatalf("round %d: a snapshot though the log reaches back", round)
		}
		for _, h := range ev.GetStored() {
			for _, r := range ev.GetRemoved() {
				if h == r {
					t.Fatalf("round %d: key %x both stored and removed", round, h)
				}
			}
		}
		apply(index, ev)
		if want := keysOf(p); !maps.Equal(index, want) {
			t.Fatalf("round %d: the index holds %d keys, the cache %d", round, len(index), len(want))
		}
	}
	if p.CacheStats().Evictions == 0 {
		t.Fatal("nothing was evicted")
	}
	// A reader the log left behind is resynchronised.
	cw.seq = 1<<40 + 7
	if ev := cw.next(); !ev.GetSnapshot() || len(ev.GetStored()) != len(keysOf(p)) {
		t.Fatalf("after losing its place: %v", ev)
	}
	// No cache at all (a Source that is not a CacheSource).
	if ev := (&cacheWatch{}).next(); ev.GetEnabled() || !ev.GetSnapshot() {
		t.Fatalf("no cache: %v", ev)
	}
}

// TestSplitCacheEvents: a snapshot too large for one message goes out as
// several, the first a snapshot and the rest changes, which rebuild it
// exactly; small reports stay whole.
func TestSplitCacheEvents(t *testing.T) {
	ev := &batonv1.CacheEvents{Enabled: true, Snapshot: true, Seed: 9, PageSize: 16}
	for i := range 10 {
		ev.Stored = append(ev.Stored, uint64(i))
	}
	parts := splitCacheEvents(ev, 4)
	if len(parts) != 3 || !parts[0].GetSnapshot() || parts[1].GetSnapshot() || parts[2].GetSnapshot() {
		t.Fatalf("10 keys by 4: %v", parts)
	}
	index := map[uint64]bool{99: true}
	for _, p := range parts {
		if len(p.GetStored())+len(p.GetRemoved()) > 4 || p.GetSeed() != 9 || p.GetPageSize() != 16 || !p.GetEnabled() {
			t.Fatalf("part %v", p)
		}
		apply(index, p)
	}
	if len(index) != 10 || index[99] {
		t.Fatalf("rebuilt %v", index)
	}
	delta := &batonv1.CacheEvents{Enabled: true, Stored: []uint64{1, 2, 3}, Removed: []uint64{4, 5, 6}}
	if parts := splitCacheEvents(delta, 4); len(parts) != 2 || len(parts[0].GetStored()) != 3 || len(parts[0].GetRemoved()) != 1 || len(parts[1].GetRemoved()) != 2 {
		t.Fatalf("a delta of 6 by 4: %v", parts)
	}
	if parts := splitCacheEvents(delta, 6); len(parts) != 1 || parts[0] != delta {
		t.Fatalf("a delta that fits: %v", parts)
	}
	if parts := splitCacheEvents(&batonv1.CacheEvents{Snapshot: true}, 4); len(parts) != 1 {
		t.Fatalf("a cache that is off: %v", parts)
	}
}
