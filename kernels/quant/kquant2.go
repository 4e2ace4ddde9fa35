package quant

import "encoding/binary"

// The K-quants of the smaller published files (Q2_K, Q3_K, Q5_K) and
// IQ4_XS, the 256-value super-block form of the non-linear 4-bit type.
// Byte layouts, as ggml-common.h declares them (little-endian; d and dmin
// are binary16):
//
//	Q2_K (84 bytes): scales[16], qs[64], d, dmin
//	    sixteen 16-value sub-blocks; scales[s] holds the 4-bit scale (low
//	    nibble) and min (high nibble) of sub-block s; x = d·sc·q − dmin·m
//	    with 2-bit q. Value 128h + 32k + l (h < 2, k < 4, l < 32) is bits
//	    2k, 2k+1 of qs[32h + l]; its sub-block is 8h + 2k + l/16.
//	Q3_K (110 bytes): hmask[32], qs[64], scales[12], d
//	    sixteen 16-value sub-blocks with 6-bit scales stored offset by 32
//	    (see q3kScale); x = d·(sc−32)·(q−4) with 3-bit q: the low two bits
//	    sit where Q2_K keeps its values, the third is bit 4h+k of
//	    hmask[l].
//	Q5_K (176 bytes): d, dmin, scales[12], qh[32], qs[128]
//	    Q4_K's eight 32-value sub-blocks, scales and nibbles, with a fifth
//	    bit per value: value 64c + l (l < 32) has bit 2c of qh[l], value
//	    64c + 32 + l bit 2c+1. x = d·sc·q − dmin·m.
//	IQ4_XS (136 bytes): d, scales_h (uint16), scales_l[4], qs[128]
//	    eight 32-value sub-blocks with 6-bit scales (low nibble in
//	    scales_l, nibble s%2 of byte s/2; top two bits at 2s of scales_h)
//	    stored offset by 32; x = d·(sc−32)·iq4nlValues[q] with 4-bit q.
//	    Value 32s + j (j < 16) is the low nibble of qs[16s + j], value
//	    32s + 16 + j its high nibble.
const (
	q2KSz   = 84
	q3KSz   = 110
	q5KSz   = 176
	iq4XSSz = 136
)

// dequantKQ2 is Dequantize for the types of this file (shapes checked).
func dequantKQ2(t Type, src []byte, dst []float32) {
	bb := t.BlockBytes()
	for ; len(dst) > 0; src, dst = src[bb:], dst[qkK:] {
		y := (*[qkK]float32)(dst)
		switch t {
		case Q2_K:
			dequantQ2K((*[q2KSz]byte)(src), y)
		case Q3_K:
			dequantQ3K((*[q3KSz]byte)(src), y)
		case Q5_K:
			dequantQ5K((*[q5KSz]byte)(src), y)
		case IQ4_XS:
			dequantIQ4XS((*[iq4XSSz]byte)(src), y)
		}
	}
}

// quantKQ2 is Quantize for the types of this file (shapes checked, input
// finite).
func quantKQ2(t Type, src []float32, dst []byte) {
	bb := t.BlockBytes()
	for ; len(src) > 0; src, dst = src[qkK:], dst[bb:] {
		x := (*[qkK]float32)(src)
		switch t {
		case Q2_K:
			quantQ2K(x, (*[q2KSz]byte)(dst))
		case Q3_K:
			quantQ3K(x, (*[q3KSz]byte)(dst))
		case Q5_K:
			quantQ5K(x, (*[q5KSz]byte)(dst))
		case IQ4_XS:
			quantIQ4XS(x, (*[iq4XSSz]byte)(dst))
		}
	}
}

