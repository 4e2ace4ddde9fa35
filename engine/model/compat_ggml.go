package model

import (
	"encoding/binary"
	"math"

	"github.com/baton-serving/baton/kernels/quant"
)

// The float32 arithmetic of llama.cpp's CPU backend (ggml, x86-64 with
// AVX-512), one rounding at a time, for NumericsLlamaCpp. Where ggml works
// on 16-lane vectors, the lanes are arrays here, and every sum is formed in
// the order the vector code forms it: floating-point addition is not
// associative, and a different order moves the last bits of every result,
// which llama.cpp's F16 KV cache then amplifies.
//
// Go may fuse x*y+z into one fused multiply-add on some architectures
// unless a conversion forces the product to be rounded first; products that
// ggml rounds are therefore written float32(x*y) below, and fusions that
// ggml performs are explicit fma32 calls.

// fma32 returns a·b+c rounded once to float32, as a fused multiply-add
// instruction computes it.
func fma32(a, b, c float32) float32 {
	// a·b is exact in float64 (two 24-bit significands need 48 bits), so s
	// is a·b+c rounded once to float64, and e, from Knuth's TwoSum, is what
	// that rounding lost (NaN when s is ±Inf or NaN). Kept this small, the
	// common exact case inlines.
	p := float64(float64(a) * float64(b))
	cc := float64(c)
	s := p + cc
	t := s - p
	if e := (p - (s - t)) + (cc - t); e != 0 {
		return roundInexact32(s, e)
	}
	return float32(s)
}

// roundInexact32 rounds s+e to float32, where s is the float64 rounding of
// s+e and e ≠ 0 (or NaN when s is not finite).
func roundInexact32(s, e float64) float32 {
	f := float32(s)
	if e != e {
		return f
	}
	if f > math.MaxFloat32 || f < -math.MaxFloat32 {
		// s is at or past the float32 overflow threshold, halfway between
		// ±MaxFloat32 and ±2¹²⁸; only the exact value falling short of
		// the threshold itself rounds to ±MaxFloat32.
		if s == overflow32 && e < 0 || s == -overflow32 && e > 0 {
			return float32(math.Copysign(math.MaxFloat32, s))
		}
		return f
	}
	// Rounding s to float32 errs only when s lies exactly halfway between
	// two float32s, f and g = s + (s − f): then the rounding must go the
	// way s+e lies from s. Otherwise g is no float32 (it lies closer to f
	// than the next float32 does) and f is right.
	r := s - float64(f)
	g := s + r
	if r == 0 || float64(float32(g)) != g {
		return f
	}
	if (e > 0) == (r > 0) {
		return float32(g)
	}
	return f
}

// overflow32 is the smallest value that rounds to +Inf in float32:
// halfway between MaxFloat32 and 2¹²⁸.
const overflow32 = 0x1p128 - 0x1p103

// roundF16 rounds x to the nearest IEEE binary16 value (ties to even), as
// storing it in an F16 tensor does.
func roundF16(x float32) float32 { return quant.F16ToF32(quant.F32ToF16(x)) }

func roundF16s(x []float32) {
	for i, v := range x {
		x[i] = roundF16(v)
	}
}

// ggmlLanes is the width of ggml's AVX-512 vectors in float32s.
const ggmlLanes = 16

// hsum16 adds the lanes of v as the horizontal add of an AVX-512 register
// does: the upper 8 lanes onto the lower 8, the upper 4 of those onto the
// lower 4, then (v0+v2) + (v1+v3).
func hsum16(v *[ggmlLanes]float32) float32 {
	var h [8]float32
	for i := range h {
		h[i] = v[i] + v[i+8]
	}
	var q [4]float32
	for i := range q {
		q[i] = h[i] + h[i+4]
	}
	return (q[0] + q[2]) + (q[1] + q[3])
}

