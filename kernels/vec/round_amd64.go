//go:build amd64 && !purego

package vec

import "golang.org/x/sys/cpu"

// roundF16F16C rounds n values, n a multiple of 8 (F16C and AVX).
//
//go:noescape
func roundF16F16C(dst, x *float32, n int)

// roundF16AVX512 rounds n values, n a multiple of 16 (AVX-512 F).
//
//go:noescape
func roundF16AVX512(dst, x *float32, n int)

// encodeF16F16C and encodeF16AVX512 store n values as binary16, n a
// multiple of 8 (F16C) or 16 (AVX-512 F).
//
//go:noescape
func encodeF16F16C(dst *byte, x *float32, n int)

//go:noescape
func encodeF16AVX512(dst *byte, x *float32, n int)

// roundBF16AVX2 rounds n values to bfloat16, n a multiple of 8 (AVX2).
//
//go:noescape
func roundBF16AVX2(dst, x *float32, n int)

// roundImpls lists the rounding implementations this CPU runs, the
// preferred one first; the pure-Go one, last, takes the tails.
func roundImpls() []roundImpl {
	x := &cpu.X86
	var out []roundImpl
	if x.HasAVX2 && x.HasF16C && x.HasAVX512F {
		out = append(out, roundImpl{"avx512", asmRound(roundF16AVX512, 16, roundF16Go), asmRound(roundBF16AVX2, 8, roundBF16Go),
			asmEncode(encodeF16AVX512, 16)})
	}
	if x.HasAVX2 && x.HasF16C {
		out = append(out, roundImpl{"avx2", asmRound(roundF16F16C, 8, roundF16Go), asmRound(roundBF16AVX2, 8, roundBF16Go),
			asmEncode(encodeF16F16C, 8)})
	}
	return append(out, roundGeneric)
}

// asmRound wraps an assembly rounding loop over multiples of width values
// with tail, the pure-Go version of the same rounding, for the rest.
func asmRound(f func(dst, x *float32, n int), width int, tail func(dst, x []float32)) func(dst, x []float32) {
	return func(dst, x []float32) {
		dst = dst[:len(x)]
		n := len(x) / width * width
		if n > 0 {
			f(&dst[0], &x[0], n)
		}
		tail(dst[n:], x[n:])
	}
}

// asmEncode wraps an assembly encoding loop over multiples of width values
// with the pure-Go encoding for the rest.
func asmEncode(f func(dst *byte, x *float32, n int), width int) func(dst []byte, x []float32) {
	return func(dst []byte, x []float32) {
		dst = dst[:2*len(x)]
		n := len(x) / width * width
		if n > 0 {
			f(&dst[0], &x[0], n)
		}
		encodeF16Go(dst[2*n:], x[n:])
	}
}
