package model

import "math"

// Constants of ggml's vectorised exponential (ggml_v_expf), which llama.cpp
// uses in its softmax and SiLU. The method is textbook; the constants are
// what make the results bit-identical:
//
//   - n = round(x·log2 e), computed by adding 1.5·2²³ in a fused multiply-add
//     (which rounds to an integer, ties to even, for |x·log2 e| < 2²²) and
//     subtracting it again;
//   - b = x − n·ln 2, with ln 2 split into a 17-bit head and a tail
//     (Cody–Waite), each product fused with its subtraction, so b is nearly
//     exact in [−ln2/2, ln2/2];
//   - 2^(b/ln2) = e^b ≈ 1 + c1·b + c2·b² + c3·b³ + c4·b⁴ + c5·b⁵, a minimax
//     fit evaluated in Estrin's scheme with u = b²:
//     (1 + c1·b) + u·((c2 + c3·b) + u·(c4 + c5·b));
//   - the result is that value times 2ⁿ, rounded once (AVX-512's scalef), and
//     0 or +Inf outright when |n| > 192.
const (
	expShift = 0x1.8p23     // 1.5·2²³: adding it rounds to an integer
	expLog2e = 0x1.715476p0 // log2 e, rounded to float32
	expLn2Hi = 0x1.62e4p-1  // ln 2, first 17 bits
	expLn2Lo = 0x1.7f7d1cp-20
	expC1    = 0x1.ffffecp-1
	expC2    = 0x1.fffdb6p-2
	expC3    = 0x1.555e66p-3
	expC4    = 0x1.573e2ep-5
	expC5    = 0x1.0e4020p-7
	expLimit = 192 // beyond 2^±192 the result is 0 or +Inf
)

// expGGML returns e^x as one lane of ggml's AVX-512 exponential computes it,
// bit for bit what llama.cpp's softmax and SiLU produce: within a relative
// 2.5·2⁻²³ (about two float32 ulps) of e^x where that is a normal float32,
// rounded once into the subnormals below, +Inf above float32's range, NaN
// for NaN.
func expGGML(x float32) float32 {
	n := fma32(x, expLog2e, expShift) - expShift
	if n > expLimit || n < -expLimit {
		if n > 0 {
			return float32(math.Inf(1))
		}
		return 0
	}
	if n != n { // NaN
		return n
	}
	b := fma32(-n, expLn2Lo, fma32(-n, expLn2Hi, x))
	u := b * b
	hi := fma32(fma32(expC5, b, expC4), u, fma32(expC3, b, expC2))
	j := fma32(hi, u, fma32(expC1, b, 1))
	// j·2ⁿ is exact in float64 (|n| ≤ 192), so converting it to float32 is
	// the single rounding scalef performs, subnormal results included.
	return float32(math.Ldexp(float64(j), int(n)))
}
