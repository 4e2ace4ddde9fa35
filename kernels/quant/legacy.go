package quant

import (
	"encoding/binary"
	"math"
)

// The 32-value block types beside Q4_0 and Q8_0 ("legacy" quants in ggml's
// terms; the IQ4_NL non-linear type shares their block shape). Layouts, as
// ggml-common.h declares them (d, m binary16):
//
//	Q4_1 (20 bytes): d, m, qs[16]         x = d·q + m, q the nibble (0..15)
//	Q5_0 (22 bytes): d, qh[4], qs[16]     x = d·(q − 16)
//	Q5_1 (24 bytes): d, m, qh[4], qs[16]  x = d·q + m
//	IQ4_NL (18 bytes): d, qs[16]          x = d·iq4nlValues[q]
//
// As in Q4_0, value j (j < 16) is the low nibble of qs[j] and value 16+j
// the high one; for the 5-bit types bit i of the little-endian 32-bit qh is
// the fifth bit of value i.
const (
	q41Sz  = 20
	q50Sz  = 22
	q51Sz  = 24
	iq4Sz  = 18
	q5Bits = 0x10
)

// iq4nlValues are the 16 levels of IQ4_NL and IQ4_XS: ggml's
// kvalues_iq4nl, a non-uniform grid denser near zero, where weights are.
var iq4nlValues = [16]int8{-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113}

// IQ4NLValues returns the 16 levels of IQ4_NL, for kernels that decode it.
func IQ4NLValues() [16]int8 { return iq4nlValues }

// dequantLegacy is Dequantize for the types of this file (lengths checked).
func dequantLegacy(t Type, src []byte, dst []float32) {
	bb := t.BlockBytes()
	for ; len(dst) > 0; src, dst = src[bb:], dst[qk:] {
		var q [qk]int32
		d, m := legacyLevels(t, src[:bb], &q)
		y := (*[qk]float32)(dst)
		for j, v := range q {
			// The explicit conversion keeps the product rounded, as in C;
			// the types without an offset add none (which would turn a −0
			// into +0).
			y[j] = float32(v) * d
			if t == Q4_1 || t == Q5_1 {
				y[j] = float32(float32(v)*d) + m
			}
		}
	}
}

// legacyLevels decodes one block's integer levels (for Q5_0 already offset
// by −16, for IQ4_NL mapped to its grid) and returns its scale and offset.
func legacyLevels(t Type, b []byte, q *[qk]int32) (d, m float32) {
	d = f16At(b, 0)
	var qs []byte
	var qh uint32
	switch t {
	case Q4_1:
		m, qs = f16At(b, 2), b[4:20]
	case Q5_0:
		qh, qs = binary.LittleEndian.Uint32(b[2:]), b[6:22]
	case Q5_1:
		m, qh, qs = f16At(b, 2), binary.LittleEndian.Uint32(b[4:]), b[8:24]
	case IQ4_NL:
		qs = b[2:18]
	}
	for j := range qk / 2 {
		lo, hi := int32(qs[j]&0xf), int32(qs[j]>>4)
		if t == Q5_0 || t == Q5_1 {
			lo |= int32(qh>>j&1) << 4
			hi |= int32(qh>>(j+16)&1) << 4
		}
		q[j], q[j+qk/2] = lo, hi
	}
	switch t {
	case Q5_0:
		for j := range q {
			q[j] -= 16
		}
	case IQ4_NL:
		for j := range q {
			q[j] = int32(iq4nlValues[q[j]])
		}
	}
	return d, m
}

// quantLegacy is Quantize for the types of this file (lengths checked,
// values finite).
func quantLegacy(t Type, src []float32, dst []byte) {
	bb := t.BlockBytes()
	for ; len(src) > 0; src, dst = src[qk:], dst[bb:] {
		x := (*[qk]float32)(src)
		switch t {
		case Q4_1:
			quantQ41(x, (*[q41Sz]byte)(dst))
		case Q5_0:
			quantQ50(x, (*[q50Sz]byte)(dst))
		case Q5_1:
			quantQ51(x, (*[q51Sz]byte)(dst))
		case IQ4_NL:
			quantIQ4NL(x, (*[iq4Sz]byte)(dst))
		}
	}
}

// putMinScale stores the scale d = (max−min)/levels and the offset min of
// block x at b[0:2] and b[2:4], as Q4_1 and Q5_1 keep them, and returns the
// min and 1/d (0 for a constant block).
func putMinScale(x *[qk]float32, b []byte, levels float32) (lo, id float32) {
	lo, hi := float32(math.MaxFloat32), float32(-math.MaxFloat32)
	for _, v := range x {
		lo = min(lo, v)
		hi = max(hi, v)
	}
	d := (hi - lo) / levels
	putF16(b, 0, d)
	putF16(b, 2, lo)
	return lo, inv(d)
}

// putSignedScale stores the scale d = vmax/−levels of block x at b[0:2],
// where vmax is its value of largest magnitude, sign kept, so that value
// lands on the lowest level (Q4_0, Q5_0); it returns 1/d (0 for a zero
// block).
func putSignedScale(x *[qk]float32, b []byte, levels float32) (id float32) {
	_, vmax := absMax(x[:])
	d := vmax / -levels
	putF16(b, 0, d)
	return inv(d)
}