// dotKQ2 is Dot for the types of this file, with Dot's shape guard.
func dotKQ2(t Type, row []byte, x []float32) float32 {
	bb := t.BlockBytes()
	if len(x)%qkK != 0 || len(row) != len(x)/qkK*bb {
		return nan32()
	}
	var sum float32
	for ; len(x) > 0; row, x = row[bb:], x[qkK:] {
		v := (*[qkK]float32)(x)
		switch t {
		case Q2_K:
			sum += dotQ2K((*[q2KSz]byte)(row), v)
		case Q3_K:
			sum += dotQ3K((*[q3KSz]byte)(row), v)
		case Q5_K:
			sum += dotQ5K((*[q5KSz]byte)(row), v)
		case IQ4_XS:
			sum += dotIQ4XS((*[iq4XSSz]byte)(row), v)
		}
	}
	return sum
}

// q2Level is the 2-bit value i of a Q2_K or Q3_K block's qs (64 bytes).
func q2Level(qs *[64]byte, i int) uint8 {
	h, k, l := i/128, i%128/32, i%32
	return qs[32*h+l] >> (2 * k) & 3
}

func dequantQ2K(b *[q2KSz]byte, y *[qkK]float32) {
	d, dmin := f16At(b[:], 80), f16At(b[:], 82)
	qs := (*[64]byte)(b[16:])
	for s := range 16 {
		sc := b[s]
		dl, ml := d*float32(sc&0xf), dmin*float32(sc>>4)
		for i := 16 * s; i < 16*s+16; i++ {
			y[i] = dl*float32(q2Level(qs, i)) - ml
		}
	}
}

func dotQ2K(b *[q2KSz]byte, x *[qkK]float32) float32 {
	qs := (*[64]byte)(b[16:])
	// Σ(d·sc·q − dmin·m)·x = d·Σ_s sc_s·Σq·x − dmin·Σ_s m_s·Σx.
	var sq, sm float32
	for s := range 16 {
		var qx, sx float32
		for i := 16 * s; i < 16*s+16; i++ {
			qx += float32(q2Level(qs, i)) * x[i]
			sx += x[i]
		}
		sq += float32(b[s]&0xf) * qx
		sm += float32(b[s]>>4) * sx
	}
	return f16At(b[:], 80)*sq - f16At(b[:], 82)*sm
}

// q3kScale unpacks the 6-bit scale of Q3_K sub-block s (0..15) from the 12
// bytes sc, minus its offset of 32: the low four bits are nibble s/8 of
// byte s%8, the top two bits 2·(s/4), 2·(s/4)+1 of byte 8 + s%4.
func q3kScale(s int, sc *[12]byte) int {
	lo := sc[s%8] >> (4 * (s / 8)) & 0xf
	hi := sc[8+s%4] >> (2 * (s / 4)) & 3
	return int(lo|hi<<4) - 32
}

// q3Level is the signed 3-bit value i (−4..3) of a Q3_K block.
func q3Level(b *[q3KSz]byte, i int) int {
	q := int(q2Level((*[64]byte)(b[32:]), i))
	h, k, l := i/128, i%128/32, i%32
	if b[l]>>(4*h+k)&1 == 0 {
		q -= 4
	}
	return q
}

func dequantQ3K(b *[q3KSz]byte, y *[qkK]float32) {
	d := f16At(b[:], 108)
	sc := (*[12]byte)(b[96:])
	for s := range 16 {
		dl := d * float32(q3kScale(s, sc))
		for i := 16 * s; i < 16*s+16; i++ {
			y[i] = dl * float32(q3Level(b, i))
		}
	}
}

func dotQ3K(b *[q3KSz]byte, x *[qkK]float32) float32 {
	sc := (*[12]byte)(b[96:])
	var s float32
	for j := range 16 {
		var qx float32
		for i := 16 * j; i < 16*j+16; i++ {
			qx += float32(q3Level(b, i)) * x[i]
		}
		s += float32(q3kScale(j, sc)) * qx
	}
	return f16At(b[:], 108) * s
}

// q5Level is the 5-bit value i (0..31) of a Q5_K block.
func q5Level(b *[q5KSz]byte, i int) uint8 {
	c, l := i/64, i%64
	q := b[48+32*c+l%32]
	bit := 2 * c
	if l < 32 {
		q &= 0xf
	} else {
		q >>= 4
		bit++
	}
	return q | (b[16+l%32]>>bit&1)<<4
}

