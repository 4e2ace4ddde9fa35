package cuda

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"testing"

	"github.com/baton-serving/baton/kernels"
	"github.com/baton-serving/baton/kernels/internal/kerneltest"
	"github.com/baton-serving/baton/kernels/quant"
	"github.com/baton-serving/baton/kernels/vec"
)

// Every kernel of the CUDA backend is compared with the CPU backend (and,
// for weight products, with quant's reference dot products) on random
// data. Without a GPU (or in a build without the cuda tag) the tests skip,
// unless BATON_REQUIRE_CUDA=1, which makes that a failure: the device
// check script sets it. BATON_CUDA_PTX names a PTX file to load instead
// of the embedded kernels.

// gpuTypes are the weight types the CUDA backend computes with.
var gpuTypes = []quant.Type{quant.F32, quant.F16, quant.BF16, quant.Q8_0, quant.Q4_0,
	quant.Q4_1, quant.Q5_0, quant.Q5_1, quant.IQ4_NL, quant.Q2_K, quant.Q3_K, quant.Q4_K, quant.Q5_K, quant.Q6_K, quant.IQ4_XS}

func newGPU(tb testing.TB) kernels.Backend {
	tb.Helper()
	var opts Options
	if p := os.Getenv("BATON_CUDA_PTX"); p != "" {
		data, err := os.ReadFile(p)
		if err != nil {
			tb.Fatalf("BATON_CUDA_PTX: %v", err)
		}
		opts.PTX = string(data)
	}
	b, err := New(opts)
	if err != nil {
		if os.Getenv("BATON_REQUIRE_CUDA") == "1" {
			tb.Fatalf("BATON_REQUIRE_CUDA=1, but the CUDA backend is unavailable: %v", err)
		}
		tb.Skipf("no CUDA backend (BATON_REQUIRE_CUDA=1 makes this a failure): %v", err)
	}
	tb.Cleanup(func() {
		if err := b.Close(); err != nil {
			tb.Errorf("Close: %v", err)
		}
	})
	return b
}

func newCPU(tb testing.TB) *kernels.CPU {
	c := kernels.NewCPU(2)
	tb.Cleanup(func() { c.Close() })
	return c
}

func randMatrix(tb testing.TB, rng *rand.Rand, typ quant.Type, rows, cols int) ([]byte, []float32) {
	tb.Helper()
	f := kerneltest.RandFloats(rng, rows*cols, 1)
	rb, err := quant.RowBytes(typ, uint64(cols))
	if err != nil {
		tb.Fatal(err)
	}
	data := make([]byte, rows*int(rb))
	if err := quant.Quantize(typ, f, data); err != nil {
		tb.Fatal(err)
	}
	if err := quant.Dequantize(typ, data, f); err != nil {
		tb.Fatal(err)
	}
	return data, f
}

func upload(tb testing.TB, b kernels.Backend, x []float32) kernels.Buffer {
	tb.Helper()
	buf, err := kernels.Upload(b, x)
	if err != nil {
		tb.Fatal(err)
	}
	return buf
}

func alloc(tb testing.TB, b kernels.Backend, n int) kernels.Buffer {
	tb.Helper()
	buf, err := b.Alloc(n)
	if err != nil {
		tb.Fatal(err)
	}
	return buf
}

func read(tb testing.TB, b kernels.Backend, buf kernels.Buffer) []float32 {
	tb.Helper()
	out := make([]float32, buf.Len())
	if err := b.Read(out, buf); err != nil {
		tb.Fatal(err)
	}
	return out
}

// near checks got against want element by element: |got−want| ≤
// rel·|want| + abs.
func near(t *testing.T, what string, got, want []float32, rel, abs float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range got {
		if d := math.Abs(float64(got[i] - want[i])); !(d <= rel*math.Abs(float64(want[i]))+abs) {
			t.Fatalf("%s: [%d] = %v, want %v (difference %g)", what, i, got[i], want[i], d)
		}
	}
}

func TestName(t *testing.T) {
	g := newGPU(t)
	t.Logf("backend: %s", g.Name())
}

