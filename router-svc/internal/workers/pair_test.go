package workers

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/baton-serving/baton/engine/kvcache"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
)

const (
	prefillRole = batonv1.WorkerRole_WORKER_ROLE_PREFILL
	decodeRole  = batonv1.WorkerRole_WORKER_ROLE_DECODE
)

func readyW(addr string, role batonv1.WorkerRole) *Worker {
	return fakeWorker(addr, role, &batonv1.LoadReport{Ready: true, PagesTotal: 100})
}

// gate allows every pair but those denied, as a canary tracker would.
type gate struct {
	mu     sync.Mutex
	denied map[[2]string]bool
}

func newGate(denied ...string) *gate {
	g := &gate{denied: map[[2]string]bool{}}
	for _, pd := range denied {
		p, d, _ := strings.Cut(pd, ">")
		g.denied[[2]string{p, d}] = true
	}
	return g
}

func (g *gate) Allowed(p, d string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return !g.denied[[2]string{p, d}]
}

func pairer(t testing.TB, prefills, decodes []*Worker, g PairGate, limit int) *Pairer {
	pp := &Pairer{Decode: fakeSet(decodeRole, decodes...), DecodePolicy: mustPolicy(t, "least-load"),
		PrefillPolicy: mustPolicy(t, "least-load"), Gate: g, MaxInflight: limit}
	if prefills != nil {
		pp.Prefill = fakeSet(prefillRole, prefills...)
	}
	return pp
}

func addrs(p *Pair) string { return p.PrefillAddr() + ">" + p.Decode.Addr }

func TestPairerSpreadsAndCounts(t *testing.T) {
	p1, p2 := readyW("p1", prefillRole), readyW("p2", prefillRole)
	d1, d2 := readyW("d1", decodeRole), readyW("d2", decodeRole)
	pp := pairer(t, []*Worker{p1, p2}, []*Worker{d1, d2}, nil, 0)
	var held []*Pair
	seen := map[string]int{}
	for range 4 {
		p, err := pp.Pick(nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, p)
		seen[p.Prefill.Addr]++
		seen[p.Decode.Addr]++
	}
	// Least-load counts the router's own requests: four concurrent
	// requests land two on each worker.
	for _, w := range []string{"p1", "p2", "d1", "d2"} {
		if seen[w] != 2 {
			t.Errorf("spread %v, want 2 each", seen)
		}
	}
	held[0].ReleasePrefill()
	held[0].ReleasePrefill()
	if n := held[0].Prefill.Inflight(); n != 1 {
		t.Errorf("prefill in-flight after ReleasePrefill = %d, want 1", n)
	}
	for _, p := range held {
		p.Release()
		p.Release()
	}
	for _, w := range []*Worker{p1, p2, d1, d2} {
		if w.Inflight() != 0 || w.Routed() != 2 {
			t.Errorf("%s: in-flight %d routed %d, want 0 and 2", w.Addr, w.Inflight(), w.Routed())
		}
	}
}

