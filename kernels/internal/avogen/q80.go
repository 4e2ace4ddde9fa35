package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// Block sizes in bytes.
const (
	q80Bytes = 34  // f16 d, 32 × int8
	q40Bytes = 18  // f16 d, 16 bytes of nibbles
	q8KBytes = 292 // f32 d, 256 × int8, 16 × int16 bsums
	q4KBytes = 144 // f16 d, f16 dmin, 12 bytes scales, 128 bytes nibbles
	q6KBytes = 210 // 128 ql, 64 qh, 16 int8 scales, f16 d
)

// q80Tiles lists the rows × tokens tiles for the 32-value block types.
func q80Tiles(s isa) [][2]int {
	rg := 2 // AVX2: 8 accumulators + 2 rows of weights + 5 temporaries
	if s.evex {
		rg = 4
	}
	var ts [][2]int
	for r := 1; r <= 4; r++ {
		ts = append(ts, [2]int{r, 1})
	}
	for r := 1; r <= rg; r++ {
		for t := 2; t <= 4; t++ {
			ts = append(ts, [2]int{r, t})
		}
	}
	return ts
}

func genQ80Kernels(s isa) {
	tile := q80Tile
	if s.evex {
		tile = q80TileZ
	}
	for _, q4 := range []bool{false, true} {
		tile(s, q4, 1, 1, true)
		for _, rt := range q80Tiles(s) {
			tile(s, q4, rt[0], rt[1], false)
		}
	}
}

// q80Tile emits the AVX2 R×T tile of Q8_0·Q8_0 (or, with q4, Q4_0·Q8_0)
// block dot products. Per block the integer dot product is exact; it is
// converted to float32 and multiplied by both block scales, and the
// products are summed in float32 vector lanes.
//
// vpmaddubsw wants one unsigned operand: Q8_0 weights are made unsigned by
// moving their sign onto the activations (vpsignb), Q4_0 nibbles are
// unsigned already and the offset of 8 is taken off afterwards as 8·Σx.
// The weight scales go to the stack, for lack of registers.
func q80Tile(s isa, q4 bool, R, T int, ret bool) {
	kind, wb := "Q8_0", q80Bytes
	if q4 {
		kind, wb = "Q4_0", q40Bytes
	}
	name := begin(s, kind, R, T, ret, "byte", "nb", 32*R, true)
	q80Doc(name, kind, wb, R, T, ret)
	wp, xp, nb, acc := tileArgs(s, R, T, YMM)
	if T == 1 {
		q80Vec(s, q4, wb, wp, xp[0], nb, acc)
		finish(s, acc, ret)
		return
	}
	dws := AllocLocal(32 * R)
	TESTQ(nb, nb)
	JZ(LabelRef("done"))
	Label("block")
	wv := make([]VecVirtual, R) // Q8_0: |w|; Q4_0: the nibbles
	for r := 0; r < R; r++ {
		wv[r] = q80Weights(q4, Mem{Base: wp[r], Disp: 2})
		d := YMM()
		s.f16Bcast(Mem{Base: wp[r]}, d)
		VMOVUPS(d, dws.Offset(32*r))
	}
	for t := 0; t < T; t++ {
		xv := YMM()
		VMOVDQU(Mem{Base: xp[t], Disp: 2}, xv)
		dx := YMM()
		s.f16Bcast(Mem{Base: xp[t]}, dx)
		corr := q80Corr(q4, xv)
		for r := 0; r < R; r++ {
			p := q80Dot(q4, Mem{Base: wp[r], Disp: 2}, wv[r], xv, corr)
			VCVTDQ2PS(p, p)
			d := YMM()
			VMULPS(dws.Offset(32*r), dx, d)
			VFMADD231PS(p, d, acc[r][t])
		}
	}
	advancePtrs(wp, xp, wb, q80Bytes)
	DECQ(nb)
	JNZ(LabelRef("block"))

	Label("done")
	finish(s, acc, ret)
}

// q80Weights loads the 32 weights of the block whose values are at m, in
// the form vpmaddubsw multiplies: |w| for Q8_0 (the signs move onto the
// activations), and for Q4_0 the nibbles, low ones (values 0–15) in lane
// 0 and high ones in lane 1.
func q80Weights(q4 bool, m Mem) VecVirtual {
	w := YMM()
	if !q4 {
		VPABSB(m, w)
		return w
	}
	t := YMM()
	VBROADCASTI128(m, t)
	t2 := YMM()
	VPSRLW(U8(4), t, t2)
	VINSERTI128(U8(1), t2.AsX(), t, w)
	VPAND(c0F, w, w)
	return w
}

