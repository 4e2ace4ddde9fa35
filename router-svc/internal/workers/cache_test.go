package workers

import (
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/baton-serving/baton/engine/kvcache"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/kernels"
	"github.com/baton-serving/baton/kernels/quant"
	"github.com/baton-serving/baton/svckit/workerapi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

const testSeed = 0x5eed

// prompt returns n tokens from first on.
func prompt(first, n int) []int32 {
	t := make([]int32, n)
	for i := range t {
		t[i] = int32(first + i)
	}
	return t
}

// holding makes w's index hold the first pages full pages of tokens, as a
// snapshot from its stream would.
func holding(w *Worker, tokens []int32, pages int) {
	var stored []uint64
	for _, h := range kvcache.PageHashes(testSeed, tokens, 4, pages) {
		stored = append(stored, uint64(h))
	}
	w.cache.apply(&batonv1.CacheEvents{Enabled: true, Snapshot: true, Seed: testSeed, PageSize: 4, Stored: stored})
}

func TestCacheIndex(t *testing.T) {
	w := decodeW("a", 0, 0, 0, 100)
	conv := prompt(0, 41) // 10 reusable pages of 4 (the 11th holds the last token)
	q := &Query{Tokens: conv}
	// No index yet, and no layout from Info: pages of the default size.
	if p := w.CachedPrefix(q); p.Held != 0 || p.Total != 40/kvcache.DefaultPageSize {
		t.Fatalf("no index yet: %+v, want 0 of %d", p, 40/kvcache.DefaultPageSize)
	}
	holding(w, conv, 6)
	if p := w.CachedPrefix(q); p.Held != 6 || p.Reported != 6 || p.Total != 10 || w.CachePages() != 6 {
		t.Fatalf("after a snapshot of 6 pages: %+v (%d in the index)", p, w.CachePages())
	}
	if p := w.CachedPrefix(&Query{Tokens: conv, NoReuse: true}); p != (Prefix{}) {
		t.Fatalf("a request that reuses nothing: %+v", p)
	}
	// Changes: pages 6 and 7 stored, page 2 evicted — the match stops at
	// the first page missing, as the worker's own match does.
	hs := kvcache.PageHashes(testSeed, conv, 4, 8)
	w.cache.apply(&batonv1.CacheEvents{Enabled: true, Seed: testSeed, PageSize: 4,
		Stored: []uint64{uint64(hs[6]), uint64(hs[7])}, Removed: []uint64{uint64(hs[2])}})
	if p := w.CachedPrefix(q); p.Held != 2 || w.CachePages() != 7 {
		t.Fatalf("after page 2's eviction: %+v (%d in the index), want 2 (7)", p, w.CachePages())
	}
	// Another model's seed matches nothing.
	w.cache.apply(&batonv1.CacheEvents{Enabled: true, Snapshot: true, Seed: testSeed + 1, PageSize: 4, Stored: []uint64{uint64(hs[0])}})
	if p := w.CachedPrefix(q); p.Held != 0 {
		t.Fatalf("keys of another seed matched %+v", p)
	}
	// A broken stream forgets everything; so does a cache turned off.
	holding(w, conv, 10)
	w.setErr(errBroken)
	if p := w.CachedPrefix(q); p.Held != 0 || w.CachePages() != 0 {
		t.Fatalf("after the stream broke: %+v, %d in the index", p, w.CachePages())
	}
	holding(w, conv, 10)
	w.cache.apply(&batonv1.CacheEvents{Enabled: false, Snapshot: true})
	if w.CachePages() != 0 {
		t.Fatal("a cache turned off is still indexed")
	}
	// A prompt of less than one full page plus a token has nothing to
	// reuse.
	if p := w.CachedPrefix(&Query{Tokens: prompt(0, 4)}); p.Held != 0 || p.Total != 0 {
		t.Fatalf("a one-page prompt: %+v", p)
	}
}

var errBroken = errorString("watch load: connection reset")

type errorString string

func (e errorString) Error() string { return string(e) }

// TestCacheAwarePolicy: a conversation goes back to the worker that holds
// its pages; prompts no worker holds go by load; a holder loaded far
// beyond an idle worker loses the prompt to it.
func TestCacheAwarePolicy(t *testing.T) {
	p := mustPolicy(t, "cache-aware")
	conv := prompt(0, 65)
	a, b := decodeW("a", 0, 1, 0, 100), decodeW("b", 0, 0, 0, 100)
	holding(a, conv, 16)
	for range 4 {
		if w, _ := p.Pick(&Query{Tokens: conv}, []*Worker{a, b}, nil); w != a {
			t.Fatalf("the conversation went to %s, not to a which holds it", w.Addr)
		}
	}
	// Half the prompt on b, all on a: a.
	holding(b, conv, 8)
	if w, _ := p.Pick(&Query{Tokens: conv}, []*Worker{a, b}, nil); w != a {
		t.Fatalf("went to %s, which holds half of what a holds", w.Addr)
	}
	// A new prompt: the less loaded, b.
	if w, _ := p.Pick(&Query{Tokens: prompt(1000, 65)}, []*Worker{a, b}, nil); w != b {
		t.Fatalf("a prompt nobody holds went to the busier %s", w.Addr)
	}
	// Without a query the policy is least-load.
	if w, _ := p.Pick(nil, []*Worker{a, b}, nil); w != b {
		t.Fatalf("no query: went to the busier %s", w.Addr)
	}
	// A holder far busier than the least loaded candidate is scored by
	// load alone: with 8 requests more than an idle worker holding none of
	// the prompt, it loses the prompt to it.
	busy := decodeW("busy", 0, 1+CacheAwareMaxImbalance+3, 0, 100)
	idle := decodeW("idle", 0, 0, 0, 100)
	holding(busy, conv, 16)
	if w, _ := p.Pick(&Query{Tokens: conv}, []*Worker{busy, idle}, nil); w != idle {
		t.Fatalf("went to %s with %v requests over an idle worker", w.Addr, Load(busy))
	}
	// Exactly CacheAwareMaxImbalance requests ahead is within the guard,
	// whatever share of its KV cache the holder uses: the guard counts
	// requests, and the KV fraction only breaks load ties (counted in,
	// 4 requests and 1% of the pages lost the conversation to the idle
	// worker: TestCacheAwareRouting saw it).
	edge := decodeW("edge", 0, CacheAwareMaxImbalance, 1, 100)
	holding(edge, conv, 16)
	if w, _ := p.Pick(&Query{Tokens: conv}, []*Worker{edge, idle}, nil); w != edge {
		t.Fatalf("went to %s; the holder is only %v requests ahead (load %v)", w.Addr, CacheAwareMaxImbalance, Load(edge))
	}
	// A prefix every request shares does not pin the traffic to the
	// worker that computed it first: picks that each add a request spread
	// over both workers.
	x, y := decodeW("x", 0, 0, 0, 100), decodeW("y", 0, 0, 0, 100)
	holding(x, conv, 16)
	got := map[string]int{}
	for range 20 {
		w, _ := p.Pick(&Query{Tokens: conv}, []*Worker{x, y}, nil)
		got[w.Addr]++
		if err := w.tryAcquire(0); err != nil {
			t.Fatal(err)
		}
	}
	if got["y"] == 0 || got["x"] <= got["y"] {
		t.Fatalf("a shared prefix held by x: picks %v; want most on x, the rest on y", got)
	}
	// The other policies ignore the cache.
	rr := mustPolicy(t, "least-load")
	if w, _ := rr.Pick(&Query{Tokens: conv}, []*Worker{a, b}, nil); w != b {
		t.Fatalf("least-load followed the cache to %s", w.Addr)
	}
}

// cachingWorker is a worker's WorkerService over a real prefix cache, on a
// loopback port.
type cachingWorker struct {
	pool *kvcache.Pool
	srv  *grpc.Server
	addr string
}

type cachingSource struct {
	workerapi.Idle
	pool *kvcache.Pool
}

func (c *cachingSource) Info() *batonv1.InfoResponse {
	return &batonv1.InfoResponse{Role: decodeRole, Model: &batonv1.ModelInfo{Fingerprint: "fp-good"}, KvLayout: testLayout}
}

func (c *cachingSource) CacheLog() workerapi.CacheLog { return c.pool }

func serveCache(t *testing.T, addr string, pool *kvcache.Pool) *cachingWorker {
	t.Helper()
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	cw := &cachingWorker{pool: pool, srv: grpc.NewServer(), addr: lis.Addr().String()}
	src := &cachingSource{Idle: workerapi.Idle{Role: decodeRole, Ready: func(context.Context) map[string]string { return nil }}, pool: pool}
	batonv1.RegisterWorkerServiceServer(cw.srv, workerapi.New(src))
	go cw.srv.Serve(lis)
	t.Cleanup(cw.srv.Stop)
	return cw
}

// compute runs a request over tokens on the pool and offers its pages to
// the cache, as a finished request does.
func compute(t *testing.T, p *kvcache.Pool, tokens []int32) {
	t.Helper()
	tb := p.NewTable()
	if err := tb.Grow(len(tokens)); err != nil {
		t.Fatal(err)
	}
	tb.Cache(tokens)
	if err := tb.Release(); err != nil {
		t.Fatal(err)
	}
}

// TestCacheIndexFollowsTheStream: through a real WatchLoad stream from a
// real prefix cache, the router's index follows stores and evictions, is
// forgotten the moment the stream breaks (the worker killed), and comes
// back from the snapshot of the next stream.
func TestCacheIndexFollowsTheStream(t *testing.T) {
	pool, err := kvcache.New(kernels.KVLayout{Layers: 5, KVHeads: 4, HeadDim: 8, PageSize: 16, DType: quant.F16}, 64)
	if err != nil {
		t.Fatal(err)
	}
	if err := pool.EnableCache("fp-good", 64); err != nil {
		t.Fatal(err)
	}
	compute(t, pool, prompt(0, 160)) // 10 pages
	srv := serveCache(t, "127.0.0.1:0", pool)
	s := NewSet(Config{Role: decodeRole, Source: Static{srv.addr}, Expect: testExpect, LoadInterval: 50 * time.Millisecond,
		CacheEvents: true, ResolveInterval: 50 * time.Millisecond, Logger: slog.New(slog.DiscardHandler),
		DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	waitFor(t, "the snapshot", func() bool { w := worker(s, srv.addr); return w != nil && w.CachePages() == 10 })
	w := worker(s, srv.addr)
	conv := append(prompt(0, 160), prompt(5000, 30)...)
	if p := w.CachedPrefix(&Query{Tokens: conv}); p.Held != 10 || p.Total != 11 {
		t.Fatalf("%+v of a prompt extending the cached one, want 10 of 11", p)
	}
	compute(t, pool, conv)
	waitFor(t, "the next turn's page", func() bool { return w.CachePages() == 11 })
	pool.Flush()
	waitFor(t, "the evictions", func() bool { return w.CachePages() == 0 })
	compute(t, pool, conv)
	waitFor(t, "stored again", func() bool { return w.CachePages() == 11 })

	srv.srv.Stop() // killed: the stream breaks
	waitFor(t, "the index forgotten", func() bool { return w.CachePages() == 0 })
	if p := w.CachedPrefix(&Query{Tokens: conv}); p.Held != 0 {
		t.Fatalf("a dead worker is scored as holding %+v", p)
	}
	// Back on the same address with the same cache: a new snapshot.
	serveCache(t, srv.addr, pool)
	waitFor(t, "the resync", func() bool { return w.CachePages() == 11 })
}

// TestRoutedPromptCountsUntilReported: a prompt just routed to a worker
// counts as held there before its report arrives, for routedTTL at most;
// the report's eviction of a page drops it.
func TestRoutedPromptCountsUntilReported(t *testing.T) {
	w := decodeW("a", 0, 0, 0, 100)
	conv := prompt(0, 41)
	q := &Query{Tokens: conv}
	w.NoteRouted(q) // no snapshot yet: the cache may be off, nothing noted
	if p := w.CachedPrefix(q); p.Held != 0 {
		t.Fatalf("noted before the worker said its cache is on: %+v", p)
	}
	holding(w, conv, 2)
	w.NoteRouted(q)
	if p := w.CachedPrefix(&Query{Tokens: append(conv, prompt(900, 8)...)}); p.Held != 10 || p.Reported != 2 || p.Total != 12 {
		t.Fatalf("the next turn: %+v, want 10 held (2 reported) of 12", p)
	}
	hs := kvcache.PageHashes(testSeed, conv, 4, 10)
	w.cache.apply(&batonv1.CacheEvents{Enabled: true, Seed: testSeed, PageSize: 4, Removed: []uint64{uint64(hs[5])}})
	if p := w.CachedPrefix(q); p.Held != 5 {
		t.Fatalf("after page 5's eviction: %+v, want 5 held", p)
	}
	w.cache.mu.Lock()
	for k := range w.cache.routed {
		w.cache.routed[k] = time.Now().Add(-routedTTL - time.Second)
	}
	w.cache.mu.Unlock()
	if p := w.CachedPrefix(q); p.Held != 2 {
		t.Fatalf("after the TTL: %+v, want the 2 reported pages", p)
	}
	w.NoteRouted(q)
	w.setErr(errBroken)
	if p := w.CachedPrefix(q); p.Held != 0 {
		t.Fatalf("after the stream broke: %+v", p)
	}
}