func dequantQ5K(b *[q5KSz]byte, y *[qkK]float32) {
	d, dmin := f16At(b[:], 0), f16At(b[:], 2)
	scales := (*[12]byte)(b[4:16])
	for j := range 8 {
		sc, m := scaleMinK4(j, scales)
		dl, ml := d*float32(sc), dmin*float32(m)
		for i := 32 * j; i < 32*j+32; i++ {
			y[i] = dl*float32(q5Level(b, i)) - ml
		}
	}
}

func dotQ5K(b *[q5KSz]byte, x *[qkK]float32) float32 {
	scales := (*[12]byte)(b[4:16])
	var sq, sm float32
	for j := range 8 {
		var qx, sx float32
		for i := 32 * j; i < 32*j+32; i++ {
			qx += float32(q5Level(b, i)) * x[i]
			sx += x[i]
		}
		sc, m := scaleMinK4(j, scales)
		sq += float32(sc) * qx
		sm += float32(m) * sx
	}
	return f16At(b[:], 0)*sq - f16At(b[:], 2)*sm
}

// iq4xsScale is the scale of IQ4_XS sub-block s (0..7), offset removed.
func iq4xsScale(s int, b *[iq4XSSz]byte) int {
	h := binary.LittleEndian.Uint16(b[2:])
	lo := int(b[4+s/2]>>(4*(s%2))) & 0xf
	return lo | int(h>>(2*s)&3)<<4 - 32
}

// iq4Index is the 4-bit index of value i of an IQ4_XS block.
func iq4Index(b *[iq4XSSz]byte, i int) uint8 {
	s, j := i/32, i%32
	q := b[8+16*s+j%16]
	if j < 16 {
		return q & 0xf
	}
	return q >> 4
}

func dequantIQ4XS(b *[iq4XSSz]byte, y *[qkK]float32) {
	d := f16At(b[:], 0)
	for s := range 8 {
		dl := d * float32(iq4xsScale(s, b))
		for i := 32 * s; i < 32*s+32; i++ {
			y[i] = dl * float32(iq4nlValues[iq4Index(b, i)])
		}
	}
}

func dotIQ4XS(b *[iq4XSSz]byte, x *[qkK]float32) float32 {
	var s float32
	for j := range 8 {
		var qx float32
		for i := 32 * j; i < 32*j+32; i++ {
			qx += float32(iq4nlValues[iq4Index(b, i)]) * x[i]
		}
		s += float32(iq4xsScale(j, b)) * qx
	}
	return f16At(b[:], 0) * s
}

// packQ2Levels stores 256 2-bit levels as Q2_K's (and Q3_K's) qs: level
// 128h + 32k + l in bits 2k, 2k+1 of qs[32h + l].
func packQ2Levels(L *[qkK]uint8, qs *[64]byte) {
	for h := range 2 {
		for l := range 32 {
			j := 128*h + l
			qs[32*h+l] = L[j] | L[j+32]<<2 | L[j+64]<<4 | L[j+96]<<6
		}
	}
}

