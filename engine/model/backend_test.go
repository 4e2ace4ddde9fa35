package model

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/kvcache"
	"github.com/baton-serving/baton/kernels"
	"github.com/baton-serving/baton/kernels/quant"
)

// countingCPU is a real CPU backend that counts what is allocated on it
// and not yet freed: buffers and weight matrices.
type countingCPU struct {
	*kernels.CPU
	mu                sync.Mutex
	buffers, matrices int
	loadsLeft         int // LoadMatrix fails after this many when > 0
}

func (c *countingCPU) Alloc(n int) (kernels.Buffer, error) {
	b, err := c.CPU.Alloc(n)
	if err == nil {
		c.mu.Lock()
		c.buffers++
		c.mu.Unlock()
	}
	return b, err
}

func (c *countingCPU) Free(b kernels.Buffer) error {
	err := c.CPU.Free(b)
	if err == nil {
		c.mu.Lock()
		c.buffers--
		c.mu.Unlock()
	}
	return err
}

func (c *countingCPU) LoadMatrix(typ quant.Type, rows, cols int, data []byte) (kernels.Matrix, error) {
	c.mu.Lock()
	if c.loadsLeft > 0 {
		c.loadsLeft--
		if c.loadsLeft == 0 {
			c.mu.Unlock()
			return nil, fmt.Errorf("%w: out of device memory (test)", kernels.ErrUnsupported)
		}
	}
	c.mu.Unlock()
	m, err := c.CPU.LoadMatrix(typ, rows, cols, data)
	if err == nil {
		c.mu.Lock()
		c.matrices++
		c.mu.Unlock()
	}
	return m, err
}

func (c *countingCPU) FreeMatrix(m kernels.Matrix) error {
	err := c.CPU.FreeMatrix(m)
	if err == nil {
		c.mu.Lock()
		c.matrices--
		c.mu.Unlock()
	}
	return err
}

func (c *countingCPU) live() (buffers, matrices int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buffers, c.matrices
}

// opaque hides every method but the Backend interface's: a backend that
// cannot compute on host memory, as a GPU's.
type opaque struct{ kernels.Backend }

// TestCallerBackend runs a model on a backend the caller owns: the
// results are those of the model's own CPU backend, everything the model
// put on the backend is freed by Close (the counts return to zero), and
// the backend stays open for its owner.
func TestCallerBackend(t *testing.T) {
	f := writeModel(t, tinySpec())
	want := run(t, load(t, f, Options{Threads: 2}), quantPrompt, quantExtra)

	be := &countingCPU{CPU: kernels.NewCPU(2)}
	defer be.Close()
	m, err := Load(f, Options{Backend: be})
	if err != nil {
		t.Fatal(err)
	}
	got := run(t, m, quantPrompt, quantExtra)
	for i := range want {
		if !slices.Equal(got[i], want[i]) {
			t.Fatalf("step %d: logits on the caller's backend differ from the model's own", i)
		}
	}
	// A backend without grouped products gives the same.
	cpu := kernels.NewCPU(2)
	defer cpu.Close()
	plain := load(t, f, Options{Backend: struct {
		kernels.Backend
		kernels.HostKV
	}{cpu, cpu}})
	for i, l := range run(t, plain, quantPrompt, quantExtra) {
		if !slices.Equal(l, want[i]) {
			t.Fatalf("step %d: logits on a backend without grouped products differ", i)
		}
	}
	// ForwardBatch too, over a page pool, concurrently with Forward.
	pool, err := kvcache.New(m.Config().KVLayout(4, quant.F16), 64)
	if err != nil {
		t.Fatal(err)
	}
	pages, err := pool.Alloc(pool.Layout().PagesFor(len(quantPrompt)))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() { run(t, m, quantPrompt, quantExtra) })
	logits := make([]float32, m.Config().Vocab)
	if err := m.ForwardBatch(pool, []Chunk{{Tokens: quantPrompt, Pages: pages, Logits: logits}}); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if b, w := be.live(); b == 0 || w == 0 {
		t.Fatalf("%d buffers and %d matrices on the backend while the model is loaded", b, w)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if b, w := be.live(); b != 0 || w != 0 {
		t.Errorf("%d buffers and %d matrices left on the backend after Close", b, w)
	}
	if _, err := be.Alloc(1); err != nil {
		t.Errorf("the caller's backend after the model's Close: %v", err)
	}
}

// TestLoadFailsCleanly makes the backend refuse a weight matrix halfway
// through Load: the error says which tensor, and everything already put
// on the backend is freed.
func TestLoadFailsCleanly(t *testing.T) {
	f := writeModel(t, tinySpec())
	be := &countingCPU{CPU: kernels.NewCPU(1), loadsLeft: 5}
	defer be.Close()
	m, err := Load(f, Options{Backend: be})
	if err == nil {
		m.Close()
		t.Fatal("Load succeeded with a backend that refuses the fifth matrix")
	}
	if !errors.Is(err, kernels.ErrUnsupported) || !strings.Contains(err.Error(), "tensor blk.") {
		t.Errorf("Load: %v; want the backend's error naming the tensor", err)
	}
	if b, w := be.live(); b != 0 || w != 0 {
		t.Errorf("%d buffers and %d matrices left on the backend after a failed Load", b, w)
	}
}