func TestPairerFilters(t *testing.T) {
	f16 := &batonv1.KVLayout{Dtype: batonv1.KVDataType_KV_DATA_TYPE_F16, PageSizeTokens: 16, NumLayers: 5, NumKvHeads: 4, HeadDim: 8}
	f32 := &batonv1.KVLayout{Dtype: batonv1.KVDataType_KV_DATA_TYPE_F32, PageSizeTokens: 16, NumLayers: 5, NumKvHeads: 4, HeadDim: 8}
	withLayout := func(w *Worker, l *batonv1.KVLayout) *Worker {
		w.info.Store(&batonv1.InfoResponse{Role: w.Role, KvLayout: l})
		return w
	}
	unready := fakeWorker("unready", decodeRole, &batonv1.LoadReport{Ready: false})
	stale := readyW("stale", decodeRole)
	stale.updated.Store(time.Now().Add(-time.Hour).UnixNano())
	retired := readyW("retired", decodeRole)
	retired.retire()
	for _, tc := range []struct {
		name     string
		prefills []*Worker // nil: colocated
		decodes  []*Worker
		denied   []string
		avoid    []string
		want     string // "prefill>decode", or an error fragment after "!"
		full     bool
	}{
		{name: "unready, stale and retired decodes filtered",
			prefills: []*Worker{readyW("p", prefillRole)},
			decodes:  []*Worker{unready, stale, retired, readyW("d", decodeRole)}, want: "p>d"},
		{name: "quarantined pair routed around",
			prefills: []*Worker{readyW("p1", prefillRole), readyW("p2", prefillRole)},
			decodes:  []*Worker{readyW("d", decodeRole)}, denied: []string{"p1>d"}, want: "p2>d"},
		{name: "decode whose pairs all fail is skipped",
			prefills: []*Worker{readyW("p", prefillRole)},
			decodes:  []*Worker{readyW("d1", decodeRole), readyW("d2", decodeRole)}, denied: []string{"p>d1"}, want: "p>d2"},
		{name: "every pair quarantined",
			prefills: []*Worker{readyW("p", prefillRole)},
			decodes:  []*Worker{readyW("d", decodeRole)}, denied: []string{"p>d"},
			want: "!no ready prefill worker for decode d (p: not in a pair that passes its canary)"},
		{name: "colocated quarantine",
			decodes: []*Worker{readyW("d1", decodeRole), readyW("d2", decodeRole)}, denied: []string{">d1"}, want: "local>d2"},
		{name: "colocated all quarantined",
			decodes: []*Worker{readyW("d1", decodeRole)}, denied: []string{">d1"},
			want: "!no ready decode worker (d1: not in a pair that passes its canary)"},
		{name: "KV layouts must agree",
			prefills: []*Worker{withLayout(readyW("p32", prefillRole), f32), withLayout(readyW("p16", prefillRole), f16)},
			decodes:  []*Worker{withLayout(readyW("d", decodeRole), f16)}, want: "p16>d"},
		{name: "tried workers avoided",
			prefills: []*Worker{readyW("p1", prefillRole), readyW("p2", prefillRole)},
			decodes:  []*Worker{readyW("d1", decodeRole), readyW("d2", decodeRole)}, avoid: []string{"d1", "p1"}, want: "p2>d2"},
		{name: "the one decode reused, with another prefill",
			prefills: []*Worker{readyW("p1", prefillRole), readyW("p2", prefillRole)},
			decodes:  []*Worker{readyW("d", decodeRole)}, avoid: []string{"d", "p1"}, want: "p2>d"},
		{name: "the one prefill reused, with another decode",
			prefills: []*Worker{readyW("p", prefillRole)},
			decodes:  []*Worker{readyW("d1", decodeRole), readyW("d2", decodeRole)}, avoid: []string{"d1", "p"}, want: "p>d2"},
		{name: "tried workers used when nothing else is left",
			prefills: []*Worker{readyW("p", prefillRole)},
			decodes:  []*Worker{readyW("d", decodeRole)}, avoid: []string{"d", "p"}, want: "p>d"},
		{name: "no decode ready",
			prefills: []*Worker{readyW("p", prefillRole)},
			decodes:  []*Worker{unready}, want: "!no ready decode worker (unready: not ready)"},
		{name: "no decode found",
			prefills: []*Worker{readyW("p", prefillRole)},
			want:     "!no ready decode worker (none found at )"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pp := pairer(t, tc.prefills, tc.decodes, newGate(tc.denied...), 0)
			p, err := pp.Pick(nil, tc.avoid)
			if msg, isErr := strings.CutPrefix(tc.want, "!"); isErr {
				var pe *PickError
				if !errors.As(err, &pe) || pe.Error() != msg || pe.Full {
					t.Fatalf("Pick = %v, %v; want PickError %q", p, err, msg)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer p.Release()
			if got := addrs(p); got != tc.want {
				t.Errorf("picked %s, want %s", got, tc.want)
			}
		})
	}
}

func TestPairerInflightLimit(t *testing.T) {
	for _, tc := range []struct {
		name                   string
		nPrefill, nDecode, lim int
		role                   string
	}{
		{"decodes full", 4, 2, 3, "decode"},
		{"prefills full", 1, 3, 2, "prefill"},
		{"colocated", 0, 2, 1, "decode"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ps, ds []*Worker
			for i := range tc.nPrefill {
				ps = append(ps, readyW(fmt.Sprint("p", i), prefillRole))
			}
			for i := range tc.nDecode {
				ds = append(ds, readyW(fmt.Sprint("d", i), decodeRole))
			}
			pp := pairer(t, ps, ds, nil, tc.lim)
			capacity := tc.lim * tc.nDecode
			if tc.nPrefill > 0 {
				capacity = tc.lim * min(tc.nPrefill, tc.nDecode)
			}
			var held []*Pair
			for range capacity {
				p, err := pp.Pick(nil, nil)
				if err != nil {
					t.Fatalf("pick %d of %d: %v", len(held)+1, capacity, err)
				}
				held = append(held, p)
			}
			_, err := pp.Pick(nil, nil)
			var pe *PickError
			if !errors.As(err, &pe) || !pe.Full || RoleName(pe.Role) != tc.role ||
				!strings.Contains(err.Error(), fmt.Sprintf("every %s worker that could take the request is at its in-flight limit of %d", tc.role, tc.lim)) {
				t.Fatalf("pick past the limit: %v, want a full %s side", err, tc.role)
			}
			for _, w := range append(ps, ds...) {
				if w.Inflight() > int64(tc.lim) {
					t.Errorf("%s holds %d requests, limit %d", w.Addr, w.Inflight(), tc.lim)
				}
			}
			held[0].Release()
			p, err := pp.Pick(nil, nil)
			if err != nil {
				t.Fatalf("after a release: %v", err)
			}
			p.Release()
			for _, p := range held {
				p.Release()
			}
		})
	}
}

