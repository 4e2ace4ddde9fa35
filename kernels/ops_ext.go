package kernels

import (
	"math"
	"sync"

	"github.com/baton-serving/baton/kernels/quant"
)

// Reference operations of the architectures beyond Llama's (the Gemma
// family): GELU and soft-capping, computed as llama.cpp's CPU backend
// (ggml, commit c392e50) computes them, so that greedy output can match it
// token for token.

// GELU returns ggml_gelu(x) as the CPU backend of ggml c392e50 computes it
// on an F32 tensor. That build defines GGML_GELU_FP16 unconditionally, so
// it does not evaluate the formula 0.5·x·(1+tanh(√(2/π)·x·(1+0.044715·x²)))
// per element: x ≤ -10 gives 0, x ≥ 10 gives x, and any other x is
// rounded to binary16 and looked up in a table of the formula's float32
// value at every binary16 input, itself rounded to binary16. The result
// carries about 11 bits, not float32's 24; computing the formula exactly
// would move each GELU by up to ~1e-3 relative and greedy output off
// llama.cpp's. TestGELUMatchesGGML checks every table entry against
// ggml's own output.
//
// (ik_llama.cpp's newer ggml computes GELU in float32 with SIMD instead on
// AVX2 and AVX-512 machines; models compared with it differ by that
// rounding.)
func GELU(x float32) float32 {
	switch {
	case x <= -10:
		return 0
	case x >= 10:
		return x
	}
	return geluTable()[quant.F32ToF16(x)]
}

// geluTable is ggml's table widened to float32, 256 KiB, built on first
// use (about a millisecond) and never written again.
var geluTable = sync.OnceValue(func() *[1 << 16]float32 {
	t := new([1 << 16]float32)
	for i := range t {
		t[i] = quant.F16ToF32(quant.F32ToF16(geluF32(quant.F16ToF32(uint16(i)))))
	}
	return t
})

// geluF32 is the tanh formula in float32 operations in ggml's order, with
// the one fused multiply-add gcc makes of it at -O3 -march=native on a
// machine with FMA (1 + 0.044715·x·x; the default, native build of
// llama.cpp): of the 63,490 non-NaN binary16 inputs, one (x ≈ -3.98) lands
// on the other side of a binary16 rounding without it. The tanh is
// float64's, rounded, where ggml calls tanhf.
func geluF32(x float32) float32 {
	const a, s = 0.044715, 0.79788456080286535587989211986876
	inner := float32(math.FMA(float64(float32(a*x)), float64(x), 1))
	arg := float32(float32(s*x) * inner)
	th := float32(math.Tanh(float64(arg)))
	return float32(0.5*x) * float32(1+th)
}

// GELUMul writes GELU(gate[i])·up[i] to dst: the GeGLU activation of a
// gated feed-forward block (ggml_gelu then ggml_mul). dst may alias gate
// or up.
func GELUMul(dst, gate, up []float32) {
	gate = gate[:len(dst)]
	up = up[:len(dst)]
	t := geluTable()
	for i, g := range gate {
		switch {
		case g <= -10:
			g = 0
		case g < 10:
			g = t[quant.F32ToF16(g)]
		}
		dst[i] = g * up[i]
	}
}

// SoftCap replaces x[i] by c·tanh(x[i]/c), as ggml's scale, tanh and
// scale do: x[i]·(1/c) rounded, its tanh rounded, times c. c must be > 0.
func SoftCap(x []float32, c float32) {
	inv := 1 / c
	for i, v := range x {
		x[i] = c * float32(math.Tanh(float64(v*inv)))
	}
}