// quantQ2K follows ggml's quantize_row_q2_K_ref: fit a scale and min to
// each 16-value sub-block minimising the |x|-weighted absolute error, store
// both as 4 bits against the largest, and requantize against the stored
// scales.
func quantQ2K(x *[qkK]float32, b *[q2KSz]byte) {
	var (
		L              [qkK]uint8
		Laux           [16]uint8
		w              [16]float32
		scales, mins   [16]float32
		maxScale, maxM float32
	)
	for j := range 16 {
		xs := x[16*j : 16*j+16]
		for l, v := range xs {
			w[l] = abs32(v)
		}
		scales[j], mins[j] = makeQKX2(3, xs, w[:], L[16*j:16*j+16], Laux[:], -0.5, 0.1, 15, true)
		maxScale = max(maxScale, scales[j])
		maxM = max(maxM, mins[j])
	}
	// The conversions to byte wrap as C's stores to uint8_t do.
	if maxScale > 0 {
		iscale := 15 / maxScale
		for j := range 16 {
			b[j] = byte(nearestInt(iscale * scales[j]))
		}
		putF16(b[:], 80, maxScale/15)
	} else {
		clear(b[:16])
		putF16(b[:], 80, 0)
	}
	if maxM > 0 {
		iscale := 15 / maxM
		for j := range 16 {
			b[j] |= byte(nearestInt(iscale*mins[j]) << 4)
		}
		putF16(b[:], 82, maxM/15)
	} else {
		putF16(b[:], 82, 0)
	}
	d, dmin := f16At(b[:], 80), f16At(b[:], 82)
	for j := range 16 {
		requantMin(x[16*j:16*j+16], L[16*j:16*j+16], d*float32(b[j]&0xf), dmin*float32(b[j]>>4), 3)
	}
	packQ2Levels(&L, (*[64]byte)(b[16:]))
}

// makeQ3 is ggml's make_q3_quants with do_rmse: signed levels −nmax..nmax−1
// (returned in L offset by nmax) for x ≈ scale·l, starting from the levels
// of nmax/max|x| and then moving single levels while that improves the
// x²-weighted fit (Σwxl)²/Σwl², for up to five passes.
func makeQ3(nmax int, x []float32, L []int8) float32 {
	L = L[:len(x)]
	amax, vmax := absMax(x)
	if amax < groupMaxEps {
		clear(L)
		return 0
	}
	clamp := func(l int) int { return min(max(l, -nmax), nmax-1) }
	iscale := float32(-nmax) / vmax
	var sumLX, sumL2 float32
	for i, v := range x {
		l := clamp(nearestInt(iscale * v))
		L[i] = int8(l)
		w := v * v
		fl := float32(l)
		sumLX += w * v * fl
		sumL2 += w * fl * fl
	}
	for range 5 {
		changed := false
		for i, v := range x {
			w := v * v
			li := float32(L[i])
			slx := sumLX - w*v*li
			if slx <= 0 {
				continue
			}
			sl2 := sumL2 - w*li*li
			nl := clamp(nearestInt(v * sl2 / slx))
			if nl == int(L[i]) {
				continue
			}
			fn := float32(nl)
			slx += w * v * fn
			sl2 += w * fn * fn
			if sl2 > 0 && slx*slx*sumL2 > sumLX*sumLX*sl2 {
				L[i] = int8(nl)
				sumLX, sumL2 = slx, sl2
				changed = true
			}
		}
		if !changed {
			break
		}
	}
	for i := range L {
		L[i] += int8(nmax)
	}
	return sumLX / sumL2
}

// quantQ3K follows ggml's quantize_row_q3_K_ref: fit a signed scale to each
// 16-value sub-block (makeQ3), store the scales as 6 bits against the
// largest, and requantize the values against the stored scales.
func quantQ3K(x *[qkK]float32, b *[q3KSz]byte) {
	var (
		L      [qkK]int8
		scales [16]float32
	)
	for j := range 16 {
		scales[j] = makeQ3(4, x[16*j:16*j+16], L[16*j:16*j+16])
	}
	_, maxScale := absMax(scales[:])
	sc := (*[12]byte)(b[96:])
	clear(sc[:])
	if maxScale != 0 {
		iscale := -32 / maxScale
		for j := range 16 {
			l := byte(min(max(int(int8(nearestInt(iscale*scales[j]))), -32), 31) + 32)
			if j < 8 {
				sc[j] = l & 0xf
			} else {
				sc[j-8] |= (l & 0xf) << 4
			}
			sc[8+j%4] |= (l >> 4) << (2 * (j / 4))
		}
		putF16(b[:], 108, 1/iscale)
	} else {
		putF16(b[:], 108, 0)
	}
	d := f16At(b[:], 108)
	for j := range 16 {
		requantSigned(x[16*j:16*j+16], L[16*j:16*j+16], d*float32(int8(q3kScale(j, sc))), 4)
	}
	// The third bit of value j goes to bit j/32 of hmask[j%32].
	var U [qkK]uint8
	hmask := (*[32]byte)(b[0:])
	clear(hmask[:])
	for j, l := range L {
		u := uint8(l)
		if u > 3 {
			hmask[j%32] |= 1 << (j / 32)
			u -= 4
		}
		U[j] = u
	}
	packQ2Levels(&U, (*[64]byte)(b[32:]))
}

