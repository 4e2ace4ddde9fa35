package vec

import (
	"encoding/binary"
	"fmt"

	"github.com/baton-serving/baton/kernels/quant"
)

// The kernels of the 32-value block types beside Q8_0 and Q4_0: Q4_1 and
// Q5_1 weights, whose blocks carry an offset m, pair (as in ggml) with
// Q8_1 activations, which carry s = d·Σq so that the offset's share of a
// block's dot product, m·s, costs one multiplication; Q5_0 and IQ4_NL
// weights pair with Q8_0 activations.

const (
	// Q8_1Values is the number of values in a Q8_1 block.
	Q8_1Values = 32
	// Q8_1Bytes is the size of a Q8_1 block: binary16 scale d, binary16
	// s = d·Σq, 32 int8.
	Q8_1Bytes = 36
)

// DotQ4_1 returns the dot product of a Q4_1 row of n values with
// activations quantized by [QuantizeQ8_1], or NaN if n is not a multiple
// of 32 or a slice has the wrong length for n.
func DotQ4_1(w, xq []byte, n int) float32 { return dotQ(q4_1, w, xq, n) }

// DotQ5_0 is [DotQ4_1] for Q5_0 weights, with activations quantized by
// [QuantizeQ8_0].
func DotQ5_0(w, xq []byte, n int) float32 { return dotQ(q5_0, w, xq, n) }

// DotQ5_1 is [DotQ4_1] for Q5_1 weights (activations from [QuantizeQ8_1]).
func DotQ5_1(w, xq []byte, n int) float32 { return dotQ(q5_1, w, xq, n) }

// DotIQ4_NL is [DotQ4_1] for IQ4_NL weights, with activations quantized by
// [QuantizeQ8_0].
func DotIQ4_NL(w, xq []byte, n int) float32 { return dotQ(iq4_nl, w, xq, n) }

// MatVecQ4_1 is [MatVecQ8_0] for Q4_1 weights; the activations come from
// [QuantizeQ8_1].
func MatVecQ4_1(dst []float32, w, xq []byte, rows, cols int) { matVecQ(q4_1, dst, w, xq, rows, cols) }

// MatVecQ5_0 is [MatVecQ8_0] for Q5_0 weights (activations from
// [QuantizeQ8_0]).
func MatVecQ5_0(dst []float32, w, xq []byte, rows, cols int) { matVecQ(q5_0, dst, w, xq, rows, cols) }

// MatVecQ5_1 is [MatVecQ8_0] for Q5_1 weights; the activations come from
// [QuantizeQ8_1].
func MatVecQ5_1(dst []float32, w, xq []byte, rows, cols int) { matVecQ(q5_1, dst, w, xq, rows, cols) }

// MatVecIQ4_NL is [MatVecQ8_0] for IQ4_NL weights (activations from
// [QuantizeQ8_0]).
func MatVecIQ4_NL(dst []float32, w, xq []byte, rows, cols int) {
	matVecQ(iq4_nl, dst, w, xq, rows, cols)
}

// MatMulQ4_1 is [MatMulQ8_0] for Q4_1 weights: xq holds tokens rows of
// activations, each quantized by [QuantizeQ8_1] (cols/32·36 bytes per
// token).
func MatMulQ4_1(dst []float32, ldd int, w, xq []byte, rows, cols, tokens int) {
	matMulQ(q4_1, dst, ldd, w, xq, rows, cols, tokens)
}

// MatMulQ5_0 is [MatMulQ8_0] for Q5_0 weights (activations from
// [QuantizeQ8_0]).
func MatMulQ5_0(dst []float32, ldd int, w, xq []byte, rows, cols, tokens int) {
	matMulQ(q5_0, dst, ldd, w, xq, rows, cols, tokens)
}

// MatMulQ5_1 is [MatMulQ4_1] for Q5_1 weights (activations from
// [QuantizeQ8_1]).
func MatMulQ5_1(dst []float32, ldd int, w, xq []byte, rows, cols, tokens int) {
	matMulQ(q5_1, dst, ldd, w, xq, rows, cols, tokens)
}

// MatMulIQ4_NL is [MatMulQ8_0] for IQ4_NL weights (activations from
// [QuantizeQ8_0]).
func MatMulIQ4_NL(dst []float32, ldd int, w, xq []byte, rows, cols, tokens int) {
	matMulQ(iq4_nl, dst, ldd, w, xq, rows, cols, tokens)
}

