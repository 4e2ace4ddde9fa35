package vec

import (
	"math"

	"github.com/baton-serving/baton/kernels/quant"
)

// ggml multiplies F16 weights with activations converted to F16, and BF16
// weights with activations converted to BF16 (the vec_dot_type of those
// weight types in ggml-cpu's type traits; llamafile's tinyBLAS takes the
// same converted activations), rounding to nearest even. Products of a
// binary16 (or bfloat16) activation with a weight of the same type are
// exact in float32, so the float kernels of this package, given the
// activations rounded by RoundF16 or RoundBF16, compute what ggml computes
// up to the order of the float32 additions.

// roundImpl is one implementation of the rounding functions.
type roundImpl struct {
	name string
	f16  func(dst, x []float32)
	bf16 func(dst, x []float32)
	enc  func(dst []byte, x []float32) // EncodeF16
}

var roundGeneric = roundImpl{"purego", roundF16Go, roundBF16Go, encodeF16Go}

// activeRound is the implementation chosen at package initialisation; it is
// never changed afterwards.
var activeRound = roundImpls()[0]

// RoundF16 sets dst[i] to x[i] rounded to the nearest IEEE binary16 value
// (ties to even; beyond the largest finite value, ±Inf; a NaN stays a NaN)
// and widened back to float32, exactly: the activations ggml multiplies
// F16 weights with. dst may be x. If the lengths differ it fills dst with
// NaN.
func RoundF16(dst, x []float32) {
	if len(dst) != len(x) {
		fillNaN(dst)
		return
	}
	activeRound.f16(dst, x)
}

// RoundBF16 is [RoundF16] for bfloat16: the activations ggml multiplies
// BF16 weights with (ggml_compute_fp32_to_bf16's rounding: to nearest
// even, finite values may round to ±Inf, a NaN stays a quiet NaN).
func RoundBF16(dst, x []float32) {
	if len(dst) != len(x) {
		fillNaN(dst)
		return
	}
	activeRound.bf16(dst, x)
}

// EncodeF16 stores x in dst as little-endian IEEE binary16 values, rounded
// to nearest even as quant.F32ToF16 rounds (F16C's vcvtps2ph): what a KV
// cache of F16 elements holds. A NaN stays a NaN, its payload not kept
// alike on every implementation. dst must hold 2·len(x) bytes.
func EncodeF16(dst []byte, x []float32) {
	activeRound.enc(dst[:2*len(x)], x)
}

func encodeF16Go(dst []byte, x []float32) {
	dst = dst[:2*len(x)]
	for i, v := range x {
		h := quant.F32ToF16(v)
		dst[2*i], dst[2*i+1] = byte(h), byte(h>>8)
	}
}

// Bounds of the float32 bit patterns (sign cleared) that round to a normal
// binary16 value by rounding the float32 mantissa to 10 bits: from 2⁻¹⁴,
// the least normal binary16, to just below 65520, the least value that
// rounds to infinity.
const (
	f16NormalLo = 0x38800000
	f16NormalHi = 0x477ff000
)

func roundF16Go(dst, x []float32) {
	dst = dst[:len(x)]
	for i, v := range x {
		b := math.Float32bits(v)
		sign, a := b&0x80000000, b&0x7fffffff
		// Normal range: round the mantissa's low 13 bits away, ties to
		// even; a carry into the exponent gives the next binade's first
		// value, as it should.
		r := (b + 0xfff + (b>>13)&1) &^ 0x1fff
		// Zeros and binary16 subnormals, multiples of 2⁻²⁴: adding 0.5
		// (2⁻²⁴·2²³) rounds a float32 below 2⁻¹⁴ to one, to nearest even,
		// exactly as the conversion does.
		sub := sign | math.Float32bits(math.Float32frombits(a)+0.5-0.5)
		// Both candidates are computed, and these simple selections
		// compile to conditional moves: the loop has no branch that mixed
		// magnitudes could mispredict.
		if a < f16NormalLo {
			r = sub
		}
		if a >= f16NormalHi {
			r = sign | 0x7f800000 // overflow to ±Inf
		}
		if a > 0x7f800000 {
			r = sign | 0x7fc00000 // NaN: binary16's quiet NaN, widened
		}
		dst[i] = math.Float32frombits(r)
	}
}

func roundBF16Go(dst, x []float32) {
	dst = dst[:len(x)]
	for i, v := range x {
		b := math.Float32bits(v)
		r := (b + 0x7fff + (b>>16)&1) &^ 0xffff
		if b&0x7fffffff > 0x7f800000 {
			r = (b | 0x400000) &^ 0xffff // a quiet NaN
		}
		dst[i] = math.Float32frombits(r)
	}
}