// q80Corr returns, for Q4_0, the offset of its unsigned nibbles that each
// product must lose, 8·(Σ of each 4 activations of xv); nil for Q8_0.
func q80Corr(q4 bool, xv VecVirtual) VecVirtual {
	if !q4 {
		return nil
	}
	corr := YMM()
	VMOVDQU(c01b, corr)
	VPMADDUBSW(xv, corr, corr)
	VPMADDWD(c01w, corr, corr)
	VPSLLD(U8(3), corr, corr)
	return corr
}

// q80Dot returns the exact integer dot products of a weight block (wv from
// q80Weights of m) with activations xv, as eight int32 partial sums.
func q80Dot(q4 bool, m Mem, wv, xv, corr VecVirtual) VecVirtual {
	p := YMM()
	if q4 {
		VPMADDUBSW(xv, wv, p)
		VPMADDWD(c01w, p, p)
		VPSUBD(corr, p, p)
		return p
	}
	VPSIGNB(m, xv, p)
	VPMADDUBSW(p, wv, p)
	VPMADDWD(c01w, p, p)
	return p
}

// q80Vec emits the block loop of a one-token tile. A decoding step reads
// every weight once, straight from memory, so this loop is shaped for
// streaming: two blocks per iteration with one prefetch per row (a cache
// line is about two Q8_0 blocks), and the scales kept in registers rather
// than spilled. Each block is added to the row's accumulator in the same
// order as in the wider tiles, so results do not depend on the tile.
func q80Vec(s isa, q4 bool, wb int, wp []GPVirtual, xp GPVirtual, nb Register, acc [][]VecVirtual) {
	step := func(k int) {
		xv := YMM()
		VMOVDQU(Mem{Base: xp, Disp: 2 + k*q80Bytes}, xv)
		dx := YMM()
		s.f16Bcast(Mem{Base: xp, Disp: k * q80Bytes}, dx)
		corr := q80Corr(q4, xv)
		for r := range wp {
			m := Mem{Base: wp[r], Disp: k*wb + 2}
			p := q80Dot(q4, m, q80Weights(q4, m), xv, corr)
			VCVTDQ2PS(p, p)
			d := YMM()
			s.f16Bcast(Mem{Base: wp[r], Disp: k * wb}, d)
			VMULPS(d, dx, d)
			VFMADD231PS(p, d, acc[r][0])
		}
	}
	pairLoop(nb, func() {
		prefetch(wp, nil, 0, 0, 1)
		step(0)
		step(1)
		advancePtrs(wp, []GPVirtual{xp}, 2*wb, 2*q80Bytes)
	}, func() { step(0) })
}

func q80Doc(name, kind string, wb, R, T int, ret bool) {
	wval := "int8(wq[2+j])"
	notes := []string{"where f16 reads a little-endian binary16 value."}
	if kind == "Q4_0" {
		wval = "nibble(wq, j) - 8"
		notes = []string{
			"where f16 reads a little-endian binary16 value and nibble(wq, j) is the",
			"low nibble of wq[2+j] for j < 16 and the high nibble of wq[2+j-16]",
			"otherwise.",
		}
	}
	body := []string{
		"\t\t\tvar sum float32",
		"\t\t\tfor b := 0; b < nb; b++ {",
		fmt.Sprintf("\t\t\t\twq, xq := w[r*ws+%d*b:], x[t*xs+34*b:]", wb),
		"\t\t\t\tvar dot int32",
		"\t\t\t\tfor j := 0; j < 32; j++ {",
		fmt.Sprintf("\t\t\t\t\tdot += int32(%s) * int32(int8(xq[2+j]))", wval),
		"\t\t\t\t}",
		"\t\t\t\tsum += float32(dot) * (f16(wq) * f16(xq))",
		"\t\t\t}",
	}
	notes = append(notes,
		"Activations must lie in −127..127, as QuantizeQ8_0 writes them. The",
		"integer sums are exact; the float additions happen in vector lanes.")
	kernelDoc(name, kind+" weights with Q8_0 activations", R, T, ret, body, notes...)
}