// packScalesK4 stores eight 6-bit scales and mins in the 12-byte layout
// that scaleMinK4 reads (Q4_K and Q5_K).
func packScalesK4(ls, lm *[8]uint8, s *[12]byte) {
	for j := range 8 {
		if j < 4 {
			s[j] = ls[j]
			s[j+4] = lm[j]
		} else {
			s[j+4] = ls[j]&0xf | lm[j]<<4
			s[j-4] |= ls[j] >> 4 << 6
			s[j] |= lm[j] >> 4 << 6
		}
	}
}

// quantQ5K follows ggml's quantize_row_q5_K_ref, Q4_K's method with 5-bit
// values and a search of 16 level spacings around 31/(max−min).
func quantQ5K(x *[qkK]float32, b *[q5KSz]byte) {
	var L [qkK]uint8
	scales, mins, maxScale, maxM := fitK4(x, 31, -0.5, 15, &L)
	invScale, invMin := inv63(maxScale), inv63(maxM)
	var ls, lm [8]uint8
	for j := range 8 {
		// uint8 first, then MIN(63, ·), as ggml stores them.
		ls[j] = min(uint8(nearestInt(invScale*scales[j])), 63)
		lm[j] = min(uint8(nearestInt(invMin*mins[j])), 63)
	}
	putScalesK4(x, &L, &ls, &lm, maxScale, maxM, b[:], (*[12]byte)(b[4:16]), 31)
	qh := (*[32]byte)(b[16:48])
	clear(qh[:])
	for c := range 4 {
		for l := range 32 {
			l1, l2 := L[64*c+l], L[64*c+32+l]
			if l1 > 15 {
				l1 -= 16
				qh[l] |= 1 << (2 * c)
			}
			if l2 > 15 {
				l2 -= 16
				qh[l] |= 2 << (2 * c)
			}
			b[48+32*c+l] = l1 | l2<<4
		}
	}
}

// quantIQ4XS follows ggml's quantize_row_iq4_xs_ref (quantize_iq4_xs with
// no importance weights): per 32-value sub-block, the x²-weighted best of
// 16 scales around max/127 against the 16 non-linear levels; then the
// scales as 6 bits against the largest and every value requantized against
// its stored scale.
func quantIQ4XS(x *[qkK]float32, b *[iq4XSSz]byte) {
	var (
		L      [qkK]uint8
		scales [8]float32
	)
	for ib := range 8 {
		scales[ib] = iq4Scale((*[qk]float32)(x[32*ib:]))
	}
	_, maxScale := absMax(scales[:])
	d := -maxScale / 32
	putF16(b[:], 0, d)
	id := inv(d)
	var h uint16
	clear(b[4:8])
	for ib := range 8 {
		l := min(max(nearestInt(id*scales[ib]), -32), 31)
		idl := inv(d * float32(l))
		for i := 32 * ib; i < 32*ib+32; i++ {
			L[i] = bestIQ4(idl * x[i])
		}
		l += 32
		b[4+ib/2] |= byte(l&0xf) << (4 * (ib % 2))
		h |= uint16(l>>4) << (2 * ib)
	}
	binary.LittleEndian.PutUint16(b[2:], h)
	for s := range 8 {
		for j := range 16 {
			b[8+16*s+j] = L[32*s+j] | L[32*s+16+j]<<4
		}
	}
}