// TestOwnMemoryBackend runs a model on a backend that computes only on
// KV pages of its own memory, as a GPU does (the CPU backend without its
// HostKV method): a ContiguousCache and a page pool allocated for that
// backend (kvcache.NewOn) give the host's logits bit for bit; pages in
// host memory, or another backend's, are refused with errors that name
// the problem, not a panic.
func TestOwnMemoryBackend(t *testing.T) {
	f := writeModel(t, tinySpec())
	cpu := kernels.NewCPU(1)
	defer cpu.Close()
	host := load(t, f, Options{Backend: cpu})
	be := opaque{cpu}
	m := load(t, f, Options{Backend: be})
	cfg := m.Config()

	// Forward over a ContiguousCache: its pages move to the backend.
	want := run(t, host, quantPrompt, quantExtra)
	got := run(t, m, quantPrompt, quantExtra)
	for i := range want {
		if !slices.Equal(got[i], want[i]) {
			t.Fatalf("Forward step %d: logits with the cache on the backend's memory differ from the host's", i)
		}
	}
	cache, err := NewContiguousCache(cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Forward([]int32{1}, 0, cache, nil); err != nil {
		t.Fatal(err)
	}
	if err := host.Forward([]int32{1}, 1, cache, nil); !errors.Is(err, engine.ErrUnsupported) {
		t.Errorf("a cache whose pages are on one backend, used on another: %v, want ErrUnsupported", err)
	}
	if err := cache.Close(); err != nil {
		t.Fatal(err)
	}

	// ForwardBatch over a pool of the backend's pages.
	for _, dtype := range []quant.Type{quant.F32, quant.F16} {
		l := cfg.KVLayout(4, dtype)
		hostPool, err := kvcache.New(l, 16)
		if err != nil {
			t.Fatal(err)
		}
		devPool, err := kvcache.NewOn(be, l, 16)
		if err != nil {
			t.Fatal(err)
		}
		if !devPool.Device() {
			t.Fatal("kvcache.NewOn(own-memory backend) made a host pool")
		}
		forward := func(m Model, pool *kvcache.Pool) [][]float32 {
			pages, err := pool.Alloc(l.PagesFor(len(quantPrompt) + len(quantExtra)))
			if err != nil {
				t.Fatal(err)
			}
			var out [][]float32
			pos := 0
			for _, toks := range [][]int32{quantPrompt, quantExtra[:1], quantExtra[1:2]} {
				logits := make([]float32, cfg.Vocab)
				if err := m.ForwardBatch(pool, []Chunk{{Tokens: toks, Pos: pos, Pages: pages, Logits: logits}}); err != nil {
					t.Fatal(err)
				}
				pos += len(toks)
				out = append(out, logits)
			}
			return out
		}
		want, got := forward(host, hostPool), forward(m, devPool)
		for i := range want {
			if !slices.Equal(got[i], want[i]) {
				t.Fatalf("%s: ForwardBatch step %d: logits over the backend's pages differ from the host pool's", dtype, i)
			}
		}
		if err := m.ForwardBatch(hostPool, []Chunk{{Tokens: []int32{1}, Pages: []kvcache.PageID{0}}}); !errors.Is(err, engine.ErrUnsupported) {
			t.Errorf("ForwardBatch over host pages on an own-memory backend: %v, want ErrUnsupported", err)
		}
		if err := host.ForwardBatch(devPool, []Chunk{{Tokens: []int32{1}, Pages: []kvcache.PageID{0}}}); !errors.Is(err, engine.ErrUnsupported) {
			t.Errorf("ForwardBatch over another backend's pages: %v, want ErrUnsupported", err)
		}
		if err := devPool.Close(); err != nil {
			t.Fatal(err)
		}
	}

	own := load(t, f, Options{Threads: 1})
	if err := own.Forward([]int32{1}, 0, otherCache{cache}, nil); !errors.Is(err, engine.ErrInvalidInput) {
		t.Errorf("Forward over another KVCache type: %v, want ErrInvalidInput", err)
	}
}

// otherCache is a KVCache that is not a *ContiguousCache.
type otherCache struct{ *ContiguousCache }

// TestContiguousCacheView checks that View reads back what Put stored,
// across page boundaries.
func TestContiguousCacheView(t *testing.T) {
	cfg := Config{Layers: 2, KVHeads: 2, HeadDim: 4, ContextLength: 200}
	c, err := NewContiguousCache(cfg, 150)
	if err != nil {
		t.Fatal(err)
	}
	row := func(layer, pos int, v bool) []float32 {
		r := make([]float32, cfg.KVDim())
		for i := range r {
			r[i] = float32(layer*100000 + pos*10 + i)
			if v {
				r[i] = -r[i]
			}
		}
		return r
	}
	for layer := range 2 {
		for pos := range 150 {
			c.Put(layer, pos, row(layer, pos, false), row(layer, pos, true))
		}
	}
	for layer := range 2 {
		k, v := c.View(layer, 150)
		for pos := range 150 {
			d := cfg.KVDim()
			if !slices.Equal(k[pos*d:(pos+1)*d], row(layer, pos, false)) || !slices.Equal(v[pos*d:(pos+1)*d], row(layer, pos, true)) {
				t.Fatalf("layer %d position %d: View differs from Put", layer, pos)
			}
		}
	}
}
