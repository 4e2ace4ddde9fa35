package vec

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/baton-serving/baton/kernels/quant"
)

// Benchmarks run every available implementation side by side. Throughput
// is reported as weight bytes read per second (MB/s, from SetBytes) and as
// GFLOP/s (2 per multiply-add). Run them briefly:
//
//	go test -bench . -run '^$' -benchtime=200ms ./vec/

// benchType is a weight type under benchmark, with closures over one
// implementation's kernels.
type benchType struct {
	name string
	// setup builds a rows×cols matrix and activations for tokens tokens and
	// returns the weight byte count and the three products.
	setup func(r *rand.Rand, rows, cols, tokens int) (wBytes int, dot func(im *impl) float32,
		matVec func(im *impl, dst []float32), matMul func(im *impl, dst []float32, t int))
}

func benchTypes() []benchType {
	var bts []benchType
	for _, typ := range floatTypes {
		bts = append(bts, benchType{typ.String(), func(r *rand.Rand, rows, cols, tokens int) (int, func(*impl) float32,
			func(*impl, []float32), func(*impl, []float32, int)) {
			m := floatMat{typ: typ}
			if typ == quant.F32 {
				m.f32 = randF32(r, rows*cols, 1)
			} else {
				m.bytes = make([]byte, 2*rows*cols)
				for i := 0; i < len(m.bytes); i += 2 {
					h := quant.F32ToF16(float32(r.NormFloat64()))
					if typ == quant.BF16 {
						h = quant.F32ToBF16(float32(r.NormFloat64()))
					}
					m.bytes[i], m.bytes[i+1] = byte(h), byte(h>>8)
				}
			}
			x := randF32(r, tokens*cols, 1)
			dot := func(im *impl) float32 {
				switch typ {
				case quant.F32:
					return im.dotF32(m.f32[:cols], x[:cols])
				case quant.F16:
					return im.dotF16(m.bytes[:2*cols], x[:cols])
				}
				return im.dotBF16(m.bytes[:2*cols], x[:cols])
			}
			wb := 2 * rows * cols
			if typ == quant.F32 {
				wb *= 2
			}
			return wb, dot,
				func(im *impl, dst []float32) { m.matVec(im, dst, x[:cols], rows, cols) },
				func(im *impl, dst []float32, t int) { m.matMul(im, dst, rows, x[:t*cols], rows, cols, t) }
		}})
	}
	for q := range numQ {
		qi := &qinfo[q]
		bts = append(bts, benchType{qi.name, func(r *rand.Rand, rows, cols, tokens int) (int, func(*impl) float32,
			func(*impl, []float32), func(*impl, []float32, int)) {
			nb := cols / qi.values
			w := randWeights(r, q, rows*nb, true)
			xq := quantizeActs(q, randF32(r, tokens*cols, 1))
			xr := nb * qi.xBytes
			return len(w),
				func(im *impl) float32 { return im.dotQ[q](w[:nb*qi.wBytes], xq[:xr], nb) },
				func(im *impl, dst []float32) { im.matVecQ[q](dst, w, xq[:xr], rows, nb) },
				func(im *impl, dst []float32, t int) { im.matMulQ[q](dst, rows, w, xq[:t*xr], rows, nb, t) }
		}})
	}
	return bts
}