// q80TileZ is q80Tile for AVX-512: each zmm register holds two blocks (32
// int8 values each), so every vpdpbusd does 64 multiply-adds. Both weight
// types are made unsigned (Q8_0 by adding 128, Q4_0 nibbles as stored) and
// each integer sum starts at −bias·Σx. Lanes 0–7 of a product belong to the
// first block and lanes 8–15 to the second, and the scale vectors match.
// An odd last block is processed as a pair with itself, its twin's scales
// set to zero.
func q80TileZ(s isa, q4 bool, R, T int, ret bool) {
	kind, wb := "Q8_0", q80Bytes
	if q4 {
		kind, wb = "Q4_0", q40Bytes
	}
	name := begin(s, kind, R, T, ret, "byte", "nb", 0, true)
	q80Doc(name, kind, wb, R, T, ret)
	wp, xp, nb, acc := tileArgs(s, R, T, ZMM)
	ones := ZMM()
	VMOVDQU32(c01b, ones)
	var hiLanes Op
	if q4 {
		hiLanes = hiNibbleLanes()
	}
	body := func(tail bool) {
		if T == 1 {
			prefetch(wp, nil, 0, 0, 2*wb)
		}
		wv, dw := make([]VecVirtual, R), make([]VecVirtual, R)
		for r := 0; r < R; r++ {
			if q4 {
				wv[r] = nibblesZ(Mem{Base: wp[r], Disp: 2}, wb, tail, hiLanes)
			} else {
				wv[r] = ZMM()
				VBROADCASTI64X4(Mem{Base: wp[r], Disp: 2}, wv[r])
				if !tail {
					VINSERTI64X4(U8(1), Mem{Base: wp[r], Disp: 2 + wb}, wv[r], wv[r])
				}
				VPXORD(c80, wv[r], wv[r])
			}
			dw[r] = halvesZ(Mem{Base: wp[r]}, wb, tail)
		}
		for t := 0; t < T; t++ {
			xv := ZMM()
			VBROADCASTI64X4(Mem{Base: xp[t], Disp: 2}, xv)
			if !tail {
				VINSERTI64X4(U8(1), Mem{Base: xp[t], Disp: 2 + q80Bytes}, xv, xv)
			}
			dx := halvesZ(Mem{Base: xp[t]}, q80Bytes, tail)
			init := biasInitZ(s, xv, ones, map[bool]int{true: 3, false: 7}[q4])
			for r := 0; r < R; r++ {
				p := ZMM()
				VMOVDQA32(init, p)
				VPDPBUSD(xv, wv[r], p)
				VCVTDQ2PS(p, p)
				d := ZMM()
				VMULPS(dw[r], dx, d)
				VFMADD231PS(p, d, acc[r][t])
			}
		}
	}
	pairLoopZ(wp, xp, nb, wb, q80Bytes, body)
	finish(s, acc, ret)
}

// The pieces of the AVX-512 tiles of the 32-value block types (q80TileZ,
// legacyTileZ), which hold two blocks per zmm register.

// hiNibbleLanes returns a mask of quadwords 2–3 and 6–7: the 128-bit lanes
// of nibblesZ's register that take the high nibbles.
func hiNibbleLanes() Op {
	k := K()
	m := GP32()
	MOVL(U32(0xcc), m)
	KMOVW(m, k)
	return k
}

// nibblesZ loads the 16 nibble bytes of two blocks at m and m+stride (with
// tail, of one block twice) and returns their 64 4-bit values as bytes:
// [qA qA qB qB] → [qA&15, qA>>4, qB&15, qB>>4], the values of block A in
// order, then those of block B. hiLanes is hiNibbleLanes' mask.
func nibblesZ(m Mem, stride int, tail bool, hiLanes Op) VecVirtual {
	t := ZMM()
	VBROADCASTI32X4(m, t)
	if !tail {
		VINSERTI32X4(U8(2), m.Offset(stride), t, t)
		VINSERTI32X4(U8(3), m.Offset(stride), t, t)
	}
	sh := ZMM()
	VPSRLW(U8(4), t, sh)
	VPBLENDMQ(sh, t, hiLanes, t)
	VPANDD(c0F, t, t)
	return t
}

// biasInitZ returns the starting integer sums −2^shift·(Σ of each 4
// activations of xv), which take off the bias 2^shift of unsigned weight
// levels; ones holds bytes of 1.
func biasInitZ(s isa, xv, ones VecVirtual, shift int) VecVirtual {
	sx := ZMM()
	s.zero(sx)
	VPDPBUSD(xv, ones, sx)
	VPSLLD(U8(shift), sx, sx)
	init := ZMM()
	s.zero(init)
	VPSUBD(sx, init, init)
	return init
}

// pairLoopZ emits the block loop of the AVX-512 tiles: body(false) for
// each pair of blocks, then body(true) for an odd last block, moving the
// row pointers wp by weight blocks of wb bytes and the token pointers xp by
// activation blocks of xb bytes.
func pairLoopZ(wp, xp []GPVirtual, nb Register, wb, xb int, body func(tail bool)) {
	pairLoop(nb, func() {
		body(false)
		advancePtrs(wp, xp, 2*wb, 2*xb)
	}, func() { body(true) })
}