// quantQ41 is ggml's quantize_row_q4_1_ref for one block: 16 levels from
// the block's minimum to its maximum, x−min scaled and rounded half up (by
// adding ½ and truncating), clamped to 15.
func quantQ41(x *[qk]float32, b *[q41Sz]byte) {
	lo, id := putMinScale(x, b[:], 15)
	for j := range qk / 2 {
		q0 := min(15, int(float32(float32(x[j]-lo)*id)+0.5))
		q1 := min(15, int(float32(float32(x[j+qk/2]-lo)*id)+0.5))
		b[4+j] = byte(q0) | byte(q1)<<4
	}
}

// quantQ51 is ggml's quantize_row_q5_1_ref: Q4_1 with 32 levels (no clamp
// in ggml: the largest value lands on 31 after rounding).
func quantQ51(x *[qk]float32, b *[q51Sz]byte) {
	lo, id := putMinScale(x, b[:], 31)
	var qh uint32
	for j := range qk / 2 {
		q0 := uint8(int(float32(float32(x[j]-lo)*id) + 0.5))
		q1 := uint8(int(float32(float32(x[j+qk/2]-lo)*id) + 0.5))
		b[8+j] = q0&0xf | q1&0xf<<4
		qh |= uint32(q0>>4&1)<<j | uint32(q1>>4&1)<<(j+qk/2)
	}
	binary.LittleEndian.PutUint32(b[4:], qh)
}

// quantQ50 is ggml's quantize_row_q5_0_ref: like Q4_0, the value of largest
// magnitude (sign included) sets d = v/−16, so it lands on level 0, and
// levels round half up into 0..31.
func quantQ50(x *[qk]float32, b *[q50Sz]byte) {
	id := putSignedScale(x, b[:], 16)
	var qh uint32
	for j := range qk / 2 {
		q0 := uint8(min(31, int(float32(x[j]*id)+16.5)))
		q1 := uint8(min(31, int(float32(x[j+qk/2]*id)+16.5)))
		b[6+j] = q0&0xf | q1&0xf<<4
		qh |= uint32(q0>>4&1)<<j | uint32(q1>>4&1)<<(j+qk/2)
	}
	binary.LittleEndian.PutUint32(b[2:], qh)
}

// bestIQ4 is ggml's best_index_int8 over iq4nlValues: the index of the
// level nearest x by bisection, the upper one on a tie.
func bestIQ4(x float32) uint8 {
	v := &iq4nlValues
	if x <= float32(v[0]) {
		return 0
	}
	if x >= float32(v[15]) {
		return 15
	}
	lo, hi := 0, 15
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		if x < float32(v[mid]) {
			hi = mid
		} else {
			lo = mid
		}
	}
	if x-float32(v[hi-1]) < float32(v[hi])-x {
		return uint8(hi - 1)
	}
	return uint8(hi)
}

// iq4Scale is the scale search of ggml's quantize_row_iq4_nl_impl (no
// importance matrix, so the weights are x²) for one 32-value group, shared
// by IQ4_NL and IQ4_XS's sub-blocks: a first scale puts the value of
// largest magnitude on the grid's end, −127; fifteen more candidates (itry
// −7..7) are tried, each scored by the weighted least-squares fit
// (Σwqx)²/Σwq², and the best fitted scale is returned (0 for a group below
// groupMaxEps). The arithmetic is float32 in ggml's order; the explicit
// conversions keep Go from fusing a multiply and add where C does not.
func iq4Scale(x *[qk]float32) float32 {
	const ntry = 7
	amax, vmax := absMax(x[:])
	if amax < groupMaxEps {
		return 0
	}
	fit := func(id float32) (sumqx, sumq2 float32) {
		for _, v := range x {
			q := float32(iq4nlValues[bestIQ4(float32(id*v))])
			wq := float32(float32(v*v) * q)
			sumqx += float32(wq * v)
			sumq2 += float32(wq * q)
		}
		return sumqx, sumq2
	}
	d := -vmax / float32(iq4nlValues[0])
	sumqx, sumq2 := fit(1 / d)
	d = sumqx / sumq2
	best := float32(d * sumqx)
	for itry := -ntry; itry <= ntry; itry++ {
		sumqx, sumq2 := fit(float32(itry+int(iq4nlValues[0])) / vmax)
		if sumq2 > 0 && float32(sumqx*sumqx) > float32(best*sumq2) {
			d = sumqx / sumq2
			best = float32(d * sumqx)
		}
	}
	return d
}

// quantIQ4NL is ggml's quantize_iq4_nl for one block without an importance
// matrix (what llama-quantize writes): the scale of iq4Scale, stored, and
// the levels chosen again with it.
func quantIQ4NL(x *[qk]float32, b *[iq4Sz]byte) {
	d := iq4Scale(x)
	putF16(b[:], 0, d)
	id := inv(d)
	for j := range qk / 2 {
		l0 := bestIQ4(float32(id * x[j]))
		l1 := bestIQ4(float32(id * x[j+qk/2]))
		b[2+j] = l0 | l1<<4
	}
}

// dotLegacy is Dot for the types of this file (lengths checked):
// Σ(d·q + m)·x = d·Σq·x + m·Σx per block.
func dotLegacy(t Type, row []byte, x []float32) float32 {
	bb := t.BlockBytes()
	var sum float32
	for ; len(x) > 0; row, x = row[bb:], x[qk:] {
		var q [qk]int32
		d, m := legacyLevels(t, row[:bb], &q)
		v := (*[qk]float32)(x)
		var s0, s1, sx0, sx1 float32
		for j := 0; j < qk; j += 2 {
			s0 += float32(q[j]) * v[j]
			s1 += float32(q[j+1]) * v[j+1]
			sx0 += v[j]
			sx1 += v[j+1]
		}
		sum += d*(s0+s1) + m*(sx0+sx1)
	}
	return sum
}