func TestMatMul(t *testing.T) {
	g := newGPU(t)
	c := newCPU(t)
	rng := rand.New(rand.NewPCG(1, 2))
	for _, typ := range gpuTypes {
		// 96 and 2048 columns take the vector loads of the float kernels,
		// 68 and 136 the scalar ones.
		shapes := [][2]int{{37, 96}, {256, 2048}}
		switch typ.BlockSize() {
		case 256: // the K-quants and IQ4_XS
			shapes = [][2]int{{37, 256}, {256, 2048}, {5, 768}}
		case 32:
			shapes = append(shapes, [2]int{5, 32})
		default:
			shapes = append(shapes, [2]int{37, 68}, [2]int{3, 136})
		}
		for _, sh := range shapes {
			rows, cols := sh[0], sh[1]
			t.Run(fmt.Sprintf("%s/%dx%d", typ, rows, cols), func(t *testing.T) {
				data, wf := randMatrix(t, rng, typ, rows, cols)
				gw, err := g.LoadMatrix(typ, rows, cols, data)
				if err != nil {
					t.Fatal(err)
				}
				cw, err := c.LoadMatrix(typ, rows, cols, data)
				if err != nil {
					t.Fatal(err)
				}
				for _, tokens := range []int{1, 3, 9, 17} {
					// Σ|w·x| per output bounds the rounding of any
					// summation order.
					mag := func(x []float32) []float64 {
						m := make([]float64, tokens*rows)
						for tok := range tokens {
							for r := range rows {
								for k := range cols {
									m[tok*rows+r] += math.Abs(float64(wf[r*cols+k] * x[tok*cols+k]))
								}
							}
						}
						return m
					}
					check := func(what string, got, want []float32, m []float64) {
						t.Helper()
						for i := range got {
							if d := math.Abs(float64(got[i] - want[i])); !(d <= 1e-5*m[i]+1e-30) {
								t.Fatalf("tokens %d, %s: [%d] = %v, want %v (Σ|w·x| = %g)", tokens, what, i, got[i], want[i], m[i])
							}
						}
					}

					// Against the CPU backend, with activations its
					// quantization keeps exactly.
					x := kerneltest.ExactActivations(rng, tokens*cols)
					gd := alloc(t, g, tokens*rows)
					if err := g.MatMul(gd, gw, upload(t, g, x)); err != nil {
						t.Fatal(err)
					}
					want := make([]float32, tokens*rows)
					if err := c.MatMul(c.Wrap(want), cw, c.Wrap(x)); err != nil {
						t.Fatal(err)
					}
					check("vs CPU backend", read(t, g, gd), want, mag(x))

					// Against the reference dot products, with random
					// activations at an odd offset (scalar loads).
					x = kerneltest.RandFloats(rng, tokens*cols, 3)
					xb := alloc(t, g, tokens*cols+1)
					if err := g.Write(xb.Slice(1, tokens*cols+1), x); err != nil {
						t.Fatal(err)
					}
					if err := g.MatMul(gd, gw, xb.Slice(1, tokens*cols+1)); err != nil {
						t.Fatal(err)
					}
					// F16 and BF16 products multiply the activations
					// rounded to the weights' type, as the CPU's do.
					xr := slices.Clone(x)
					switch typ {
					case quant.F16:
						vec.RoundF16(xr, x)
					case quant.BF16:
						vec.RoundBF16(xr, x)
					}
					rb := len(data) / rows
					for tok := range tokens {
						for r := range rows {
							want[tok*rows+r] = quant.Dot(typ, data[r*rb:(r+1)*rb], xr[tok*cols:(tok+1)*cols])
						}
					}
					check("vs reference, unaligned input", read(t, g, gd), want, mag(x))
				}
			})
		}
	}
}

func TestEmbed(t *testing.T) {
	g := newGPU(t)
	c := newCPU(t)
	rng := rand.New(rand.NewPCG(3, 4))
	ids := []int32{3, 0, 9, 3}
	for _, typ := range gpuTypes {
		const rows = 10
		cols := 96
		if typ.BlockSize() == 256 {
			cols = 512
		}
		data, _ := randMatrix(t, rng, typ, rows, cols)
		gw, err := g.LoadMatrix(typ, rows, cols, data)
		if err != nil {
			t.Fatal(err)
		}
		cw, _ := c.LoadMatrix(typ, rows, cols, data)
		gd := alloc(t, g, len(ids)*cols)
		if err := g.Embed(gd, gw, ids); err != nil {
			t.Fatal(err)
		}
		want := make([]float32, len(ids)*cols)
		if err := c.Embed(c.Wrap(want), cw, ids); err != nil {
			t.Fatal(err)
		}
		near(t, "embed "+typ.String(), read(t, g, gd), want, 0, 0) // quant's dequantization, bit for bit
		if err := g.Embed(gd, gw, []int32{0, 1, rows, 2}); !errors.Is(err, kernels.ErrShape) {
			t.Errorf("%s: embedding id %d of %d rows: err %v, want ErrShape", typ, rows, rows, err)
		}
	}
}

