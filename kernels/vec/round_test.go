package vec

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/baton-serving/baton/kernels/quant"
)

// roundInputs returns float32 values that cover every rounding case of
// binary16 and bfloat16: every sign, exponent and top mantissa bits (all
// 65536 upper halves) with lower halves at and around the halfway points
// of both types, plus random patterns.
func roundInputs() []float32 {
	lows := []uint32{0, 1, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x2000, 0x2fff, 0x3000, 0x3001,
		0x7fff, 0x8000, 0x8001, 0xe000, 0xf000, 0xffff}
	r := rand.New(rand.NewPCG(16, 19))
	var out []float32
	for hi := range uint32(1 << 16) {
		for _, lo := range lows {
			out = append(out, math.Float32frombits(hi<<16|lo))
		}
		out = append(out, math.Float32frombits(hi<<16|r.Uint32()&0xffff))
	}
	return out
}

// sameRounding reports whether got is want, bit for bit, or both are NaN
// (NaN payloads are not part of the contract).
func sameRounding(got, want float32) bool {
	if want != want {
		return got != got
	}
	return math.Float32bits(got) == math.Float32bits(want)
}

// TestRoundHalf checks RoundF16 and RoundBF16, in every implementation
// this CPU runs, against the scalar conversions of package quant (which
// follow ggml's GGML_FP32_TO_FP16, i.e. F16C's round to nearest even, and
// ggml_compute_fp32_to_bf16), widened back: bit for bit, on every
// exponent, both halfway cases, subnormals, overflow to infinity, zeros,
// infinities and NaNs, at lengths that leave every vector tail, and in
// place.
func TestRoundHalf(t *testing.T) {
	in := roundInputs()
	for _, tc := range []struct {
		name  string
		ref   func(float32) float32
		impls func() []roundImpl
		pick  func(roundImpl) func(dst, x []float32)
	}{
		{"F16", func(v float32) float32 { return quant.F16ToF32(quant.F32ToF16(v)) }, roundImpls,
			func(im roundImpl) func(dst, x []float32) { return im.f16 }},
		{"BF16", func(v float32) float32 { return quant.BF16ToF32(quant.F32ToBF16(v)) }, roundImpls,
			func(im roundImpl) func(dst, x []float32) { return im.bf16 }},
	} {
		for _, im := range tc.impls() {
			t.Run(tc.name+"/"+im.name, func(t *testing.T) {
				f := tc.pick(im)
				dst, check := guarded(len(in), outSentinel)
				f(dst, in)
				check(t, "dst")
				for i, v := range in {
					if want := tc.ref(v); !sameRounding(dst[i], want) {
						t.Fatalf("%#08x (%g): got %#08x (%g), want %#08x (%g)", math.Float32bits(v), v,
							math.Float32bits(dst[i]), dst[i], math.Float32bits(want), want)
					}
				}
				// Every length up to a few vectors, so that each tail runs;
				// and in place.
				for n := range 70 {
					x := append([]float32(nil), in[1000*n:1000*n+n]...)
					d, check := guarded(n, outSentinel)
					f(d, x)
					check(t, "dst")
					f(x, x)
					for i := range n {
						want := tc.ref(in[1000*n+i])
						if !sameRounding(d[i], want) || !sameRounding(x[i], want) {
							t.Fatalf("length %d, element %d: got %g (in place %g), want %g", n, i, d[i], x[i], want)
						}
					}
				}
			})
		}
	}
}

// TestRoundHalfShapes checks the exported functions' handling of
// mismatched lengths: dst filled with NaN, nothing written outside it.
func TestRoundHalfShapes(t *testing.T) {
	for _, f := range []func(dst, x []float32){RoundF16, RoundBF16} {
		dst, check := guarded(5, outSentinel)
		f(dst, []float32{1, 2, 3})
		check(t, "dst")
		for i, v := range dst {
			if v == v {
				t.Fatalf("element %d = %g after a length mismatch, want NaN", i, v)
			}
		}
		f(nil, nil) // no panic
	}
}

func BenchmarkRoundHalf(b *testing.B) {
	x := make([]float32, 2048)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	dst := make([]float32, len(x))
	for _, im := range roundImpls() {
		for _, f := range []struct {
			name string
			fn   func(dst, x []float32)
		}{{"F16", im.f16}, {"BF16", im.bf16}} {
			b.Run(f.name+"/"+im.name, func(b *testing.B) {
				b.SetBytes(4 * int64(len(x)))
				for b.Loop() {
					f.fn(dst, x)
				}
			})
		}
	}
}

// TestEncodeF16 checks EncodeF16, in every implementation this CPU runs,
// against quant.F32ToF16 bit for bit on the inputs of TestRoundHalf (a NaN
// need only stay a NaN), at every length up to a few vectors, with
// guarded buffers.
func TestEncodeF16(t *testing.T) {
	in := roundInputs()
	for _, im := range roundImpls() {
		t.Run(im.name, func(t *testing.T) {
			check := func(t *testing.T, x []float32) {
				dst, guard := guarded(2*len(x), byteSentinel)
				im.enc(dst, x)
				guard(t, "dst")
				for i, v := range x {
					got, want := uint16(dst[2*i])|uint16(dst[2*i+1])<<8, quant.F32ToF16(v)
					if v != v {
						if got&0x7c00 != 0x7c00 || got&0x3ff == 0 {
							t.Fatalf("NaN %#08x: got %#04x, not a NaN", math.Float32bits(v), got)
						}
						continue
					}
					if got != want {
						t.Fatalf("%#08x (%g): got %#04x, want %#04x", math.Float32bits(v), v, got, want)
					}
				}
			}
			check(t, in)
			for n := range 70 {
				check(t, in[1000*n:1000*n+n])
			}
		})
	}
}
