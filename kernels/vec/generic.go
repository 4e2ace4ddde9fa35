package vec

import (
	"encoding/binary"
	"math"

	"github.com/baton-serving/baton/kernels/quant"
)

// The pure-Go twins of every kernel. They are the fallback on CPUs without
// AVX2 and under the purego tag, and the reference the assembly is tested
// against. Loops reslice to fixed-size arrays so the compiler drops bounds
// checks, and keep several partial sums to shorten dependency chains.

var genericImpl = func() *impl {
	im := &impl{
		name:       "purego",
		dotF32:     dotF32Go,
		dot4F32:    dot4F32Go,
		dot4F16:    dot4F16Go,
		dotF16:     dotF16Go,
		dotBF16:    dotBF16Go,
		matVecF32:  matVecF32Go,
		matVecF16:  matVecHalfGo(dotF16Go),
		matVecBF16: matVecHalfGo(dotBF16Go),
		matMulF32:  matMulF32Go,
		matMulF16:  matMulHalfGo(dotF16Go),
		matMulBF16: matMulHalfGo(dotBF16Go),
		packLen:    func(int, int) int { return 0 },
		pack:       func([]float32, []float32, int, int) {},
		dotQ: [numQ]func(w, xq []byte, nb int) float32{dotQ8_0Go, dotQ4_0Go, dotQ4_KGo, dotQ6_KGo,
			q4_1: dotLegacyGo(q4_1), q5_0: dotLegacyGo(q5_0), q5_1: dotLegacyGo(q5_1), iq4_nl: dotLegacyGo(iq4_nl),
			q2_K: dotQ2_KGo, q3_K: dotQ3_KGo, q5_K: dotQ5_KGo, iq4_XS: dotIQ4_XSGo},
		quantQ8_0: quantQ8_0Go,
		quantQ8_K: quantQ8_KGo,
		quantQ8_1: quantQ8_1Go,
		expSum:    expSumGo,
		axpy4:     axpy4Go,
		axpy4F16:  axpy4F16Go,
	}
	// The matrix kernels of every block type are its dot product row by row.
	for q := range qtype(numQ) {
		im.matVecQ[q] = matVecQGo(q, im.dotQ[q])
		im.matMulQ[q] = matMulQGo(q, im.dotQ[q])
	}
	return im
}()

func f16At(b []byte) float32 { return quant.F16ToF32(binary.LittleEndian.Uint16(b)) }

func dotF32Go(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3, s4, s5, s6, s7 float32
	for len(a) >= 8 {
		x, y := (*[8]float32)(a), (*[8]float32)(b)
		s0 += x[0] * y[0]
		s1 += x[1] * y[1]
		s2 += x[2] * y[2]
		s3 += x[3] * y[3]
		s4 += x[4] * y[4]
		s5 += x[5] * y[5]
		s6 += x[6] * y[6]
		s7 += x[7] * y[7]
		a, b = a[8:], b[8:]
	}
	for i, v := range a {
		s0 += v * b[i]
	}
	return ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))
}

// dotHalfGo is the dot product of 16-bit floats with x, widened by conv.
func dotHalfGo(w []byte, x []float32, conv func(uint16) float32) float32 {
	w = w[:2*len(x)]
	var s0, s1, s2, s3 float32
	for len(x) >= 4 {
		r, v := (*[8]byte)(w), (*[4]float32)(x)
		s0 += conv(binary.LittleEndian.Uint16(r[0:])) * v[0]
		s1 += conv(binary.LittleEndian.Uint16(r[2:])) * v[1]
		s2 += conv(binary.LittleEndian.Uint16(r[4:])) * v[2]
		s3 += conv(binary.LittleEndian.Uint16(r[6:])) * v[3]
		w, x = w[8:], x[4:]
	}
	for i, v := range x {
		s0 += conv(binary.LittleEndian.Uint16(w[2*i:])) * v
	}
	return (s0 + s1) + (s2 + s3)
}

func dotF16Go(w []byte, x []float32) float32  { return dotHalfGo(w, x, quant.F16ToF32) }
func dotBF16Go(w []byte, x []float32) float32 { return dotHalfGo(w, x, quant.BF16ToF32) }

