package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// kTiles lists the rows × tokens tiles for the 256-value K-quant types. A
// K-quant row needs an integer and a float accumulator per token plus four
// registers of unpacked weights, so one row fits with up to four tokens.
// Matrix-vector products use the 1×1 tile: with rows of a few kilobytes,
// streaming two rows at once measured slower.
//
// Q4_K and Q6_K have AVX2 kernels only, which the AVX-512 implementation
// uses as well (Q2_K, Q3_K, Q5_K and IQ4_XS have AVX-512 variants: see
// kquant2.go). AVX-512 versions (64 values per vpdpbusd, the sub-block
// scales applied by a vpmaddwd) measured no faster and often slower on
// Sapphire Rapids: 512-bit integer multiplies issue on one port there, so
// they do no more multiply-adds per cycle than two 256-bit ones, and the
// scales cost a second multiply either way.
var kTiles = [][2]int{{1, 1}, {1, 2}, {1, 3}, {1, 4}}

func genQ4KKernels(s isa) { genKTiles(s, q4kTile) }
func genQ6KKernels(s isa) { genKTiles(s, q6kTile) }

// genKTiles emits a K-quant's dot product and its kTiles product tiles,
// for AVX2 only.
func genKTiles(s isa, tile func(s isa, R, T int, ret bool)) {
	if s.evex {
		return
	}
	tile(s, 1, 1, true)
	for _, rt := range kTiles {
		tile(s, rt[0], rt[1], false)
	}
}

func kDoc(name, kind string, R, T int, ret bool, wb int, body ...string) {
	lines := []string{
		"\t\t\tvar sum float32",
		"\t\t\tfor b := 0; b < nb; b++ {",
		fmt.Sprintf("\t\t\t\twq, xq := w[r*ws+%d*b:], x[t*xs+292*b:]", wb),
	}
	lines = append(lines, body...)
	lines = append(lines, "\t\t\t}")
	notes := []string{"where f16 and f32 read little-endian binary16 and float32 values,"}
	if kind == "Q4_K" {
		notes = append(notes,
			"scaleMinK4(j, s) unpacks the 6-bit scale and min of sub-block j as",
			"ggml's get_scale_min_k4 does, nibble4K(qs, i) is the low nibble of",
			"qs[32*(i/64) + i%32] if i%64 < 32 and its high nibble otherwise, and",
			"bsum(xq, g) is the int16 at xq[260+2*g:] (the sum of values 16g..16g+15).")
	} else {
		notes = append(notes,
			"and six6K(wq, i) is the 6-bit value i: its low four bits from ql",
			"(wq[0:128]) and its top two from qh (wq[128:192]), laid out as in",
			"ggml's dequantize_row_q6_K.")
	}
	notes = append(notes, "The integer sums are exact; the float additions happen in vector lanes.")
	kernelDoc(name, kind+" weights with Q8_K activations", R, T, ret, lines, notes...)
}

// q4kScales unpacks the twelve 6-bit scale/min bytes of the Q4_K block at
// base into two 64-bit registers: sc holds scales 0–7 and m mins 0–7, one
// byte each.
func q4kScales(base Register) (sc, m GPVirtual) {
	u0, u1, u2 := GP32(), GP32(), GP32()
	MOVL(Mem{Base: base, Disp: 4}, u0)
	MOVL(Mem{Base: base, Disp: 8}, u1)
	MOVL(Mem{Base: base, Disp: 12}, u2)
	// Scales 4–7: low nibbles of bytes 8–11, top bits from bytes 0–3.
	a := GP32()
	MOVL(u0, a)
	SHRL(U8(6), a)
	ANDL(U32(0x03030303), a)
	SHLL(U8(4), a)
	hiSc := GP32()
	MOVL(u2, hiSc)
	ANDL(U32(0x0f0f0f0f), hiSc)
	ORL(a, hiSc)
	ANDL(U32(0x3f3f3f3f), u0)
	// Mins 4–7: high nibbles of bytes 8–11, top bits from bytes 4–7.
	b := GP32()
	MOVL(u1, b)
	SHRL(U8(6), b)
	ANDL(U32(0x03030303), b)
	SHLL(U8(4), b)
	SHRL(U8(4), u2)
	ANDL(U32(0x0f0f0f0f), u2)
	ORL(b, u2)
	ANDL(U32(0x3f3f3f3f), u1)
	// 32-bit operations zero the upper halves, so OR-ing is enough.
	sc, m = hiSc.As64().(GPVirtual), u2.As64().(GPVirtual)
	SHLQ(U8(32), sc)
	ORQ(u0.As64(), sc)
	SHLQ(U8(32), m)
	ORQ(u1.As64(), m)
	return sc, m
}