func TestRowOps(t *testing.T) {
	g := newGPU(t)
	c := newCPU(t)
	rng := rand.New(rand.NewPCG(5, 6))
	const rows = 3

	t.Run("rmsnorm", func(t *testing.T) {
		for _, dim := range []int{64, 300, 2048} {
			x := kerneltest.RandFloats(rng, rows*dim, 3)
			w := kerneltest.RandFloats(rng, dim, 1)
			want := make([]float32, rows*dim)
			if err := c.RMSNorm(c.Wrap(want), c.Wrap(x), c.Wrap(w), 1e-5); err != nil {
				t.Fatal(err)
			}
			xb := upload(t, g, x)
			if err := g.RMSNorm(xb, xb, upload(t, g, w), 1e-5); err != nil { // in place
				t.Fatal(err)
			}
			near(t, fmt.Sprintf("rmsnorm %d", dim), read(t, g, xb), want, 0, 0) // the CPU's rounding, bit for bit
		}
	})

	for _, layout := range []kernels.RopeLayout{kernels.RopeNormal, kernels.RopeNeoX} {
		t.Run("rope/"+layout.String(), func(t *testing.T) {
			for _, shape := range [][3]int{{4, 10, 4}, {32, 64, 32}} {
				heads, hd, half := shape[0], shape[1], shape[2]
				x := kerneltest.RandFloats(rng, rows*heads*hd, 2)
				cos, sin := make([]float32, rows*half), make([]float32, rows*half)
				for r := range rows {
					kernels.RopeTable(cos[r*half:(r+1)*half], sin[r*half:(r+1)*half], 100*r+3, 10000, 1, nil)
				}
				want := slices.Clone(x)
				if err := c.Rope(c.Wrap(want), c.Wrap(cos), c.Wrap(sin), rows, hd, layout); err != nil {
					t.Fatal(err)
				}
				xb := upload(t, g, x)
				if err := g.Rope(xb, upload(t, g, cos), upload(t, g, sin), rows, hd, layout); err != nil {
					t.Fatal(err)
				}
				near(t, fmt.Sprintf("rope %d×%d", heads, hd), read(t, g, xb), want, 0, 1e-6)
			}
		})
	}

	t.Run("softmax", func(t *testing.T) {
		for _, cols := range []int{1, 100, 32000} {
			x := kerneltest.RandFloats(rng, rows*cols, 20)
			want := slices.Clone(x)
			if err := c.Softmax(c.Wrap(want), rows); err != nil {
				t.Fatal(err)
			}
			xb := upload(t, g, x)
			if err := g.Softmax(xb, rows); err != nil {
				t.Fatal(err)
			}
			near(t, fmt.Sprintf("softmax %d", cols), read(t, g, xb), want, 1e-5, 1e-9)
		}
	})

	t.Run("silu-mul", func(t *testing.T) {
		n := 5000
		gate, up := kerneltest.RandFloats(rng, n, 10), kerneltest.RandFloats(rng, n, 1)
		want := make([]float32, n)
		if err := c.SiLUMul(c.Wrap(want), c.Wrap(gate), c.Wrap(up)); err != nil {
			t.Fatal(err)
		}
		gb := upload(t, g, gate)
		if err := g.SiLUMul(gb, gb, upload(t, g, up)); err != nil {
			t.Fatal(err)
		}
		near(t, "silu·mul", read(t, g, gb), want, 1e-6, 1e-7)
	})

	t.Run("add", func(t *testing.T) {
		const dim = 700
		a, bias := kerneltest.RandFloats(rng, rows*dim, 1), kerneltest.RandFloats(rng, dim, 1)
		want := make([]float32, rows*dim)
		if err := c.Add(c.Wrap(want), c.Wrap(a), c.Wrap(bias)); err != nil {
			t.Fatal(err)
		}
		ab := upload(t, g, a)
		if err := g.Add(ab, ab, upload(t, g, bias)); err != nil {
			t.Fatal(err)
		}
		near(t, "bias add", read(t, g, ab), want, 0, 0)
		if err := g.Add(ab, ab, upload(t, g, a)); err != nil {
			t.Fatal(err)
		}
		for i := range want {
			want[i] += a[i]
		}
		near(t, "residual add", read(t, g, ab), want, 0, 0)
	})
}

func TestCopy(t *testing.T) {
	g := newGPU(t)
	x := []float32{1, 2, 3, 4, 5, 6, 7, 8}
	b := upload(t, g, x)
	// Overlapping, forwards: b[2:8] = b[0:6].
	if err := g.Copy(b.Slice(2, 8), b.Slice(0, 6)); err != nil {
		t.Fatal(err)
	}
	if got, want := read(t, g, b), []float32{1, 2, 1, 2, 3, 4, 5, 6}; !slices.Equal(got, want) {
		t.Errorf("overlapping copy: %v, want %v", got, want)
	}
	other := alloc(t, g, 3)
	if err := g.Copy(other, b.Slice(5, 8)); err != nil {
		t.Fatal(err)
	}
	if got := read(t, g, other); !slices.Equal(got, []float32{4, 5, 6}) {
		t.Errorf("copy: %v", got)
	}
}

// kvSetup stores two sequences' keys and values, in scattered pages, on
// both backends.
type kvSetup struct {
	l      kernels.KVLayout
	pages  int
	layer  int
	tables [][]int32
	lens   []int
}

// newCaches makes one KV cache of s's layout and size on each backend.
func (s kvSetup) newCaches(t *testing.T, backends []kernels.Backend) []kernels.KVCache {
	t.Helper()
	caches := make([]kernels.KVCache, len(backends))
	for i, b := range backends {
		kv, err := b.NewKVCache(s.l, s.pages)
		if err != nil {
			t.Fatal(err)
		}
		caches[i] = kv
	}
	return caches
}