func matVecF32Go(dst, w, x []float32, rows, cols int) {
	for r := range dst[:rows] {
		dst[r] = dotF32Go(w[r*cols:(r+1)*cols], x)
	}
}

// matVecHalfGo is the matrix-vector product of 16-bit float weights whose
// rows dot computes.
func matVecHalfGo(dot func(w []byte, x []float32) float32) func(dst []float32, w []byte, x []float32, rows, cols int) {
	return func(dst []float32, w []byte, x []float32, rows, cols int) {
		for r := range dst[:rows] {
			dst[r] = dot(w[2*r*cols:2*(r+1)*cols], x)
		}
	}
}

func matMulF32Go(dst []float32, ldd int, w, x, _ []float32, rows, cols, tokens int) {
	for t := range tokens {
		xt := x[t*cols : (t+1)*cols]
		out := dst[t*ldd : t*ldd+rows]
		for r := range out {
			out[r] = dotF32Go(w[r*cols:(r+1)*cols], xt)
		}
	}
}

// matMulHalfGo is the matrix-matrix product of 16-bit float weights whose
// rows dot computes.
func matMulHalfGo(dot func(w []byte, x []float32) float32) func(dst []float32, ldd int, w []byte, x, _ []float32, rows, cols, tokens int) {
	return func(dst []float32, ldd int, w []byte, x, _ []float32, rows, cols, tokens int) {
		for t := range tokens {
			xt := x[t*cols : (t+1)*cols]
			out := dst[t*ldd : t*ldd+rows]
			for r := range out {
				out[r] = dot(w[2*r*cols:2*(r+1)*cols], xt)
			}
		}
	}
}

func matVecQGo(q qtype, dot func(w, xq []byte, nb int) float32) func(dst []float32, w, xq []byte, rows, nb int) {
	wb := qinfo[q].wBytes
	return func(dst []float32, w, xq []byte, rows, nb int) {
		rb := nb * wb
		for r := range dst[:rows] {
			dst[r] = dot(w[r*rb:(r+1)*rb], xq, nb)
		}
	}
}

func matMulQGo(q qtype, dot func(w, xq []byte, nb int) float32) func(dst []float32, ldd int, w, xq []byte, rows, nb, tokens int) {
	wb, xb := qinfo[q].wBytes, qinfo[q].xBytes
	return func(dst []float32, ldd int, w, xq []byte, rows, nb, tokens int) {
		rb, xr := nb*wb, nb*xb
		for t := range tokens {
			xt := xq[t*xr : (t+1)*xr]
			out := dst[t*ldd : t*ldd+rows]
			for r := range out {
				out[r] = dot(w[r*rb:(r+1)*rb], xt, nb)
			}
		}
	}
}

// The block dot products below compute each block's integer sum exactly
// and add it, times the float32 product of the scales, to a float32 total,
// block by block — the arithmetic of ggml's scalar vec_dot functions.

func dotQ8_0Go(w, xq []byte, nb int) float32 {
	var sum float32
	for b := range nb {
		wb := (*[34]byte)(w[34*b:])
		xb := (*[34]byte)(xq[34*b:])
		var s0, s1, s2, s3 int32
		for j := 2; j < 34; j += 4 {
			s0 += int32(int8(wb[j])) * int32(int8(xb[j]))
			s1 += int32(int8(wb[j+1])) * int32(int8(xb[j+1]))
			s2 += int32(int8(wb[j+2])) * int32(int8(xb[j+2]))
			s3 += int32(int8(wb[j+3])) * int32(int8(xb[j+3]))
		}
		sum += float32((s0+s1)+(s2+s3)) * (f16At(wb[0:]) * f16At(xb[0:]))
	}
	return sum
}

func dotQ4_0Go(w, xq []byte, nb int) float32 {
	var sum float32
	for b := range nb {
		wb := (*[18]byte)(w[18*b:])
		xb := (*[34]byte)(xq[34*b:])
		var s0, s1 int32
		for j := range 16 {
			q := wb[2+j]
			s0 += (int32(q&15) - 8) * int32(int8(xb[2+j]))
			s1 += (int32(q>>4) - 8) * int32(int8(xb[18+j]))
		}
		sum += float32(s0+s1) * (f16At(wb[0:]) * f16At(xb[0:]))
	}
	return sum
}