// q4kTile emits a Q4_K·Q8_K tile. Per block and row the integer sums are
//
//	isum = Σ_j sc_j · Σ_{i in sub-block j} q_i·x_i
//	msum = Σ_j m_j · (bsums[2j] + bsums[2j+1])
//
// and the block adds f16(d)·xd·isum − f16(dmin)·xd·msum.
func q4kTile(s isa, R, T int, ret bool) {
	name := begin(s, "Q4_K", R, T, ret, "byte", "nb", 64*R, true)
	kDoc(name, "Q4_K", R, T, ret, q4KBytes,
		"\t\t\t\tvar isum, msum int32",
		"\t\t\t\tfor j := 0; j < 8; j++ { // 32-value sub-blocks",
		"\t\t\t\t\tsc, m := scaleMinK4(j, wq[4:16])",
		"\t\t\t\t\tvar dot int32",
		"\t\t\t\t\tfor i := 32 * j; i < 32*j+32; i++ {",
		"\t\t\t\t\t\tdot += int32(nibble4K(wq[16:], i)) * int32(int8(xq[4+i]))",
		"\t\t\t\t\t}",
		"\t\t\t\t\tisum += int32(sc) * dot",
		"\t\t\t\t\tmsum += int32(m) * (int32(bsum(xq, 2*j)) + int32(bsum(xq, 2*j+1)))",
		"\t\t\t\t}",
		"\t\t\t\td := f32(xq[0:])",
		"\t\t\t\tsum += float32(isum)*(f16(wq[0:])*d) - float32(msum)*(f16(wq[2:])*d)",
	)
	// Per row: 8 scale words, 16 duplicated min words.
	kTileLoop(s, R, T, ret, q4KBytes, 64, func(s isa, wp, xp []GPVirtual, acc, isum [][]VecVirtual, stack Mem) {
		q4kBlock(s, wp, xp, acc, isum, stack, false)
	})
}

// kTileLoop emits the loop of a K-quant tile over its nb blocks: it loads
// the row and token pointers, gives each row stackPerRow bytes of stack,
// and per block prefetches (one token only), zeroes the integer sums isum
// and calls block, which adds the block's contribution to acc; then it
// moves every pointer one block on and ends as finish does.
func kTileLoop(s isa, R, T int, ret bool, wBytes, stackPerRow int, block func(s isa, wp, xp []GPVirtual, acc, isum [][]VecVirtual, stack Mem)) {
	wp, xp, nb, acc := tileArgs(s, R, T, YMM)
	stack := AllocLocal(stackPerRow * R)
	TESTQ(nb, nb)
	JZ(LabelRef("done"))
	Label("block")
	if T == 1 {
		prefetch(wp, nil, 0, 0, wBytes)
	}

	isum := make([][]VecVirtual, R)
	for r := range isum {
		isum[r] = make([]VecVirtual, T)
		for t := range isum[r] {
			isum[r][t] = YMM()
			s.zero(isum[r][t])
		}
	}
	block(s, wp, xp, acc, isum, stack)
	advancePtrs(wp, xp, wBytes, q8KBytes)
	DECQ(nb)
	JNZ(LabelRef("block"))

	Label("done")
	finish(s, acc, ret)
}