// dotSIMD is the vector part of ggml_vec_dot_f32 and ggml_vec_dot_f16: the
// first len(x)&^63 elements go through four accumulators of 16 lanes, each
// product fused into its lane, and the accumulators are added pairwise (0+2
// and 1+3, then the two results) before the horizontal add. It returns that
// sum and the number of elements it covered.
func dotSIMD(x, y []float32) (float32, int) {
	const step = 4 * ggmlLanes
	np := len(x) &^ (step - 1)
	var acc [4][ggmlLanes]float32
	for i := 0; i < np; i += step {
		for j := range acc {
			// Whole-vector copies: one bounds check (and, under the race
			// detector, one instrumented access) per 16 elements.
			xs := [ggmlLanes]float32(x[i+j*ggmlLanes:])
			ys := [ggmlLanes]float32(y[i+j*ggmlLanes:])
			for l := range ggmlLanes {
				acc[j][l] = fma32(xs[l], ys[l], acc[j][l])
			}
		}
	}
	for l := range ggmlLanes {
		acc[0][l] += acc[2][l]
		acc[1][l] += acc[3][l]
	}
	for l := range ggmlLanes {
		acc[0][l] += acc[1][l]
	}
	return hsum16(&acc[0]), np
}

// dotVecF32 is ggml_vec_dot_f32, the product of an F32 weight row with one
// token: the vector part, then the leftover elements added one by one in
// float32, each product rounded before it is added.
func dotVecF32(x, y []float32) float32 {
	s, np := dotSIMD(x, y)
	for i := np; i < len(x); i++ {
		s += float32(x[i] * y[i])
	}
	return s
}

// dotVecF16 is ggml_vec_dot_f16 on values already rounded to F16: the
// vector part, then the leftovers summed in float64, each product rounded
// to float32 first. Attention uses it one token at a time.
func dotVecF16(x, y []float32) float32 {
	s, np := dotSIMD(x, y)
	sum := float64(s)
	for i := np; i < len(x); i++ {
		sum += float64(float32(x[i] * y[i]))
	}
	return float32(sum)
}

// dotTiny is one output element of llamafile's tinyBLAS kernel, which ggml
// uses for matrix products of two or more tokens: a single 16-lane
// accumulator over the whole row, each product fused into its lane, then the
// horizontal add. len(x) must be a multiple of 16.
func dotTiny(x, y []float32) float32 {
	var acc [ggmlLanes]float32
	for i := 0; i < len(x); i += ggmlLanes {
		xs, ys := [ggmlLanes]float32(x[i:]), [ggmlLanes]float32(y[i:])
		for l := range ggmlLanes {
			acc[l] = fma32(xs[l], ys[l], acc[l])
		}
	}
	return hsum16(&acc)
}

// useTiny reports whether ggml hands a product of an m-row matrix with n
// token columns over an inner length k to tinyBLAS (AVX-512 build): only
// for n ≥ 2, k a multiple of 16 and m a multiple of 4.
func useTiny(m, n, k int) bool { return n >= 2 && k%ggmlLanes == 0 && m%4 == 0 }

// rmsNormGGML is ggml_rms_norm followed by the multiplication with the norm
// weight: the mean square is summed in float64 from float32 squares and
// rounded to float32, the scale is 1/sqrtf(mean+eps), and each output is
// (x·scale)·w with both products rounded.
func rmsNormGGML(dst, x, w []float32, eps float32) {
	var sum float64
	for _, v := range x {
		sum += float64(float32(v * v))
	}
	mean := float32(sum / float64(len(x)))
	scale := 1 / libmSqrtf(mean+eps)
	for i, v := range x {
		dst[i] = float32(v*scale) * w[i]
	}
}