// scaleMinK4 unpacks the 6-bit scale and min of Q4_K sub-block j from the
// 12 packed bytes s (the layout of ggml's get_scale_min_k4).
func scaleMinK4(j int, s *[12]byte) (sc, m int32) {
	if j < 4 {
		return int32(s[j] & 63), int32(s[j+4] & 63)
	}
	return int32(s[j+4]&15 | s[j-4]>>6<<4), int32(s[j+4]>>4 | s[j]>>6<<4)
}

func bsum(xb *[Q8_KBytes]byte, j int) int32 {
	return int32(int16(binary.LittleEndian.Uint16(xb[260+2*j:])))
}

func dotQ4_KGo(w, xq []byte, nb int) float32 { return dotK4Go(w, xq, nb, false) }

// dotK4Go is the block dot product of Q4_K rows, or with five of Q5_K
// rows: the same scales and nibbles, Q5_K's nibbles 32 bytes further on,
// after the fifth bits qh (bit 2c of qh[l] for value 64c+l, bit 2c+1 for
// value 64c+32+l), which Q4_K reads as zeros.
func dotK4Go(w, xq []byte, nb int, five bool) float32 {
	wBytes, qsOff := 144, 16
	if five {
		wBytes, qsOff = 176, 48
	}
	var noHigh [32]byte
	var sum float32
	for b := range nb {
		wb := w[wBytes*b : wBytes*(b+1)]
		xb := (*[Q8_KBytes]byte)(xq[Q8_KBytes*b:])
		scales := (*[12]byte)(wb[4:16])
		qh := &noHigh
		if five {
			qh = (*[32]byte)(wb[16:48])
		}
		var isum, msum int32
		for c := range 4 {
			qs := (*[32]byte)(wb[qsOff+32*c:])
			lo := (*[32]byte)(xb[4+64*c:])
			hi := (*[32]byte)(xb[4+64*c+32:])
			var d1, d2 int32
			for l, q := range qs {
				h := qh[l] >> (2 * c)
				d1 += int32(q&15|h&1<<4) * int32(int8(lo[l]))
				d2 += int32(q>>4|h>>1&1<<4) * int32(int8(hi[l]))
			}
			sc1, m1 := scaleMinK4(2*c, scales)
			sc2, m2 := scaleMinK4(2*c+1, scales)
			isum += sc1*d1 + sc2*d2
			msum += m1*(bsum(xb, 4*c)+bsum(xb, 4*c+1)) + m2*(bsum(xb, 4*c+2)+bsum(xb, 4*c+3))
		}
		d := q8KScale(xb)
		sum += float32(isum) * (f16At(wb[0:]) * d)
		sum -= float32(msum) * (f16At(wb[2:]) * d)
	}
	return sum
}

func dotQ6_KGo(w, xq []byte, nb int) float32 {
	var sum float32
	for b := range nb {
		wb := (*[210]byte)(w[210*b:])
		xb := (*[Q8_KBytes]byte)(xq[Q8_KBytes*b:])
		var isum int32
		for h := range 2 {
			ql := (*[64]byte)(wb[64*h:])
			qh := (*[32]byte)(wb[128+32*h:])
			sc := (*[8]byte)(wb[192+8*h:])
			y := (*[128]byte)(xb[4+128*h:])
			// Values l, l+32, l+64, l+96 of the half; sub-block g = l/16
			// of quarter k has scale sc[g+2k].
			for g := range 2 {
				var a0, a1, a2, a3 int32
				for l := 16 * g; l < 16*g+16; l++ {
					lo, hi, bits := ql[l], ql[l+32], qh[l]
					a0 += (int32(lo&15|bits&3<<4) - 32) * int32(int8(y[l]))
					a1 += (int32(hi&15|bits>>2&3<<4) - 32) * int32(int8(y[l+32]))
					a2 += (int32(lo>>4|bits>>4&3<<4) - 32) * int32(int8(y[l+64]))
					a3 += (int32(hi>>4|bits>>6<<4) - 32) * int32(int8(y[l+96]))
				}
				isum += int32(int8(sc[g]))*a0 + int32(int8(sc[g+2]))*a1 +
					int32(int8(sc[g+4]))*a2 + int32(int8(sc[g+6]))*a3
			}
		}
		d := q8KScale(xb)
		sum += float32(isum) * (f16At(wb[208:]) * d)
	}
	return sum
}

