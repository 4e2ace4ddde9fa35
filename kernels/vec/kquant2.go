package vec

import (
	"encoding/binary"
	"math"
)

// Q2_K, Q3_K, Q5_K and IQ4_XS weights with Q8_K activations: the exported
// kernels and their pure-Go twins. The byte layouts are described in
// kernels/quant (kquant2.go); the arithmetic is that of ggml's scalar
// ggml_vec_dot_<type>_q8_K: an exact integer sum per block, scaled by the
// float32 product of the block scales.

// DotQ2_K returns the dot product of a Q2_K row of n values with
// activations quantized by [QuantizeQ8_K], or NaN if n is not a multiple
// of 256 or a slice has the wrong length for n.
func DotQ2_K(w, xq []byte, n int) float32 { return dotQ(q2_K, w, xq, n) }

// DotQ3_K is [DotQ2_K] for Q3_K weights.
func DotQ3_K(w, xq []byte, n int) float32 { return dotQ(q3_K, w, xq, n) }

// DotQ5_K is [DotQ2_K] for Q5_K weights.
func DotQ5_K(w, xq []byte, n int) float32 { return dotQ(q5_K, w, xq, n) }

// DotIQ4_XS is [DotQ2_K] for IQ4_XS weights.
func DotIQ4_XS(w, xq []byte, n int) float32 { return dotQ(iq4_XS, w, xq, n) }

// MatVecQ2_K is [MatVecQ4_K] for Q2_K weights (activations from
// [QuantizeQ8_K]).
func MatVecQ2_K(dst []float32, w, xq []byte, rows, cols int) {
	matVecQ(q2_K, dst, w, xq, rows, cols)
}

// MatVecQ3_K is [MatVecQ4_K] for Q3_K weights.
func MatVecQ3_K(dst []float32, w, xq []byte, rows, cols int) {
	matVecQ(q3_K, dst, w, xq, rows, cols)
}

// MatVecQ5_K is [MatVecQ4_K] for Q5_K weights.
func MatVecQ5_K(dst []float32, w, xq []byte, rows, cols int) {
	matVecQ(q5_K, dst, w, xq, rows, cols)
}

// MatVecIQ4_XS is [MatVecQ4_K] for IQ4_XS weights.
func MatVecIQ4_XS(dst []float32, w, xq []byte, rows, cols int) {
	matVecQ(iq4_XS, dst, w, xq, rows, cols)
}

// MatMulQ2_K is [MatMulQ4_K] for Q2_K weights (activations from
// [QuantizeQ8_K], cols/256·292 bytes per token).
func MatMulQ2_K(dst []float32, ldd int, w, xq []byte, rows, cols, tokens int) {
	matMulQ(q2_K, dst, ldd, w, xq, rows, cols, tokens)
}

// MatMulQ3_K is [MatMulQ4_K] for Q3_K weights.
func MatMulQ3_K(dst []float32, ldd int, w, xq []byte, rows, cols, tokens int) {
	matMulQ(q3_K, dst, ldd, w, xq, rows, cols, tokens)
}

// MatMulQ5_K is [MatMulQ4_K] for Q5_K weights.
func MatMulQ5_K(dst []float32, ldd int, w, xq []byte, rows, cols, tokens int) {
	matMulQ(q5_K, dst, ldd, w, xq, rows, cols, tokens)
}

// MatMulIQ4_XS is [MatMulQ4_K] for IQ4_XS weights.
func MatMulIQ4_XS(dst []float32, ldd int, w, xq []byte, rows, cols, tokens int) {
	matMulQ(iq4_XS, dst, ldd, w, xq, rows, cols, tokens)
}

func q8KScale(xb *[Q8_KBytes]byte) float32 {
	return math.Float32frombits(binary.LittleEndian.Uint32(xb[0:]))
}

