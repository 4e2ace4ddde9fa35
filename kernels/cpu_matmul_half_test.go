package kernels

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/baton-serving/baton/kernels/quant"
)

// roundTo rounds v to the nearest value of the half-precision type typ (F16
// or BF16, ties to even, as ggml converts activations) and widens it back.
func roundTo(typ quant.Type, v float32) float32 {
	if typ == quant.BF16 {
		return quant.BF16ToF32(quant.F32ToBF16(v))
	}
	return quant.F16ToF32(quant.F32ToF16(v))
}

// halfUlp returns the gap between |v|, a value of type typ, and the next
// value of typ away from zero.
func halfUlp(typ quant.Type, v float32) float32 {
	a := float32(math.Abs(float64(v)))
	if typ == quant.BF16 {
		return quant.BF16ToF32(quant.F32ToBF16(a)+1) - a
	}
	return quant.F16ToF32(quant.F32ToF16(a)+1) - a
}

// TestMatMulHalfWeightsRoundActivations checks that a product with F16 or
// BF16 weights multiplies the activations rounded to the weights' type, as
// ggml does (its vec_dot_type for F16 weights is F16, for BF16 BF16: the
// activations are converted, rounding to nearest even, before the
// product). The result must equal the float64 product of the rounded
// activations with the weights within float32 summation error, for decode
// (one token) and prompt batches, on 1 and 3 threads.
//
// The activations are chosen so that unrounded ones would fail: each lies
// a quarter of a step of the weights' type above a value of that type
// (away from zero), and row 0 of the weights is the sign pattern of the
// activations, so its product with the unrounded activations exceeds the
// rounded one by Σ step/4, far beyond the summation error.
func TestMatMulHalfWeightsRoundActivations(t *testing.T) {
	const rows, cols = 40, 1024
	for _, typ := range []quant.Type{quant.F16, quant.BF16} {
		t.Run(typ.String(), func(t *testing.T) {
			r := rand.New(rand.NewPCG(19, uint64(typ)))
			sign := make([]float32, cols)
			for i := range sign {
				sign[i] = 1
				if i%3 == 0 {
					sign[i] = -1
				}
			}
			src := make([]float32, rows*cols)
			copy(src, sign) // row 0
			for i := cols; i < len(src); i++ {
				src[i] = float32(r.NormFloat64())
			}
			rb, err := quant.RowBytes(typ, cols)
			if err != nil {
				t.Fatal(err)
			}
			data := make([]byte, rows*int(rb))
			if err := quant.Quantize(typ, src, data); err != nil {
				t.Fatal(err)
			}
			wv := make([]float32, rows*cols)
			if err := quant.Dequantize(typ, data, wv); err != nil {
				t.Fatal(err)
			}

			for _, threads := range []int{1, 3} {
				cpu := NewCPU(threads)
				defer cpu.Close()
				w, err := cpu.LoadMatrix(typ, rows, cols, data)
				if err != nil {
					t.Fatal(err)
				}
				for _, n := range []int{1, 2, 5, 70} {
					x := make([]float32, n*cols)
					for k := range x {
						scale := math.Exp(4 * (r.Float64() - 0.5))
						base := roundTo(typ, float32(scale*math.Abs(r.NormFloat64())))
						x[k] = sign[k%cols] * (base + halfUlp(typ, base)/4)
					}
					xb, err := Upload(cpu, x)
					if err != nil {
						t.Fatal(err)
					}
					db, err := cpu.Alloc(n * rows)
					if err != nil {
						t.Fatal(err)
					}
					if err := cpu.MatMul(db, w, xb); err != nil {
						t.Fatal(err)
					}
					got := make([]float32, n*rows)
					if err := cpu.Read(got, db); err != nil {
						t.Fatal(err)
					}
					for tk := range n {
						xt := x[tk*cols : (tk+1)*cols]
						for row := range rows {
							var rounded, plain, mag float64
							for i, v := range xt {
								wi := float64(wv[row*cols+i])
								rounded += wi * float64(roundTo(typ, v))
								plain += wi * float64(v)
								mag += math.Abs(wi * float64(v))
							}
							tol := 1e-5 * mag
							g := float64(got[tk*rows+row])
							if d := math.Abs(g - rounded); !(d <= tol) {
								t.Fatalf("%d threads, %d tokens: token %d row %d = %g, product of the %s-rounded activations %g: |Δ| %.3g exceeds %.3g (the unrounded product is %g)",
									threads, n, tk, row, g, typ, rounded, d, tol, plain)
							}
							if row == 0 && !(math.Abs(plain-rounded) > 10*tol) {
								t.Fatalf("token %d: the test's activations do not separate rounded (%g) from unrounded (%g) products", tk, rounded, plain)
							}
						}
					}
					if err := cpu.Free(xb); err != nil {
						t.Fatal(err)
					}
					if err := cpu.Free(db); err != nil {
						t.Fatal(err)
					}
				}
				if err := cpu.FreeMatrix(w); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}