func (s kvSetup) store(t *testing.T, rng *rand.Rand, backends []kernels.Backend, caches []kernels.KVCache) {
	t.Helper()
	for si, table := range s.tables {
		n := s.lens[si]
		k, v := kerneltest.RandFloats(rng, n*s.l.RowElems(), 2), kerneltest.RandFloats(rng, n*s.l.RowElems(), 1)
		slots := make([]int32, n)
		for p := range slots {
			slots[p] = table[p/s.l.PageSize]*int32(s.l.PageSize) + int32(p%s.l.PageSize)
		}
		for i, b := range backends {
			if err := b.StoreKV(caches[i], s.layer, slots, upload(t, b, k), upload(t, b, v)); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func TestKVCacheAndAttention(t *testing.T) {
	g := newGPU(t)
	c := newCPU(t)
	rng := rand.New(rand.NewPCG(7, 8))
	for _, dtype := range []quant.Type{quant.F32, quant.F16} {
		for _, hd := range []int{8, 40, 64, 128} {
			t.Run(fmt.Sprintf("%s/head%d", dtype, hd), func(t *testing.T) {
				s := kvSetup{
					l:      kernels.KVLayout{Layers: 3, KVHeads: 2, HeadDim: hd, PageSize: 4, DType: dtype},
					pages:  40,
					layer:  1,
					tables: [][]int32{{5, 2, 9}, {0, 7, 3, 11, 1, 4, 6}, make([]int32, 30)},
					lens:   []int{11, 27, 120},
				}
				for i := range s.tables[2] {
					s.tables[2][i] = int32(39 - i)
				}
				backends := []kernels.Backend{g, c}
				caches := s.newCaches(t, backends)
				s.store(t, rng, backends, caches)

				// The stored bytes agree exactly.
				gp, cp := make([]byte, 2*s.l.BlockBytes()), make([]byte, 2*s.l.BlockBytes())
				for p := range s.pages {
					for layer := range s.l.Layers {
						if err := g.ExportKV(gp, caches[0], p, layer); err != nil {
							t.Fatal(err)
						}
						if err := c.ExportKV(cp, caches[1], p, layer); err != nil {
							t.Fatal(err)
						}
						if !slices.Equal(gp, cp) {
							t.Fatalf("page %d layer %d: the GPU's bytes differ from the CPU's", p, layer)
						}
					}
				}

				rows := []kernels.AttnRow{
					{Pages: s.tables[0], Len: 11}, {Pages: s.tables[1], Len: 1}, {Pages: s.tables[1], Len: 5},
					{Pages: s.tables[1], Len: 27}, {Pages: s.tables[0], Len: 8}, {Pages: s.tables[2], Len: 120},
					{Pages: s.tables[2], Len: 9},
				}
				const heads = 6
				q := kerneltest.RandFloats(rng, len(rows)*heads*hd, 1)
				want := make([]float32, len(q))
				if err := c.Attention(c.Wrap(want), c.Wrap(q), caches[1], s.layer, rows); err != nil {
					t.Fatal(err)
				}
				out := alloc(t, g, len(q))
				if err := g.Attention(out, upload(t, g, q), caches[0], s.layer, rows); err != nil {
					t.Fatal(err)
				}
				near(t, "attention", read(t, g, out), want, 1e-5, 1e-6)
			})
		}
	}
}

func TestKVPageIO(t *testing.T) {
	g := newGPU(t)
	rng := rand.New(rand.NewPCG(9, 10))
	l := kernels.KVLayout{Layers: 2, KVHeads: 2, HeadDim: 8, PageSize: 4, DType: quant.F16}
	kv, err := g.NewKVCache(l, 4)
	if err != nil {
		t.Fatal(err)
	}
	page := make([]byte, 2*l.BlockBytes())
	for i := range page {
		page[i] = byte(rng.IntN(256))
	}
	if err := g.ImportKV(kv, 2, 1, page); err != nil {
		t.Fatal(err)
	}
	if err := g.CopyKVPage(kv, 3, 2); err != nil {
		t.Fatal(err)
	}
	back := make([]byte, len(page))
	if err := g.ExportKV(back, kv, 3, 1); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(back, page) {
		t.Error("a page imported, copied and exported changed")
	}
	if err := g.ExportKV(back, kv, 3, 0); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(back, make([]byte, len(back))) {
		t.Error("a new cache is not zeroed")
	}
	if err := g.ExportKV(back, kv, 4, 0); !errors.Is(err, kernels.ErrShape) {
		t.Errorf("exporting page 4 of 4: err %v, want ErrShape", err)
	}
}

// TestKVCopiesConcurrent: transfers export and import pages from several
// goroutines while the forward steps keep the default stream busy (the
// copies run on a stream of their own and wait without the backend's
// lock); every page comes back as it went in, and Close waits for none.
func TestKVCopiesConcurrent(t *testing.T) {
	g := newGPU(t)
	l := kernels.KVLayout{Layers: 3, KVHeads: 2, HeadDim: 16, PageSize: 8, DType: quant.F16}
	const workers, rounds = 6, 40
	kv, err := g.NewKVCache(l, workers)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	busy := make(chan error, 1)
	x := upload(t, g, kerneltest.RandFloats(rand.New(rand.NewPCG(41, 42)), 256, 1))
	y := alloc(t, g, 256)
	go func() {
		// Kernels on the default stream meanwhile.
		for {
			select {
			case <-stop:
				busy <- g.Sync()
				return
			default:
			}
			if err := g.SiLUMul(y, x, x); err != nil {
				busy <- err
				return
			}
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 43))
			in, out := make([]byte, 2*l.BlockBytes()), make([]byte, 2*l.BlockBytes())
			for r := range rounds {
				for i := range in {
					in[i] = byte(rng.IntN(256))
				}
				layer := r % l.Layers
				if err := g.ImportKV(kv, w, layer, in); err != nil {
					errs <- err
					return
				}
				if err := g.ExportKV(out, kv, w, layer); err != nil {
					errs <- err
					return
				}
				if !slices.Equal(in, out) {
					errs <- fmt.Errorf("worker %d round %d: the page exported is not the page imported", w, r)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	if err := <-busy; err != nil {
		t.Fatal(err)
	}
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestRejectsBadOperands(t *testing.T) {
	g := newGPU(t)
	c := newCPU(t)
	a := alloc(t, g, 8)
	freed := alloc(t, g, 8)
	if err := g.Free(freed); err != nil {
		t.Fatal(err)
	}
	w, err := g.LoadMatrix(quant.F32, 2, 4, make([]byte, 32))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		err  error
		op   func() error
	}{
		{"CPU buffer", kernels.ErrForeign, func() error { return g.Add(a, a, c.Wrap(make([]float32, 8))) }},
		{"freed buffer", kernels.ErrForeign, func() error { return g.Add(a, a, freed) }},
		{"free a slice", kernels.ErrShape, func() error { return g.Free(a.Slice(0, 4)) }},
		{"matmul in place", kernels.ErrShape, func() error { return g.MatMul(a.Slice(0, 2), w, a.Slice(0, 4)) }},
		{"matmul ragged", kernels.ErrShape, func() error { return g.MatMul(a.Slice(0, 2), w, a.Slice(2, 7)) }},
		{"Q8_1 weights", kernels.ErrUnsupported, func() error {
			_, err := g.LoadMatrix(quant.Q8_1, 1, 32, make([]byte, 36))
			return err
		}},
		{"write length", kernels.ErrShape, func() error { return g.Write(a, make([]float32, 7)) }},
		{"head dimension 512", kernels.ErrUnsupported, func() error {
			l := kernels.KVLayout{Layers: 1, KVHeads: 1, HeadDim: 512, PageSize: 1, DType: quant.F16}
			kv, err := g.NewKVCache(l, 1)
			if err != nil {
				return err
			}
			q := alloc(t, g, 512)
			return g.Attention(alloc(t, g, 512), q, kv, 0, []kernels.AttnRow{{Pages: []int32{0}, Len: 1}})
		}},
	}
	for _, tc := range tests {
		if err := tc.op(); !errors.Is(err, tc.err) {
			t.Errorf("%s: err %v, want %v", tc.name, err, tc.err)
		}
	}
}

// TestDecodeSteps runs a small Llama-shaped decoder (one block, F16
// weights, grouped-query attention, F16 pages) for several steps on both
// backends, through every operation in the order a forward pass issues
// them, and compares the output distributions.
func TestDecodeSteps(t *testing.T) {
	g := newGPU(t)
	c := newCPU(t)
	rng := rand.New(rand.NewPCG(11, 12))
	const (
		vocab, dim, hidden = 300, 128, 352
		heads, kvHeads, hd = 4, 2, 32
		steps, pageSize    = 6, 4
	)
	mats := map[string][2]int{
		"embd": {vocab, dim}, "wq": {heads * hd, dim}, "wk": {kvHeads * hd, dim}, "wv": {kvHeads * hd, dim},
		"wo": {dim, heads * hd}, "gate": {hidden, dim}, "up": {hidden, dim}, "down": {dim, hidden}, "out": {vocab, dim},
	}
	data := map[string][]byte{}
	// In name order, so that every run draws the same weights (a map's
	// order would give each run a different model).
	for _, name := range slices.Sorted(maps.Keys(mats)) {
		sh := mats[name]
		data[name], _ = randMatrix(t, rng, quant.F16, sh[0], sh[1])
	}
	norm1, norm2, normOut := kerneltest.RandFloats(rng, dim, 1), kerneltest.RandFloats(rng, dim, 1), kerneltest.RandFloats(rng, dim, 1)
	l := kernels.KVLayout{Layers: 1, KVHeads: kvHeads, HeadDim: hd, PageSize: pageSize, DType: quant.F16}
	table := []int32{3, 0}
	tokens := []int32{1, 17, 299, 42, 42, 7}

	run := func(b kernels.Backend) [][]float32 {
		w := map[string]kernels.Matrix{}
		for name, sh := range mats {
			m, err := b.LoadMatrix(quant.F16, sh[0], sh[1], data[name])
			if err != nil {
				t.Fatal(err)
			}
			w[name] = m
		}
		kv, err := b.NewKVCache(l, 4)
		if err != nil {
			t.Fatal(err)
		}
		n1, n2, no := upload(t, b, norm1), upload(t, b, norm2), upload(t, b, normOut)
		x, xb := alloc(t, b, dim), alloc(t, b, dim)
		q, k, v, att := alloc(t, b, heads*hd), alloc(t, b, kvHeads*hd), alloc(t, b, kvHeads*hd), alloc(t, b, heads*hd)
		gate, up := alloc(t, b, hidden), alloc(t, b, hidden)
		cos, sin := alloc(t, b, hd/2), alloc(t, b, hd/2)
		logits := alloc(t, b, vocab)
		var probs [][]float32
		must := func(err error) {
			t.Helper()
			if err != nil {
				t.Fatal(err)
			}
		}
		for pos, tok := range tokens {
			cs, sn := make([]float32, hd/2), make([]float32, hd/2)
			kernels.RopeTable(cs, sn, pos, 10000, 1, nil)
			must(b.Write(cos, cs))
			must(b.Write(sin, sn))
			must(b.Embed(x, w["embd"], []int32{tok}))
			must(b.RMSNorm(xb, x, n1, 1e-5))
			must(b.MatMul(q, w["wq"], xb))
			must(b.MatMul(k, w["wk"], xb))
			must(b.MatMul(v, w["wv"], xb))
			must(b.Rope(q, cos, sin, 1, hd, kernels.RopeNormal))
			must(b.Rope(k, cos, sin, 1, hd, kernels.RopeNormal))
			must(b.StoreKV(kv, 0, []int32{table[pos/pageSize]*pageSize + int32(pos%pageSize)}, k, v))
			must(b.Attention(att, q, kv, 0, []kernels.AttnRow{{Pages: table, Len: pos + 1}}))
			must(b.MatMul(xb, w["wo"], att))
			must(b.Add(x, x, xb))
			must(b.RMSNorm(xb, x, n2, 1e-5))
			must(b.MatMul(gate, w["gate"], xb))
			must(b.MatMul(up, w["up"], xb))
			must(b.SiLUMul(gate, gate, up))
			must(b.MatMul(xb, w["down"], gate))
			must(b.Add(x, x, xb))
			must(b.RMSNorm(xb, x, no, 1e-5))
			must(b.MatMul(logits, w["out"], xb))
			must(b.Softmax(logits, 1))
			probs = append(probs, read(t, b, logits))
		}
		must(b.Sync())
		return probs
	}
	gp, cp := run(g), run(c)
	for step := range gp {
		// Both backends round the activations of every F16 product to
		// binary16 (as ggml does) but add up in different orders, so a
		// float32 activation a last bit apart can round to neighbouring
		// binary16 values: one such flip moves an activation by 2⁻¹¹ of
		// itself, and a logit of this unit-weight model by up to ~1.5e-3,
		// which is a relative 1.5e-3 in its probability, and flips add
		// up. Over 20 random draws of these weights, 16 stayed within
		// 1e-3 of the CPU's probabilities and the largest difference was
		// 4.6e-3; the tolerance bounds that, not a lucky draw.
		near(t, fmt.Sprintf("step %d probabilities", step), gp[step], cp[step], 1e-2, 1e-7)
	}
}

func BenchmarkMatVec(b *testing.B) {
	g := newGPU(b)
	rng := rand.New(rand.NewPCG(13, 14))
	for _, typ := range []quant.Type{quant.F32, quant.F16, quant.Q8_0} {
		for _, shape := range [][2]int{{2048, 2048}, {5632, 2048}} {
			rows, cols := shape[0], shape[1]
			b.Run(fmt.Sprintf("%s/%dx%d", typ, rows, cols), func(b *testing.B) {
				data, _ := randMatrix(b, rng, typ, rows, cols)
				w, err := g.LoadMatrix(typ, rows, cols, data)
				if err != nil {
					b.Fatal(err)
				}
				defer g.FreeMatrix(w)
				x := upload(b, g, kerneltest.RandFloats(rng, cols, 1))
				dst := alloc(b, g, rows)
				if err := g.Sync(); err != nil {
					b.Fatal(err)
				}
				b.ResetTimer()
				for b.Loop() {
					if err := g.MatMul(dst, w, x); err != nil {
						b.Fatal(err)
					}
				}
				if err := g.Sync(); err != nil {
					b.Fatal(err)
				}
				sec := b.Elapsed().Seconds() / float64(b.N)
				b.ReportMetric(float64(len(data))/sec/1e9, "GB/s")
				b.ReportMetric(2*float64(rows*cols)/sec/1e9, "GFLOP/s")
			})
		}
	}
}

// BenchmarkAttentionDecode is one decode step's attention for 32 query
// heads over 8 KV heads of 64 (TinyLlama's shape) at several context
// lengths, reporting the rate at which it reads the cache.
func BenchmarkAttentionDecode(b *testing.B) {
	g := newGPU(b)
	rng := rand.New(rand.NewPCG(15, 16))
	const heads, pageSize = 32, 16
	l := kernels.KVLayout{Layers: 1, KVHeads: 8, HeadDim: 64, PageSize: pageSize, DType: quant.F16}
	for _, n := range []int{256, 2048} {
		b.Run(fmt.Sprintf("ctx%d", n), func(b *testing.B) {
			pages := n / pageSize
			kv, err := g.NewKVCache(l, pages)
			if err != nil {
				b.Fatal(err)
			}
			defer g.FreeKVCache(kv)
			table := make([]int32, pages)
			for i := range table {
				table[i] = int32(i)
			}
			q := upload(b, g, kerneltest.RandFloats(rng, heads*l.HeadDim, 1))
			out := alloc(b, g, heads*l.HeadDim)
			rows := []kernels.AttnRow{{Pages: table, Len: n}}
			b.ResetTimer()
			for b.Loop() {
				if err := g.Attention(out, q, kv, 0, rows); err != nil {
					b.Fatal(err)
				}
			}
			if err := g.Sync(); err != nil {
				b.Fatal(err)
			}
			sec := b.Elapsed().Seconds() / float64(b.N)
			b.ReportMetric(float64(2*n*l.RowBytes())/sec/1e9, "GB/s")
		})
	}
}

// BenchmarkKVCopy is what a PD transfer asks of the GPU: one layer of one
// KV page (TinyLlama's: 8 KV heads of 64, 16 tokens, F16 keys and values,
// 32 KiB) copied out to host memory (ExportKV, prefill's side) and in from
// it (ImportKV, decode's), and a whole page copied within the device
// (CopyKVPage, a shared prefix's copy on write), reporting bytes moved per
// second.
func BenchmarkKVCopy(b *testing.B) {
	g := newGPU(b)
	const pages = 64
	l := kernels.KVLayout{Layers: 22, KVHeads: 8, HeadDim: 64, PageSize: 16, DType: quant.F16}
	kv, err := g.NewKVCache(l, pages)
	if err != nil {
		b.Fatal(err)
	}
	defer g.FreeKVCache(kv)
	buf := make([]byte, 2*l.PageSize*l.RowBytes())
	report := func(b *testing.B, bytes int) {
		if err := g.Sync(); err != nil {
			b.Fatal(err)
		}
		sec := b.Elapsed().Seconds() / float64(b.N)
		b.ReportMetric(float64(bytes)/sec/1e9, "GB/s")
	}
	b.Run("export-layer", func(b *testing.B) {
		i := 0
		for b.Loop() {
			if err := g.ExportKV(buf, kv, i%pages, i%l.Layers); err != nil {
				b.Fatal(err)
			}
			i++
		}
		report(b, len(buf))
	})
	b.Run("import-layer", func(b *testing.B) {
		i := 0
		for b.Loop() {
			if err := g.ImportKV(kv, i%pages, i%l.Layers, buf); err != nil {
				b.Fatal(err)
			}
			i++
		}
		report(b, len(buf))
	})
	b.Run("copy-page", func(b *testing.B) {
		i := 0
		for b.Loop() {
			if err := g.CopyKVPage(kv, i%pages, (i+1)%pages); err != nil {
				b.Fatal(err)
			}
			i++
		}
		report(b, l.PageBytes())
	})
}

// TestExtendedOps compares the CUDA backend's ExtendedOps element-wise
// operations with the CPU backend's: GELU·mul and scale bit for bit,
// soft-cap within a few ulp of the cap (tanhf against a correctly rounded
// tanh).
func TestExtendedOps(t *testing.T) {
	gb := newGPU(t)
	g, ok := gb.(kernels.ExtendedOps)
	if !ok {
		t.Fatal("the CUDA backend does not implement kernels.ExtendedOps")
	}
	c := newCPU(t)
	rng := rand.New(rand.NewPCG(21, 22))
	const n = 5000

	t.Run("gelu-mul", func(t *testing.T) {
		gate, up := kerneltest.RandFloats(rng, n, 12), kerneltest.RandFloats(rng, n, 2)
		// The table's edges and a value on which ggml's FMA matters.
		copy(gate, []float32{-10, 10, -9.999, 9.999, 0, float32(math.Copysign(0, -1)), 1e-8, -3.98, 65504, -65504, 1e-6})
		want := make([]float32, n)
		if err := c.GELUMul(c.Wrap(want), c.Wrap(gate), c.Wrap(up)); err != nil {
			t.Fatal(err)
		}
		d := alloc(t, gb, n)
		if err := g.GELUMul(d, upload(t, gb, gate), upload(t, gb, up)); err != nil {
			t.Fatal(err)
		}
		near(t, "gelu·mul", read(t, gb, d), want, 0, 0)
		x := upload(t, gb, gate)
		if err := g.GELUMul(x, x, upload(t, gb, up)); err != nil { // in place
			t.Fatal(err)
		}
		near(t, "gelu·mul in place", read(t, gb, x), want, 0, 0)
		if err := g.GELUMul(x.Slice(1, n), x.Slice(0, n-1), d.Slice(0, n-1)); !errors.Is(err, kernels.ErrShape) {
			t.Errorf("gelu·mul into its gate at an offset: err %v, want ErrShape", err)
		}
	})

	t.Run("scale", func(t *testing.T) {
		x := kerneltest.RandFloats(rng, n, 3)
		want := make([]float32, n)
		if err := c.Scale(c.Wrap(want), c.Wrap(x), 0.125*3); err != nil {
			t.Fatal(err)
		}
		xb := upload(t, gb, x)
		if err := g.Scale(xb, xb, 0.125*3); err != nil {
			t.Fatal(err)
		}
		near(t, "scale", read(t, gb, xb), want, 0, 0)
		if err := g.Scale(xb.Slice(0, n-2), xb.Slice(2, n), 2); !errors.Is(err, kernels.ErrShape) {
			t.Errorf("scale at an offset: err %v, want ErrShape", err)
		}
	})

	t.Run("soft-cap", func(t *testing.T) {
		for _, cp := range []float32{30, 50, 0.5} {
			x := kerneltest.RandFloats(rng, n, 200)
			want := slices.Clone(x)
			if err := c.SoftCap(c.Wrap(want), cp); err != nil {
				t.Fatal(err)
			}
			xb := upload(t, gb, x)
			if err := g.SoftCap(xb, cp); err != nil {
				t.Fatal(err)
			}
			near(t, fmt.Sprintf("soft-cap %v", cp), read(t, gb, xb), want, 0, 4*0x1p-23*float64(cp))
		}
		if err := g.SoftCap(alloc(t, gb, 4), 0); !errors.Is(err, kernels.ErrShape) {
			t.Errorf("soft-cap 0: err %v, want ErrShape", err)
		}
	})
}

// TestAttentionWith compares AttentionWith on both backends with a score
// scale, a soft-cap and sliding windows, where the block table entries of
// the pages wholly before each row's window are -1: neither backend may
// read them.
func TestAttentionWith(t *testing.T) {
	gb := newGPU(t)
	g := gb.(kernels.ExtendedOps)
	c := newCPU(t)
	rng := rand.New(rand.NewPCG(23, 24))
	opts := []kernels.AttnOptions{
		{}, {SoftCap: 50}, {Scale: 0.3, SoftCap: 2}, {Window: 6}, {Window: 1}, {Window: 9, SoftCap: 10, Scale: 0.1},
		{Window: 1000},
	}
	for _, dtype := range []quant.Type{quant.F32, quant.F16} {
		for _, hd := range []int{40, 128} {
			s := kvSetup{
				l:      kernels.KVLayout{Layers: 2, KVHeads: 2, HeadDim: hd, PageSize: 4, DType: dtype},
				pages:  16,
				layer:  1,
				tables: [][]int32{{5, 2, 9}, {0, 7, 3, 11, 1, 4, 6, 15, 12}},
				lens:   []int{11, 33},
			}
			backends := []kernels.Backend{gb, c}
			caches := s.newCaches(t, backends)
			s.store(t, rng, backends, caches)
			for _, o := range opts {
				t.Run(fmt.Sprintf("%s/head%d/scale%v-cap%v-window%d", dtype, hd, o.Scale, o.SoftCap, o.Window), func(t *testing.T) {
					var rows []kernels.AttnRow
					for _, r := range []struct{ seq, n int }{{0, 11}, {1, 1}, {1, 5}, {1, 33}, {0, 8}, {1, 20}} {
						table := slices.Clone(s.tables[r.seq])
						for p := range kernels.WindowStart(r.n, o.Window) / s.l.PageSize {
							table[p] = -1
						}
						rows = append(rows, kernels.AttnRow{Pages: table, Len: r.n})
					}
					const heads = 4
					q := kerneltest.RandFloats(rng, len(rows)*heads*hd, 1)
					want := make([]float32, len(q))
					if err := c.AttentionWith(c.Wrap(want), c.Wrap(q), caches[1], s.layer, rows, o); err != nil {
						t.Fatal(err)
					}
					out := alloc(t, gb, len(q))
					if err := g.AttentionWith(out, upload(t, gb, q), caches[0], s.layer, rows, o); err != nil {
						t.Fatal(err)
					}
					near(t, "attention", read(t, gb, out), want, 1e-5, 1e-6)
				})
			}
			if err := g.AttentionWith(alloc(t, gb, heads4(hd)), alloc(t, gb, heads4(hd)), caches[0], s.layer,
				[]kernels.AttnRow{{Pages: []int32{-1, 2, 9}, Len: 11}}, kernels.AttnOptions{Window: 8}); !errors.Is(err, kernels.ErrShape) {
				t.Errorf("a window reaching a page of -1: err %v, want ErrShape", err)
			}
			if err := g.AttentionWith(alloc(t, gb, heads4(hd)), alloc(t, gb, heads4(hd)), caches[0], s.layer,
				[]kernels.AttnRow{{Pages: s.tables[0], Len: 11}}, kernels.AttnOptions{SoftCap: float32(math.NaN())}); !errors.Is(err, kernels.ErrShape) {
				t.Errorf("a NaN soft-cap: err %v, want ErrShape", err)
			}
		}
	}
}

// heads4 is the query length of one row of four heads of hd.
func heads4(hd int) int { return 4 * hd }

// TestMemory: the backend counts what it holds by use, and gives it back.
func TestMemory(t *testing.T) {
	g := newGPU(t)
	r, ok := g.(kernels.MemoryReporter)
	if !ok {
		t.Fatal("the CUDA backend reports no memory")
	}
	before, err := r.Memory()
	if err != nil {
		t.Fatal(err)
	}
	if before.Total <= 0 || before.Free <= 0 || before.Free > before.Total {
		t.Fatalf("device memory %+v", before)
	}
	w, err := g.LoadMatrix(quant.F32, 4, 8, make([]byte, 4*4*8))
	if err != nil {
		t.Fatal(err)
	}
	l := kernels.KVLayout{Layers: 2, KVHeads: 1, HeadDim: 8, PageSize: 4, DType: quant.F16}
	kv, err := g.NewKVCache(l, 3)
	if err != nil {
		t.Fatal(err)
	}
	m, err := r.Memory()
	if err != nil {
		t.Fatal(err)
	}
	if m.Weights-before.Weights != 4*4*8 || m.KV-before.KV != int64(3*l.PageBytes()) {
		t.Errorf("after a 128-byte matrix and %d bytes of KV pages: %+v (before %+v)", 3*l.PageBytes(), m, before)
	}
	if err := errors.Join(g.FreeMatrix(w), g.FreeKVCache(kv)); err != nil {
		t.Fatal(err)
	}
	if m, _ := r.Memory(); m.Weights != before.Weights || m.KV != before.KV {
		t.Errorf("after freeing them: %+v, want %+v", m, before)
	}
	if u, ok := g.(interface{ UUID() string }); !ok || u.UUID() == "" {
		t.Error("the backend reports no device UUID")
	}
}