// q4kBlock adds one Q4_K block to acc; with five, a Q5_K block: the same
// header, the nibbles 32 bytes further on, after qh, and each value's
// fifth bit from qh (see q5kHigh).
func q4kBlock(s isa, wp, xp []GPVirtual, acc, isum [][]VecVirtual, stack Mem, five bool) {
	R, T := len(wp), len(xp)
	qsOff := 16
	qh := make([]VecVirtual, R)
	if five {
		qsOff = 48
		for r := range qh {
			qh[r] = YMM()
			VMOVDQU(Mem{Base: wp[r], Disp: 16}, qh[r])
		}
	}
	for r := 0; r < R; r++ {
		sc, m := q4kScales(wp[r])
		xs := XMM()
		VMOVQ(sc, xs)
		VPMOVZXBW(xs, xs)
		VMOVDQU(xs, stack.Offset(64*r))
		xm := XMM()
		VMOVQ(m, xm)
		VPUNPCKLBW(xm, xm, xm)
		ym := YMM()
		VPMOVZXBW(xm, ym)
		VMOVDQU(ym, stack.Offset(64*r+32))
	}
	for c := 0; c < 4; c++ {
		lo, hi := make([]VecVirtual, R), make([]VecVirtual, R)
		sl, sh := make([]VecVirtual, R), make([]VecVirtual, R)
		for r := 0; r < R; r++ {
			lo[r], hi[r] = YMM(), YMM()
			VMOVDQU(Mem{Base: wp[r], Disp: qsOff + 32*c}, hi[r])
			VPAND(c0F, hi[r], lo[r])
			VPSRLW(U8(4), hi[r], hi[r])
			VPAND(c0F, hi[r], hi[r])
			if five {
				q5kHigh(qh[r], 2*c, lo[r])
				q5kHigh(qh[r], 2*c+1, hi[r])
			}
			sl[r], sh[r] = YMM(), YMM()
			VPBROADCASTW(stack.Offset(64*r+4*c), sl[r])
			VPBROADCASTW(stack.Offset(64*r+4*c+2), sh[r])
		}
		for t := 0; t < T; t++ {
			for r := 0; r < R; r++ {
				p := YMM()
				VPMADDUBSW(Mem{Base: xp[t], Disp: 4 + 64*c}, lo[r], p)
				scaleAdd(s, sl[r], p, isum[r][t])
				q := YMM()
				VPMADDUBSW(Mem{Base: xp[t], Disp: 4 + 64*c + 32}, hi[r], q)
				scaleAdd(s, sh[r], q, isum[r][t])
			}
		}
	}
	for r := 0; r < R; r++ {
		dw, dm := YMM(), YMM()
		s.f16Bcast(Mem{Base: wp[r]}, dw)
		s.f16Bcast(Mem{Base: wp[r], Disp: 2}, dm)
		for t := 0; t < T; t++ {
			dy := YMM()
			VBROADCASTSS(Mem{Base: xp[t]}, dy)
			d := YMM()
			VMULPS(dy, dw, d)
			VCVTDQ2PS(isum[r][t], isum[r][t])
			VFMADD231PS(isum[r][t], d, acc[r][t])
			mv := YMM()
			VMOVDQU(Mem{Base: xp[t], Disp: 260}, mv)
			VPMADDWD(stack.Offset(64*r+32), mv, mv)
			VCVTDQ2PS(mv, mv)
			VMULPS(dy, dm, dy)
			VFNMADD231PS(mv, dy, acc[r][t])
		}
	}
}

// q6kTile emits a Q6_K·Q8_K tile. The 6-bit values q are unsigned (0..63)
// and stand for q−32, so per block and row
//
//	isum = Σ_j sc_j · (Σ_{i in sub-block j} q_i·x_i − 32·bsums[j])
//
// and the block adds f16(d)·xd·isum.
func q6kTile(s isa, R, T int, ret bool) {
	name := begin(s, "Q6_K", R, T, ret, "byte", "nb", 288*R, true)
	kDoc(name, "Q6_K", R, T, ret, q6KBytes,
		"\t\t\t\tvar isum int32",
		"\t\t\t\tfor j := 0; j < 16; j++ { // 16-value sub-blocks",
		"\t\t\t\t\tvar dot int32",
		"\t\t\t\t\tfor i := 16 * j; i < 16*j+16; i++ {",
		"\t\t\t\t\t\tdot += (int32(six6K(wq, i)) - 32) * int32(int8(xq[4+i]))",
		"\t\t\t\t\t}",
		"\t\t\t\t\tisum += int32(int8(wq[192+j])) * dot",
		"\t\t\t\t}",
		"\t\t\t\tsum += float32(isum) * (f16(wq[208:]) * f32(xq[0:]))",
	)
	// Per row: the 16 scales as words (32 bytes) and eight vectors of two
	// broadcast scales (256 bytes).
	kTileLoop(s, R, T, ret, q6KBytes, 288, func(s isa, wp, xp []GPVirtual, acc, isum [][]VecVirtual, stack Mem) {
		q6kBlock(s, wp, xp, isum, stack)
		// 32·Σ_j sc_j·bsums[j] off: the offset of the 6-bit values.
		kOffsetAcc(s, wp, xp, acc, isum, func(r int) Mem { return stack.Offset(288 * r) }, 5, 208)
	})
}

// kOffsetAcc ends a block of a K-quant type whose unsigned levels stand for
// level − 2^shift (Q3_K, Q6_K): per row r and token t it takes
// 2^shift·Σ_j sc_j·bsums[j] off isum[r][t] (a vpmaddwd of the row's sixteen
// scale words at scales(r) with the block's bsums), then adds isum[r][t]
// times f16(d)·xd to acc[r][t], d being the binary16 at byte dOff of the
// weight block and xd the activations' float32 scale.
func kOffsetAcc(s isa, wp, xp []GPVirtual, acc, isum [][]VecVirtual, scales func(r int) Mem, shift, dOff int) {
	for r := range wp {
		dw := YMM()
		s.f16Bcast(Mem{Base: wp[r], Disp: dOff}, dw)
		for t := range xp {
			c := YMM()
			VMOVDQU(Mem{Base: xp[t], Disp: 260}, c)
			VPMADDWD(scales(r), c, c)
			VPSLLD(U8(shift), c, c)
			VPSUBD(c, isum[r][t], isum[r][t])
			d := YMM()
			VBROADCASTSS(Mem{Base: xp[t]}, d)
			VMULPS(dw, d, d)
			VCVTDQ2PS(isum[r][t], isum[r][t])
			VFMADD231PS(isum[r][t], d, acc[r][t])
		}
	}
}

