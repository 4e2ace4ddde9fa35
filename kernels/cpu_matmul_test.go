package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/baton-serving/baton/kernels/quant"
	"github.com/baton-serving/baton/kernels/vec"
)

// testMatrix quantizes a rows×cols matrix of N(0, 1) weights to typ and
// returns it with its dequantized values.
func testMatrix(t testing.TB, r *rand.Rand, typ quant.Type, rows, cols int) (*cpuMatrix, []float32) {
	t.Helper()
	rb, err := quant.RowBytes(typ, uint64(cols))
	if err != nil {
		t.Fatal(err)
	}
	src := make([]float32, rows*cols)
	for i := range src {
		src[i] = float32(r.NormFloat64())
	}
	data := make([]byte, rows*int(rb))
	if err := quant.Quantize(typ, src, data); err != nil {
		t.Fatal(err)
	}
	deq := make([]float32, rows*cols)
	if err := quant.Dequantize(typ, data, deq); err != nil {
		t.Fatal(err)
	}
	m, err := NewCPU(1).LoadMatrix(typ, rows, cols, data)
	if err != nil {
		t.Fatal(err)
	}
	return m.(*cpuMatrix), deq
}

// testActivations returns n rows of cols activations whose scale varies
// from row to row and block to block, with a few exact zeros.
func testActivations(r *rand.Rand, n, cols int) []float32 {
	x := make([]float32, n*cols)
	for t := range n {
		for b := 0; b < cols; b += 32 {
			scale := math.Exp(3 * (r.Float64() - 0.5))
			for i := b; i < b+32; i++ {
				if r.IntN(50) > 0 {
					x[t*cols+i] = float32(scale * r.NormFloat64())
				}
			}
		}
	}
	return x
}

// actSteps returns, for each element of the activation row x, the
// quantization step of its block for weights of type typ (0 for float
// weights).
func actSteps(typ quant.Type, x []float32) []float64 {
	steps := make([]float64, len(x))
	size := 0
	switch typ {
	case quant.Q8_0, quant.Q4_0, quant.Q4_1, quant.Q5_0, quant.Q5_1, quant.IQ4_NL:
		size = vec.Q8_0Values
	case quant.Q4_K, quant.Q6_K, quant.Q2_K, quant.Q3_K, quant.Q5_K, quant.IQ4_XS:
		size = vec.Q8_KValues
	default:
		return steps
	}
	for b := 0; b < len(x); b += size {
		var amax float64
		for _, v := range x[b : b+size] {
			amax = max(amax, math.Abs(float64(v)))
		}
		for i := b; i < b+size; i++ {
			steps[i] = amax / 127
		}
	}
	return steps
}

// TestMatmulBatchInvariance checks the invariant the batch and
// prefill/decode equivalence rest on: a token's products are bit-identical
// whether it is computed alone or inside batches of 2 to 65 tokens, at any
// offset, and with 1 or 3 threads, for every weight type. The matrix has
// rows that no tile height divides and rows long enough for the kernels to
// work in several pieces. It also checks each result against the
// reference float dot products, within the kernels' stated error (float
// rounding, plus for quantized weights the quantization of the
// activations).
func TestMatmulBatchInvariance(t *testing.T) {
	const rows, cols, tokens = 38, 4096, 72
	for _, typ := range quant.SupportedTypes() {
		t.Run(typ.String(), func(t *testing.T) {
			r := rand.New(rand.NewPCG(11, uint64(typ)))
			w, deq := testMatrix(t, r, typ, rows, cols)
			x := testActivations(r, tokens, cols)
			// Q8_0 activation blocks store their scale as binary16, whose
			// rounding moves every value by up to 2⁻¹¹ of itself.
			half := 0.0
			if act, _ := vec.ActivationType(typ); act == quant.Q8_0 || act == quant.Q8_1 {
				half = 1.0 / 2048
			}

			alone := newMatmuls(newPool(1))
			defer alone.pool.close()
			want := make([]float32, tokens*rows)
			for tk := range tokens {
				alone.product(want[tk*rows:(tk+1)*rows], w, x[tk*cols:(tk+1)*cols], 1)
			}
			for tk := 0; tk < tokens; tk += 7 {
				xt := x[tk*cols : (tk+1)*cols]
				if typ == quant.F16 || typ == quant.BF16 {
					// Their products take the activations rounded to their
					// type, as ggml's (TestMatMulHalfWeightsRoundActivations).
					xt = slices.Clone(xt)
					for i, v := range xt {
						xt[i] = roundTo(typ, v)
					}
				}
				steps := actSteps(typ, xt)
				for row := range rows {
					wr := deq[row*cols : (row+1)*cols]
					var ref, mag, qerr float64
					for i, v := range xt {
						p := float64(wr[i]) * float64(v)
						ref += p
						mag += math.Abs(p)
						qerr += math.Abs(float64(wr[i])) * (steps[i]/2 + half*math.Abs(float64(v)))
					}
					qerr += offsetErr(typ, wr, xt)
					got := float64(want[tk*rows+row])
					if d := math.Abs(got - ref); !(d <= qerr+1e-5*mag) {
						t.Fatalf("token %d row %d: %g, reference %g: |Δ| %.3g exceeds %.3g", tk, row, got, ref, d, qerr+1e-5*mag)
					}
				}
			}

			for _, threads := range []int{1, 3} {
				mm := newMatmuls(newPool(threads))
				defer mm.pool.close()
				for _, n := range []int{1, 2, 3, 5, 7, 9, 64, 65} {
					for _, off := range []int{0, tokens - n, r.IntN(tokens - n + 1)} {
						got := make([]float32, n*rows)
						mm.product(got, w, x[off*cols:(off+n)*cols], n)
						for tk := range n {
							if !slices.Equal(got[tk*rows:(tk+1)*rows], want[(off+tk)*rows:(off+tk+1)*rows]) {
								t.Fatalf("%s kernels, %d threads: token %d in a batch of %d differs from the token alone",
									vec.Implementation(), threads, off+tk, n)
							}
						}
					}
				}
			}
		})
	}
}