// TestPairerConcurrentLimit races many pickers against a small limit: no
// worker ever holds more than its limit.
func TestPairerConcurrentLimit(t *testing.T) {
	ds := []*Worker{readyW("d0", decodeRole), readyW("d1", decodeRole)}
	pp := pairer(t, nil, ds, nil, 2)
	var wg sync.WaitGroup
	var mu sync.Mutex
	over := 0
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 500 {
				p, err := pp.Pick(nil, nil)
				if err != nil {
					continue
				}
				if p.Decode.Inflight() > 2 {
					mu.Lock()
					over++
					mu.Unlock()
				}
				p.Release()
			}
		}()
	}
	wg.Wait()
	if over > 0 {
		t.Errorf("%d picks saw a worker over its limit", over)
	}
	for _, w := range ds {
		if w.Inflight() != 0 {
			t.Errorf("%s in-flight %d after all released", w.Addr, w.Inflight())
		}
	}
}

func TestRetiredWorkerDrains(t *testing.T) {
	w := readyW("d", decodeRole)
	closed := 0
	w.onClose = func() { closed++ }
	if err := w.tryAcquire(0); err != nil {
		t.Fatal(err)
	}
	w.retire()
	if closed != 0 {
		t.Fatal("connection closed with a request on it")
	}
	if err := w.tryAcquire(0); !errors.Is(err, errRetired) {
		t.Errorf("acquire on a retired worker: %v", err)
	}
	w.release()
	if closed != 1 || w.Inflight() != 0 {
		t.Errorf("after the last request: closed %d times, in-flight %d", closed, w.Inflight())
	}
	w.retire()
	if closed != 1 {
		t.Errorf("closed %d times", closed)
	}
}

// BenchmarkPick is the router's pick path: a (prefill, decode) pair chosen
// among 100 workers of each role, with readiness, a canary gate and an
// in-flight limit, and the pair counted and released.
func BenchmarkPick(b *testing.B) {
	for _, pol := range PolicyNames {
		for _, mode := range []string{"pd", "colocated"} {
			b.Run(pol+"/"+mode+"/100", func(b *testing.B) {
				var ps, ds []*Worker
				for i := range 100 {
					ds = append(ds, fakeWorker(fmt.Sprint("10.0.1.", i, ":8084"), decodeRole, &batonv1.LoadReport{
						Ready: true, QueuedRequests: uint32(i % 7), RunningRequests: uint32(i % 5), PagesUsed: uint32(i), PagesTotal: 1000}))
					ps = append(ps, fakeWorker(fmt.Sprint("10.0.0.", i, ":8082"), prefillRole, &batonv1.LoadReport{
						Ready: true, QueuedRequests: uint32(i % 3), PagesTotal: 1000}))
				}
				if mode == "colocated" {
					ps = nil
				}
				// Every worker's index holds 64 pages of other prompts and
				// a tenth of them the first 8 of this 1,024-token prompt;
				// each pick has its own Query, as each request does.
				tokens := make([]int32, 1024)
				for i := range tokens {
					tokens[i] = int32(i)
				}
				const seed = 7
				mine := kvcache.PageHashes(seed, tokens, 16, 8)
				for i, w := range slices.Concat(ps, ds) {
					ev := &batonv1.CacheEvents{Enabled: true, Snapshot: true, Seed: seed, PageSize: 16}
					for j := range 64 {
						ev.Stored = append(ev.Stored, uint64(1000*i+j))
					}
					if i%10 == 0 {
						for _, h := range mine {
							ev.Stored = append(ev.Stored, uint64(h))
						}
					}
					w.cache.apply(ev)
				}
				pp := pairer(b, ps, ds, newGate("10.0.0.1:8082>10.0.1.1:8084", ">10.0.1.2:8084"), 64)
				pp.DecodePolicy, pp.PrefillPolicy = mustPolicy(b, pol), mustPolicy(b, pol)
				b.ReportAllocs()
				for b.Loop() {
					p, err := pp.Pick(&Query{Tokens: tokens}, nil)
					if err != nil {
						b.Fatal(err)
					}
					p.Release()
				}
			})
		}
	}
}