// QuantizeQ8_1 quantizes x, whose length must be a multiple of 32, into
// len(x)/32 Q8_1 blocks in dst (36 bytes each), the activation format of
// the Q4_1 and Q5_1 kernels: the values and d exactly as [QuantizeQ8_0]
// (ggml's x86 quantize_row_q8_1), and s = d·Σq rounded to binary16.
// A block holding a NaN or an infinity gets NaN d and s and zero values.
func QuantizeQ8_1(x []float32, dst []byte) error {
	if len(x)%Q8_1Values != 0 || len(dst) != len(x)/Q8_1Values*Q8_1Bytes {
		return fmt.Errorf("%w: %d values need %d bytes of Q8_1 blocks (a multiple of %d values), dst has %d",
			ErrShape, len(x), len(x)/Q8_1Values*Q8_1Bytes, Q8_1Values, len(dst))
	}
	active.quantQ8_1(x, dst)
	return nil
}

// ActivationType returns the block type that activations must be quantized
// to for a product with weights of type t ([quant.Q8_0], [quant.Q8_1] or
// [quant.Q8_K]), and false for weight types without a quantized kernel.
func ActivationType(t quant.Type) (quant.Type, bool) {
	switch t {
	case quant.Q8_0, quant.Q4_0, quant.Q5_0, quant.IQ4_NL:
		return quant.Q8_0, true
	case quant.Q4_1, quant.Q5_1:
		return quant.Q8_1, true
	case quant.Q2_K, quant.Q3_K, quant.Q4_K, quant.Q5_K, quant.Q6_K, quant.IQ4_XS:
		return quant.Q8_K, true
	}
	return 0, false
}

func quantQ8_1Go(x []float32, dst []byte) {
	for b := range len(x) / Q8_1Values {
		xb := (*[32]float32)(x[32*b:])
		yb := (*[36]byte)(dst[36*b:])
		amax, ok := q8Amax(xb)
		if !ok {
			binary.LittleEndian.PutUint16(yb[0:], f16NaN)
			binary.LittleEndian.PutUint16(yb[2:], f16NaN)
			clear(yb[4:])
			continue
		}
		d, id := x86Scale(amax)
		var sum int32
		for j, v := range xb {
			q := x86Round(float32(v * id))
			yb[4+j] = sat8(q)
			sum += q // wraps like vpaddd
		}
		binary.LittleEndian.PutUint16(yb[0:], quant.F32ToF16(d))
		binary.LittleEndian.PutUint16(yb[2:], quant.F32ToF16(float32(sum)*d))
	}
}

// legacyLevels decodes the 32 integer levels of one weight block of type q
// (Q5_0 offset by −16, IQ4_NL mapped to its grid), in value order, and
// returns the byte offset of its offset m (−1 if none; d is at 0).
func legacyLevels(q qtype, wb []byte, lv *[32]int32) (mOff int) {
	var qs []byte
	var qh uint32
	mOff = -1
	switch q {
	case q4_1:
		mOff, qs = 2, wb[4:20]
	case q5_0:
		qh, qs = binary.LittleEndian.Uint32(wb[2:]), wb[6:22]
	case q5_1:
		mOff, qh, qs = 2, binary.LittleEndian.Uint32(wb[4:]), wb[8:24]
	case iq4_nl:
		qs = wb[2:18]
	}
	for j := range 16 {
		lv[j] = int32(qs[j]&15 | byte(qh>>j&1)<<4)
		lv[j+16] = int32(qs[j]>>4 | byte(qh>>(j+16)&1)<<4)
	}
	switch q {
	case q5_0:
		for j := range lv {
			lv[j] -= 16
		}
	case iq4_nl:
		for j := range lv {
			lv[j] = int32(iq4nlValues[lv[j]])
		}
	}
	return mOff
}

var iq4nlValues = quant.IQ4NLValues()

// legacyQ reports whether q is one of this file's weight types.
func legacyQ(q qtype) bool { return q == q4_1 || q == q5_0 || q == q5_1 || q == iq4_nl }

// dotLegacyGo is the pure-Go block dot product of the four types, in the
// arithmetic of ggml's scalar vec_dot functions: per block the exact
// integer sum times the float32 product of the scales, plus for the types
// with an offset m·s, added to a float32 total block by block.
func dotLegacyGo(q qtype) func(w, xq []byte, nb int) float32 {
	wbytes, xbytes := qinfo[q].wBytes, qinfo[q].xBytes
	return func(w, xq []byte, nb int) float32 {
		var sum float32
		for b := range nb {
			wb := w[wbytes*b : wbytes*(b+1)]
			xb := xq[xbytes*b : xbytes*(b+1)]
			var lv [32]int32
			mOff := legacyLevels(q, wb, &lv)
			y := (*[32]byte)(xb[xbytes-32:])
			var s0, s1 int32
			for j := range 16 {
				s0 += lv[j] * int32(int8(y[j]))
				s1 += lv[j+16] * int32(int8(y[j+16]))
			}
			t := float32(f16At(wb)*f16At(xb)) * float32(s0+s1)
			if mOff >= 0 {
				t += f16At(wb[mOff:]) * f16At(xb[2:])
			}
			sum += t
		}
		return sum
	}
}