// TestMatmulConcurrentCallers runs products from several goroutines on one
// pool at once (as concurrent Forward calls do) and checks every result.
func TestMatmulConcurrentCallers(t *testing.T) {
	const rows, cols, tokens = 300, 512, 9
	r := rand.New(rand.NewPCG(3, 4))
	w, _ := testMatrix(t, r, quant.Q8_0, rows, cols)
	x := testActivations(r, tokens, cols)
	mm := newMatmuls(newPool(3))
	defer mm.pool.close()
	want := make([]float32, tokens*rows)
	mm.product(want, w, x, tokens)
	concurrently(t, 8, 20, func(g int) func() error {
		got := make([]float32, tokens*rows)
		return func() error {
			clear(got)
			mm.product(got, w, x, tokens)
			if !slices.Equal(got, want) {
				return fmt.Errorf("goroutine %d: result differs", g)
			}
			return nil
		}
	})
}

// TestMatmulNoAllocations checks that a product's steady state allocates
// nothing of its own (the scratch buffers are recycled).
func TestMatmulNoAllocations(t *testing.T) {
	// Only quantized weights: the assembly float kernels of vec allocate
	// a packed copy of the activations per call.
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop items")
	}
	r := rand.New(rand.NewPCG(5, 6))
	for _, typ := range []quant.Type{quant.Q8_0, quant.Q4_K} {
		w, _ := testMatrix(t, r, typ, 64, 512)
		x := testActivations(r, 3, 512)
		dst := make([]float32, 3*64)
		mm := newMatmuls(newPool(1))
		defer mm.pool.close()
		mm.product(dst, w, x, 3)
		if a := testing.AllocsPerRun(20, func() { mm.product(dst, w, x, 3) }); a > 0 {
			t.Errorf("%s: %.1f allocations per product", typ, a)
		}
	}
}

// TestPoolChunks checks that run visits every item exactly once, in chunks
// aligned to the chunk size, with part numbers below the pool size.
func TestPoolChunks(t *testing.T) {
	for _, n := range []int{1, 2, 5} {
		p := newPool(n)
		for _, tc := range []struct{ total, chunk int }{{1, 1}, {10, 3}, {100, 16}, {1000, 7}, {5, 100}} {
			seen := make([]int32, tc.total)
			var mu sync.Mutex
			p.run(tc.total, tc.chunk, taskFunc(func(part, lo, hi int) {
				mu.Lock()
				defer mu.Unlock()
				if part < 0 || part >= n || lo%tc.chunk != 0 || hi > tc.total || (hi-lo != tc.chunk && hi != tc.total) {
					t.Errorf("pool %d, %+v: part %d chunk [%d, %d)", n, tc, part, lo, hi)
				}
				for i := lo; i < hi; i++ {
					seen[i]++
				}
			}))
			for i, c := range seen {
				if c != 1 {
					t.Fatalf("pool %d, %+v: item %d visited %d times", n, tc, i, c)
				}
			}
		}
		p.close()
	}
}

// TestProductsGroup checks that products of the same activations run as
// one loop (the queries, keys and values; the gate and up projections)
// give exactly what separate products give, for every weight
// type, and with matrices of different heights and types (which fall back
// to separate products).
func TestProductsGroup(t *testing.T) {
	const cols = 512
	for _, typ := range quant.SupportedTypes() {
		t.Run(typ.String(), func(t *testing.T) {
			r := rand.New(rand.NewPCG(31, uint64(typ)))
			w1, _ := testMatrix(t, r, typ, 200, cols)
			w2, _ := testMatrix(t, r, typ, 72, cols)
			other := quant.F32
			if typ == quant.F32 {
				other = quant.Q8_0
			}
			w3, _ := testMatrix(t, r, other, 40, cols)
			for _, threads := range []int{1, 3} {
				mm := newMatmuls(newPool(threads))
				for _, n := range []int{1, 5, 33} {
					x := testActivations(r, n, cols)
					for _, group := range [][]*cpuMatrix{{w1, w2}, {w2, w1, w2}, {w2, w3}, {w1, w2, w3}} {
						var want, got [][]float32
						var ps []prod
						for i, w := range group {
							want = append(want, make([]float32, n*w.rows))
							got = append(got, make([]float32, n*w.rows))
							mm.product(want[i], w, x, n)
							ps = append(ps, prod{got[i], w})
						}
						mm.products(x, n, ps...)
						for i := range group {
							if !slices.Equal(got[i], want[i]) {
								t.Fatalf("%d threads, %d tokens, product %d of %d: the grouped products differ from separate ones", threads, n, i, len(group))
							}
						}
					}
				}
				mm.pool.close()
			}
		})
	}
}