func reportFlops(b *testing.B, macs float64) {
	b.ReportMetric(2*macs*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}

// BenchmarkDot: one 4096-element row.
func BenchmarkDot(b *testing.B) {
	const n = 4096
	for _, bt := range benchTypes() {
		wb, dot, _, _ := bt.setup(rand.New(rand.NewPCG(1, 1)), 1, n, 1)
		for _, im := range impls() {
			b.Run(bt.name+"/"+im.name, func(b *testing.B) {
				b.SetBytes(int64(wb))
				var sink float32
				for b.Loop() {
					sink += dot(im)
				}
				reportFlops(b, n)
				_ = sink
			})
		}
	}
}

// BenchmarkMatVec: 4096×4096, larger than the caches for F32 and F16 —
// the memory-bound decode case.
func BenchmarkMatVec(b *testing.B) { benchMatVec(b, 4096, 4096, 2, nil) }

// BenchmarkMatMul: 64 tokens × 2048×2048, the prompt-processing case, and
// for comparison the same 64 products as one MatVec per token.
func BenchmarkMatMul(b *testing.B) { benchMatMul(b, 2048, 2048, 64, 3, nil, true) }

// benchMatVec runs the rows×cols matrix-vector product of each bench type
// named in names (nil: every one) on every implementation, with weights
// drawn from seed. MB/s are weight bytes streamed per second.
func benchMatVec(b *testing.B, rows, cols int, seed uint64, names []string) {
	for _, bt := range benchTypes() {
		if names != nil && !slices.Contains(names, bt.name) {
			continue
		}
		wb, _, matVec, _ := bt.setup(rand.New(rand.NewPCG(seed, seed)), rows, cols, 1)
		dst := make([]float32, rows)
		for _, im := range impls() {
			b.Run(bt.name+"/"+im.name, func(b *testing.B) {
				b.SetBytes(int64(wb))
				for b.Loop() {
					matVec(im, dst)
				}
				reportFlops(b, float64(rows*cols))
			})
		}
	}
}

// benchMatMul is benchMatVec for the product with tokens activation rows.
// With compare it also runs the pure-Go twin and, for the others, the same
// products as one matrix-vector product per token; without, it leaves the
// pure-Go twin out (minutes per product at the larger shapes).
func benchMatMul(b *testing.B, rows, cols, tokens int, seed uint64, names []string, compare bool) {
	for _, bt := range benchTypes() {
		if names != nil && !slices.Contains(names, bt.name) {
			continue
		}
		wb, _, matVec, matMul := bt.setup(rand.New(rand.NewPCG(seed, seed)), rows, cols, tokens)
		dst := make([]float32, tokens*rows)
		for _, im := range impls() {
			if im.name == "purego" && !compare {
				continue
			}
			b.Run(bt.name+"/"+im.name, func(b *testing.B) {
				b.SetBytes(int64(wb))
				for b.Loop() {
					matMul(im, dst, tokens)
				}
				reportFlops(b, float64(rows*cols*tokens))
			})
			if im.name == "purego" || !compare {
				continue
			}
			b.Run(bt.name+"/"+im.name+"/matvec-per-token", func(b *testing.B) {
				b.SetBytes(int64(wb) * int64(tokens))
				for b.Loop() {
					for range tokens {
						matVec(im, dst[:rows])
					}
				}
				reportFlops(b, float64(rows*cols*tokens))
			})
		}
	}
}

func BenchmarkElementwise(b *testing.B) {
	const n = 4096
	r := rand.New(rand.NewPCG(4, 4))
	x, y := randF32(r, n, 1), randF32(r, n, 1)
	dst := make([]float32, n)
	b.Run("ExpSum", func(b *testing.B) {
		b.SetBytes(4 * n)
		for b.Loop() {
			ExpSum(dst, x, 3)
		}
	})
	b.Run("math.Exp", func(b *testing.B) {
		b.SetBytes(4 * n)
		for b.Loop() {
			for i, v := range x {
				dst[i] = float32(math.Exp(float64(v - 3)))
			}
		}
	})
	b.Run("SumSquares", func(b *testing.B) {
		b.SetBytes(4 * n)
		for b.Loop() {
			SumSquares(x)
		}
	})
	b.Run("Axpy", func(b *testing.B) {
		b.SetBytes(8 * n)
		for b.Loop() {
			Axpy(0.5, x, y)
		}
	})
	// The activation quantizers, run once per product: bytes are the
	// float32 activations read.
	for _, im := range impls() {
		q8, qk := make([]byte, n/Q8_0Values*Q8_0Bytes), make([]byte, n/Q8_KValues*Q8_KBytes)
		b.Run("QuantizeQ8_0/"+im.name, func(b *testing.B) {
			b.SetBytes(4 * n)
			for b.Loop() {
				im.quantQ8_0(x, q8)
			}
		})
		b.Run("QuantizeQ8_K/"+im.name, func(b *testing.B) {
			b.SetBytes(4 * n)
			for b.Loop() {
				im.quantQ8_K(x, qk)
			}
		})
	}
	// Attention's weighted sum of four value rows of a 64-wide head, as
	// the engine calls it, on every implementation: bytes are the rows read
	// plus y read and written.
	const hd = 64
	e := &[4]float32{0.1, 0.2, 0.3, 0.4}
	vf := randF32(r, 4*hd, 1)
	vh := make([]byte, 8*hd)
	for i, v := range vf {
		h := quant.F32ToF16(v)
		vh[2*i], vh[2*i+1] = byte(h), byte(h>>8)
	}
	for _, im := range impls() {
		b.Run("Axpy4/"+im.name, func(b *testing.B) {
			b.SetBytes(4*4*hd + 8*hd)
			for b.Loop() {
				im.axpy4(y[:hd], e, vf[:hd], vf[hd:2*hd], vf[2*hd:3*hd], vf[3*hd:])
			}
		})
		b.Run("Axpy4F16/"+im.name, func(b *testing.B) {
			b.SetBytes(4*2*hd + 8*hd)
			for b.Loop() {
				im.axpy4F16(y[:hd], e, vh[:2*hd], vh[2*hd:4*hd], vh[4*hd:6*hd], vh[6*hd:])
			}
		})
	}
}