// scalePairs stores at dst, dst+32, …, dst+224 the eight vectors
// P_i = [sc_2i ×8 | sc_2i+1 ×8] of int16 words, for vpmaddwd to scale the
// pair sums of two 16-value sub-blocks at once, from the sixteen words v
// with the even-numbered scales in its low lane and the odd ones in its
// high lane: an unpack ladder that doubles each word three times.
func scalePairs(v VecVirtual, dst Mem) {
	lw, hw := YMM(), YMM()
	VPUNPCKLWD(v, v, lw)
	VPUNPCKHWD(v, v, hw)
	for i, src := range []VecVirtual{lw, hw} {
		a, b := YMM(), YMM()
		VPUNPCKLDQ(src, src, a)
		VPUNPCKHDQ(src, src, b)
		for j, d := range []VecVirtual{a, b} {
			p0, p1 := YMM(), YMM()
			VPUNPCKLQDQ(d, d, p0)
			VPUNPCKHQDQ(d, d, p1)
			k := 4*i + 2*j
			VMOVDQU(p0, dst.Offset(32*k))
			VMOVDQU(p1, dst.Offset(32*(k+1)))
		}
	}
}

// q6kBlockAVX2 accumulates Σ_j sc_j·Σ q·x (without the −32 offset) for one
// block. Values l, l+32, l+64, l+96 of each 128-value half take the low
// nibble of ql[l], the low nibble of ql[l+32], the high nibble of ql[l]
// and the high nibble of ql[l+32], with bit pairs 0–1, 2–3, 4–5, 6–7 of
// qh[l] on top.
func q6kBlock(s isa, wp, xp []GPVirtual, isum [][]VecVirtual, stack Mem) {
	R, T := len(wp), len(xp)
	for r := 0; r < R; r++ {
		base := stack.Offset(288 * r)
		// Natural order, sign-extended to words, for the offset term.
		sw := YMM()
		VPMOVSXBW(Mem{Base: wp[r], Disp: 192}, sw)
		VMOVDQU(sw, base)
		// Even scales in the low lane, odd in the high lane; the unpack
		// ladder then yields P_i = [sc_2i ×8 | sc_2i+1 ×8].
		x := XMM()
		VMOVDQU(Mem{Base: wp[r], Disp: 192}, x)
		VPSHUFB(cEvOdd, x, x)
		v := YMM()
		VPMOVSXBW(x, v)
		scalePairs(v, base.Offset(32))
	}
	for h := 0; h < 2; h++ {
		qs := make([][4]VecVirtual, R)
		for r := 0; r < R; r++ {
			qlA, qlB, qh := YMM(), YMM(), YMM()
			VMOVDQU(Mem{Base: wp[r], Disp: 64 * h}, qlA)
			VMOVDQU(Mem{Base: wp[r], Disp: 64*h + 32}, qlB)
			VMOVDQU(Mem{Base: wp[r], Disp: 128 + 32*h}, qh)
			for k := range qs[r] {
				qs[r][k] = YMM()
			}
			tmp := YMM()
			// q1 = ql[l]&15 | (qh&3)<<4
			VPAND(c0F, qlA, qs[r][0])
			VPSLLW(U8(4), qh, tmp)
			VPAND(c30, tmp, tmp)
			VPOR(tmp, qs[r][0], qs[r][0])
			// q2 = ql[l+32]&15 | (qh>>2&3)<<4
			VPAND(c0F, qlB, qs[r][1])
			VPSLLW(U8(2), qh, tmp)
			VPAND(c30, tmp, tmp)
			VPOR(tmp, qs[r][1], qs[r][1])
			// q3 = ql[l]>>4 | (qh>>4&3)<<4
			VPSRLW(U8(4), qlA, qlA)
			VPAND(c0F, qlA, qs[r][2])
			VPAND(c30, qh, tmp)
			VPOR(tmp, qs[r][2], qs[r][2])
			// q4 = ql[l+32]>>4 | (qh>>6)<<4
			VPSRLW(U8(4), qlB, qlB)
			VPAND(c0F, qlB, qs[r][3])
			VPSRLW(U8(2), qh, qh)
			VPAND(c30, qh, qh)
			VPOR(qh, qs[r][3], qs[r][3])
		}
		for t := 0; t < T; t++ {
			for r := 0; r < R; r++ {
				for k := 0; k < 4; k++ {
					p := YMM()
					VPMADDUBSW(Mem{Base: xp[t], Disp: 4 + 128*h + 32*k}, qs[r][k], p)
					VPMADDWD(stack.Offset(288*r+32+32*(4*h+k)), p, p)
					VPADDD(p, isum[r][t], isum[r][t])
				}
			}
		}
	}
}