func dotQ2_KGo(w, xq []byte, nb int) float32 {
	var sum float32
	for b := range nb {
		wb := (*[84]byte)(w[84*b:])
		xb := (*[Q8_KBytes]byte)(xq[Q8_KBytes*b:])
		var isum, msum int32
		for s := range 16 {
			msum += bsum(xb, s) * int32(wb[s]>>4)
		}
		// Value 128h + 32k + l is bits 2k, 2k+1 of qs[32h + l]; sub-block
		// s = 8h + 2k + l/16 covers values 16s … 16s+15.
		for h := range 2 {
			qs := (*[32]byte)(wb[16+32*h:])
			for k := range 4 {
				y := (*[32]byte)(xb[4+128*h+32*k:])
				var d0, d1 int32
				for l := range 16 {
					d0 += int32(qs[l]>>(2*k)&3) * int32(int8(y[l]))
					d1 += int32(qs[l+16]>>(2*k)&3) * int32(int8(y[l+16]))
				}
				s := 8*h + 2*k
				isum += int32(wb[s]&15)*d0 + int32(wb[s+1]&15)*d1
			}
		}
		d := q8KScale(xb)
		dall, dmin := d*f16At(wb[80:]), d*f16At(wb[82:])
		sum += dall*float32(isum) - dmin*float32(msum)
	}
	return sum
}

// q3KScales unpacks the sixteen 6-bit Q3_K scales, offset removed.
func q3KScales(sc *[12]byte) (out [16]int32) {
	for s := range 16 {
		lo := sc[s%8] >> (4 * (s / 8)) & 15
		hi := sc[8+s%4] >> (2 * (s / 4)) & 3
		out[s] = int32(lo|hi<<4) - 32
	}
	return out
}

func dotQ3_KGo(w, xq []byte, nb int) float32 {
	var sum float32
	for b := range nb {
		wb := (*[110]byte)(w[110*b:])
		xb := (*[Q8_KBytes]byte)(xq[Q8_KBytes*b:])
		hm := (*[32]byte)(wb[0:])
		sc := q3KScales((*[12]byte)(wb[96:]))
		var isum int32
		// As Q2_K, with the third bit of value 128h + 32k + l in bit
		// 4h + k of hmask[l]; a clear bit means −4.
		for h := range 2 {
			qs := (*[32]byte)(wb[32+32*h:])
			for k := range 4 {
				y := (*[32]byte)(xb[4+128*h+32*k:])
				bit := uint(4*h + k)
				var d0, d1 int32
				for l := range 16 {
					q0 := int32(qs[l]>>(2*k)&3) - 4 + 4*int32(hm[l]>>bit&1)
					q1 := int32(qs[l+16]>>(2*k)&3) - 4 + 4*int32(hm[l+16]>>bit&1)
					d0 += q0 * int32(int8(y[l]))
					d1 += q1 * int32(int8(y[l+16]))
				}
				s := 8*h + 2*k
				isum += sc[s]*d0 + sc[s+1]*d1
			}
		}
		sum += float32(isum) * (f16At(wb[108:]) * q8KScale(xb))
	}
	return sum
}

func dotQ5_KGo(w, xq []byte, nb int) float32 { return dotK4Go(w, xq, nb, true) }

func dotIQ4_XSGo(w, xq []byte, nb int) float32 {
	var sum float32
	for b := range nb {
		wb := (*[136]byte)(w[136*b:])
		xb := (*[Q8_KBytes]byte)(xq[Q8_KBytes*b:])
		h := binary.LittleEndian.Uint16(wb[2:])
		var isum int32
		for s := range 8 {
			ls := int32(wb[4+s/2]>>(4*(s%2))&15) | int32(h>>(2*s)&3)<<4
			qs := (*[16]byte)(wb[8+16*s:])
			y := (*[32]byte)(xb[4+32*s:])
			var d int32
			for j, q := range qs {
				d += int32(iq4nlValues[q&15])*int32(int8(y[j])) + int32(iq4nlValues[q>>4])*int32(int8(y[j+16]))
			}
			isum += (ls - 32) * d
		}
		sum += float32(isum) * (f16At(wb[0:]) * q8KScale(xb))
	}
	return sum
}