// ropeCacheGGML fills the rotation table of position pos the way ggml's
// rope does: the angle of pair i is θᵢ = freqScale·(pos·thetaScaleⁱ/freqsᵢ),
// where the power is formed by repeated float32 multiplication, and
// cos/sin are taken of the float32 angle. freqs may be nil (all ones).
func ropeCacheGGML(cos, sin []float32, pos int, thetaScale, freqScale float32, freqs []float32) {
	theta := float32(pos)
	for i := range cos {
		t := theta
		if freqs != nil {
			t /= freqs[i]
		}
		t *= freqScale
		cos[i], sin[i] = libmCosf(t), libmSinf(t)
		theta *= thetaScale
	}
}

// ropeGGML rotates the adjacent pairs (x[2i], x[2i+1]) of one head, i <
// len(cos), leaving any further elements as they are. As GCC compiles
// ggml's x0·cos − x1·sin and x0·sin + x1·cos, the left product is fused
// into the addition and the right one rounded.
func ropeGGML(x, cos, sin []float32) {
	for i := range cos {
		x0, x1 := x[2*i], x[2*i+1]
		x[2*i] = fma32(x0, cos[i], -float32(x1*sin[i]))
		x[2*i+1] = fma32(x0, sin[i], float32(x1*cos[i]))
	}
}

// softmaxGGML is ggml's masked softmax over a row of len(p) positions (a
// multiple of 16, as llama.cpp pads the KV cache view), of which the first
// live hold scores and the rest are masked out (set to 0 here). The
// exponentials are expGGML, 16 at a time; each group's horizontal sum is
// added in float64; the row is then multiplied by the float32 reciprocal of
// the total.
func softmaxGGML(p []float32, live int) {
	mx := float32(math.Inf(-1))
	for _, v := range p[:live] {
		mx = max(mx, v)
	}
	var sum float64
	var group [ggmlLanes]float32
	for i := 0; i < len(p); i += ggmlLanes {
		for l := range ggmlLanes {
			v := float32(0)
			if i+l < live {
				v = expGGML(p[i+l] - mx)
			}
			p[i+l], group[l] = v, v
		}
		sum += float64(hsum16(&group))
	}
	inv := float32(1 / sum)
	for i := range p {
		p[i] *= inv
	}
}

// siluGGML replaces each x by x/(1+e^−x) as ggml_vec_silu_f32 does: with
// expGGML for the leading multiple of 16 elements and libm's expf for the
// rest.
func siluGGML(x []float32) {
	vec := len(x) &^ (ggmlLanes - 1)
	for i, v := range x {
		var e float32
		if i < vec {
			e = expGGML(-v)
		} else {
			e = libmExpf(-v)
		}
		x[i] = v / (1 + e)
	}
}

// readF32LE reads little-endian float32s (a row of an F32 tensor).
func readF32LE(dst []float32, b []byte) {
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
}

// libmExpf, libmCosf, libmSinf, libmPowf and libmSqrtf stand in for the C
// library's single-precision expf, cosf, sinf, powf and sqrtf, which ggml's
// scalar code calls. Each evaluates Go's float64 function, accurate to
// within one float64 ulp, and rounds the result to float32: that is the
// correctly rounded float32 result except where the exact value lies
// within about 2⁻²⁹ float32 ulps of a rounding boundary, too rare to arise
// in practice for the angles and the one power used here (on the golden
// generations, glibc's cosf and sinf agree at every angle). glibc's expf is
// not always correctly rounded (its source states a 0.502 ulp bound), so
// libmExpf can differ from it in the last bit; in llama.cpp that touches
// only the last Hidden mod 16 elements of SiLU, and moves the golden
// probabilities by less than 3e-7.
func libmExpf(x float32) float32 { return float32(math.Exp(float64(x))) }

func libmCosf(x float32) float32 { return float32(math.Cos(float64(x))) }

func libmSinf(x float32) float32 { return float32(math.Sin(float64(x))) }

func libmPowf(x, y float32) float32 { return float32(math.Pow(float64(x), float64(y))) }

// libmSqrtf is always correctly rounded: for square roots, rounding first
// to float64 and then to float32 never errs.
func libmSqrtf(x float32) float32 { return float32(math.Sqrt(float64(x))) }