// x86Round is how ggml's x86 activation quantizers (quantize_row_q8_0 and
// quantize_row_q8_1 of llama.cpp's AVX builds) turn a product into an
// integer: round to nearest, ties to even, then cvtps2dq, which gives
// math.MinInt32 for a NaN or a value beyond int32 (the +Inf of a block
// whose 127/amax overflows). The caller saturates to int8 as the packs do;
// Q8_1 sums the int32 values before that.
func x86Round(p float32) int32 {
	r := math.RoundToEven(float64(p))
	if !(r >= math.MinInt32 && r <= math.MaxInt32) { // NaN too
		return math.MinInt32
	}
	return int32(r)
}

// x86Scale returns the scale d = amax/127 of a Q8_0 or Q8_1 block and the
// multiplier id = 127/amax (0 for an all-zero block) of ggml's x86
// quantizers. ggml's scalar reference, which its ARM and baseline builds
// run, multiplies by 1/d instead, which differs from 127/amax in the last
// place for about a third of the blocks; Baton follows x86.
func x86Scale(amax float32) (d, id float32) {
	if amax != 0 {
		id = 127 / amax
	}
	return amax / 127, id
}

// sat8 saturates to int8, like vpackssdw followed by vpacksswb.
func sat8(i int32) byte { return byte(int8(max(-128, min(127, i)))) }

// nearestInt rounds to nearest, ties to even, for |f| < 2²²: ggml's
// nearest_int, which adds 1.5·2²³ so that the float32 addition itself
// rounds away the fraction.
func nearestInt(f float32) int32 {
	v := f + 12582912
	return int32(math.Float32bits(v)&0x7fffff) - 0x400000
}

func finite(v float32) bool { return math.Float32bits(v)&0x7f800000 != 0x7f800000 }

// q8Amax is the largest magnitude in the 32 values of a Q8_0 or Q8_1 block,
// and whether they are all finite (the quantizers encode a block that is
// not as NaN).
func q8Amax(xb *[32]float32) (amax float32, ok bool) {
	ok = true
	for _, v := range xb {
		ok = ok && finite(v)
		amax = max(amax, math.Float32frombits(math.Float32bits(v)&^(1<<31)))
	}
	return amax, ok
}

const f16NaN = 0x7e00

func quantQ8_0Go(x []float32, dst []byte) {
	for b := range len(x) / Q8_0Values {
		xb := (*[32]float32)(x[32*b:])
		yb := (*[34]byte)(dst[34*b:])
		amax, ok := q8Amax(xb)
		if !ok {
			binary.LittleEndian.PutUint16(yb[0:], f16NaN)
			clear(yb[2:])
			continue
		}
		d, id := x86Scale(amax)
		binary.LittleEndian.PutUint16(yb[0:], quant.F32ToF16(d))
		for j, v := range xb {
			yb[2+j] = sat8(x86Round(float32(v * id)))
		}
	}
}

func quantQ8_KGo(x []float32, dst []byte) {
	for b := range len(x) / Q8_KValues {
		xb := (*[256]float32)(x[256*b:])
		yb := (*[Q8_KBytes]byte)(dst[Q8_KBytes*b:])
		var amax, vmax float32
		ok := true
		for _, v := range xb {
			ok = ok && finite(v)
			if a := math.Float32frombits(math.Float32bits(v) &^ (1 << 31)); a > amax {
				amax, vmax = a, v
			}
		}
		if !ok || amax == 0 {
			d := float32(0)
			if !ok {
				d = nan32()
			}
			binary.LittleEndian.PutUint32(yb[0:], math.Float32bits(d))
			clear(yb[4:])
			continue
		}
		iscale := -127 / vmax
		binary.LittleEndian.PutUint32(yb[0:], math.Float32bits(1/iscale))
		for g := range 16 {
			var s int32
			for j := 16 * g; j < 16*g+16; j++ {
				q := min(127, nearestInt(float32(iscale*xb[j])))
				yb[4+j] = byte(int8(q))
				s += q
			}
			binary.LittleEndian.PutUint16(yb[260+2*g:], uint16(int16(s)))
		}
	}
}
