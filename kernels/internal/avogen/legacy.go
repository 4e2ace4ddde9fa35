package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// legacyKind describes one of the 32-value weight types beside Q8_0 and
// Q4_0 (Q4_1, Q5_0, Q5_1, IQ4_NL): where its block keeps what, and how its
// levels enter the integer dot product. Value i of a block is the low
// nibble of qs[i] (i < 16) or the high nibble of qs[i−16], with, for the
// 5-bit types, bit i of the 32-bit qh on top.
type legacyKind struct {
	name  string
	wb    int // weight block bytes
	mOff  int // offset of the binary16 offset m, or −1
	qhOff int // offset of the fifth bits, or −1
	qsOff int
	xb    int  // activation block bytes: 36 for Q8_1 (d, s, qs), 34 for Q8_0
	bias  int  // subtracted from the unsigned levels (Q5_0: 16)
	nl    bool // IQ4_NL: the nibble indexes the signed grid
}

var legacyKinds = []legacyKind{
	{name: "Q4_1", wb: 20, mOff: 2, qhOff: -1, qsOff: 4, xb: 36},
	{name: "Q5_0", wb: 22, mOff: -1, qhOff: 2, qsOff: 6, xb: 34, bias: 16},
	{name: "Q5_1", wb: 24, mOff: 2, qhOff: 4, qsOff: 8, xb: 36},
	{name: "IQ4_NL", wb: 18, mOff: -1, qhOff: -1, qsOff: 2, xb: 34, nl: true},
}

// iq4nlGrid is ggml's kvalues_iq4nl, the 16 levels of IQ4_NL.
var iq4nlGrid = [16]int8{-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113}

// Constants of the legacy kernels.
var (
	cIQ4    Mem // the IQ4_NL grid as bytes, repeated in every 16-byte lane
	cQhShuf Mem // byte i ← byte i/8 of a broadcast dword (ymm: per lane)
	cBitSel Mem // byte i: 1 << (i mod 8)
	c10     Mem // bytes 0x10
	cE0     Mem // float32 1 in lane 0 (and lane 8), 0 elsewhere
)

func genLegacyConstants() {
	if cIQ4.Symbol.Name != "" {
		return
	}
	cIQ4 = bytesConst("vec_cIQ4", 64, func(i int) byte { return byte(iq4nlGrid[i%16]) })
	cQhShuf = bytesConst("vec_cQhShuf", 64, func(i int) byte { return byte(i % 32 / 8) })
	cBitSel = bytesConst("vec_cBitSel", 64, func(i int) byte { return 1 << (i % 8) })
	c10 = bytesConst("vec_c10", 64, func(int) byte { return 0x10 })
	cE0 = dwordsConst("vec_cE0", []uint32{0x3f800000, 0, 0, 0, 0, 0, 0, 0, 0x3f800000, 0, 0, 0, 0, 0, 0, 0})
}

func genLegacyKernels(s isa) {
	genLegacyConstants()
	tile := legacyTile
	if s.evex {
		tile = legacyTileZ
	} else {
		quantQ81()
	}
	for _, k := range legacyKinds {
		tile(s, k, 1, 1, true)
		for _, rt := range legacyTiles(s, k) {
			tile(s, k, rt[0], rt[1], false)
		}
	}
}

// legacyTiles lists the rows × tokens tiles: those of Q8_0.
func legacyTiles(s isa, k legacyKind) [][2]int {
	var ts [][2]int
	for _, rt := range q80Tiles(s) {
		ts = append(ts, rt)
	}
	return ts
}

// legacyWeights loads the 32 levels of the weight block at base (value i
// in byte i) in the form vpmaddubsw multiplies: unsigned levels (0..15 or
// 0..31), or for IQ4_NL the absolute grid values, with the signed values
// returned as well (for vpsignb of the activations).
func legacyWeights(k legacyKind, base Register, disp int) (w, signed VecVirtual) {
	t := YMM()
	VBROADCASTI128(Mem{Base: base, Disp: disp + k.qsOff}, t)
	t2 := YMM()
	VPSRLW(U8(4), t, t2)
	w = YMM()
	VINSERTI128(U8(1), t2.AsX(), t, w)
	VPAND(c0F, w, w)
	if k.qhOff >= 0 {
		h := YMM()
		VPBROADCASTD(Mem{Base: base, Disp: disp + k.qhOff}, h)
		VPSHUFB(cQhShuf, h, h)
		VPAND(cBitSel, h, h)
		VPCMPEQB(cBitSel, h, h)
		VPAND(c10, h, h)
		VPOR(h, w, w)
	}
	if k.nl {
		signed = YMM()
		VMOVDQU(cIQ4, signed)
		VPSHUFB(w, signed, signed)
		VPABSB(signed, w)
	}
	return w, signed
}

// legacyDot returns the exact integer dot products of a weight block (from
// legacyWeights) with the activation values xv as eight int32 partial sums,
// the bias already taken off (corr, from legacyCorr).
func legacyDot(k legacyKind, w, signed, xv, corr VecVirtual) VecVirtual {
	p := YMM()
	if k.nl {
		VPSIGNB(signed, xv, p)
		VPMADDUBSW(p, w, p)
	} else {
		VPMADDUBSW(xv, w, p)
	}
	VPMADDWD(c01w, p, p)
	if corr != nil {
		VPSUBD(corr, p, p)
	}
	return p
}

// legacyCorr returns bias·(Σ of each 4 activations of xv), or nil.
func legacyCorr(k legacyKind, xv VecVirtual) VecVirtual {
	if k.bias == 0 {
		return nil
	}
	corr := YMM()
	VMOVDQU(c01b, corr)
	VPMADDUBSW(xv, corr, corr)
	VPMADDWD(c01w, corr, corr)
	VPSLLD(U8(4), corr, corr) // bias 16
	return corr
}

// legacyTile emits the AVX2 R×T tile (or, with ret, the dot product) of
// one legacy weight type with its activations. Per block the integer dot
// product is exact; it is converted to float32 and multiplied by both block
// scales, and the products are summed in float32 vector lanes. The offset's
// share m·s of Q4_1 and Q5_1 goes into lane 0 (a multiply by the constant
// [1, 0, …]). One-token tiles take two blocks per iteration with one
// prefetch per row; each block is added in the same order as in the wider
// tiles, so results do not depend on the tile.
func legacyTile(s isa, k legacyKind, R, T int, ret bool) {
	name := begin(s, k.name, R, T, ret, "byte", "nb", 64*R, true)
	legacyDoc(name, k, R, T, ret)
	wp, xp, nb, acc := tileArgs(s, R, T, YMM)
	xq := k.xb - 32
	hasM := k.mOff >= 0

	// step adds the products of block j (0 or 1) of the iteration. With
	// one token the weight scales stay in registers; otherwise they go to
	// the stack, for lack of registers.
	var dws Mem
	if T > 1 {
		dws = AllocLocal(64 * R)
	}
	step := func(j int) {
		wv, sv := make([]VecVirtual, R), make([]VecVirtual, R)
		for r := 0; r < R && T > 1; r++ {
			wv[r], sv[r] = legacyWeights(k, wp[r], j*k.wb)
			{
				d := YMM()
				s.f16Bcast(Mem{Base: wp[r], Disp: j * k.wb}, d)
				VMOVUPS(d, dws.Offset(64*r))
				if hasM {
					m := YMM()
					s.f16Bcast(Mem{Base: wp[r], Disp: j*k.wb + k.mOff}, m)
					VMOVUPS(m, dws.Offset(64*r+32))
				}
			}
		}
		for t := 0; t < T; t++ {
			xv := YMM()
			VMOVDQU(Mem{Base: xp[t], Disp: j*k.xb + xq}, xv)
			dx := YMM()
			s.f16Bcast(Mem{Base: xp[t], Disp: j * k.xb}, dx)
			var sx VecVirtual
			if hasM {
				sx = YMM()
				s.f16Bcast(Mem{Base: xp[t], Disp: j*k.xb + 2}, sx)
			}
			corr := legacyCorr(k, xv)
			for r := 0; r < R; r++ {
				w, sw := wv[r], sv[r]
				if T == 1 {
					w, sw = legacyWeights(k, wp[r], j*k.wb)
				}
				p := legacyDot(k, w, sw, xv, corr)
				VCVTDQ2PS(p, p)
				d := YMM()
				if T > 1 {
					VMULPS(dws.Offset(64*r), dx, d)
				} else {
					s.f16Bcast(Mem{Base: wp[r], Disp: j * k.wb}, d)
					VMULPS(d, dx, d)
				}
				VFMADD231PS(p, d, acc[r][t])
				if hasM {
					ms := YMM()
					if T > 1 {
						VMULPS(dws.Offset(64*r+32), sx, ms)
					} else {
						s.f16Bcast(Mem{Base: wp[r], Disp: j*k.wb + k.mOff}, ms)
						VMULPS(ms, sx, ms)
					}
					VFMADD231PS(cE0, ms, acc[r][t])
				}
			}
		}
	}
	pairLoop(nb, func() {
		if T == 1 {
			prefetch(wp, nil, 0, 0, 1)
		}
		step(0)
		step(1)
		advancePtrs(wp, xp, 2*k.wb, 2*k.xb)
	}, func() { step(0) })
	finish(s, acc, ret)
}

func legacyDoc(name string, k legacyKind, R, T int, ret bool) {
	act := "Q8_0"
	if k.xb == 36 {
		act = "Q8_1"
	}
	body := []string{
		"\t\t\tvar sum float32",
		"\t\t\tfor b := 0; b < nb; b++ {",
		fmt.Sprintf("\t\t\t\twq, xq := w[r*ws+%d*b:], x[t*xs+%d*b:]", k.wb, k.xb),
		"\t\t\t\tvar dot int32",
		"\t\t\t\tfor j := 0; j < 32; j++ {",
		fmt.Sprintf("\t\t\t\t\tdot += level(wq, j) * int32(int8(xq[%d+j]))", k.xb-32),
		"\t\t\t\t}",
		"\t\t\t\tsum += float32(dot) * (f16(wq) * f16(xq))",
	}
	if k.mOff >= 0 {
		body = append(body, fmt.Sprintf("\t\t\t\tsum += f16(wq[%d:]) * f16(xq[2:])", k.mOff))
	}
	body = append(body, "\t\t\t}")
	level := map[string]string{
		"Q4_1":   "nibble(wq[4:], j), in 0..15",
		"Q5_0":   "nibble(wq[6:], j) | bit(wq[2:], j)<<4 − 16, in −16..15",
		"Q5_1":   "nibble(wq[8:], j) | bit(wq[4:], j)<<4, in 0..31",
		"IQ4_NL": "iq4nl[nibble(wq[2:], j)], ggml's kvalues_iq4nl",
	}[k.name]
	notes := []string{
		"where f16 reads a little-endian binary16 value, nibble(qs, j) is the low",
		"nibble of qs[j] for j < 16 and the high nibble of qs[j-16] otherwise,",
		"bit(qh, j) is bit j of the little-endian uint32 at qh, and level(wq, j)",
		"is " + level + ".",
		"The integer sums are exact; the float additions happen in vector lanes.",
	}
	kernelDoc(name, k.name+" weights with "+act+" activations", R, T, ret, body, notes...)
}

// halvesZ loads the binary16 values at m and m+stride (the same field of
// two consecutive blocks; with tail, of one block and a zero) and returns
// them as float32 [v0 ×8, v1 ×8].
func halvesZ(m Mem, stride int, tail bool) VecVirtual {
	y := YMM()
	VPBROADCASTW(m, y)
	x1 := XMM()
	if tail {
		VMOVDQA32(zeroReg.AsX(), x1)
	} else {
		VPBROADCASTW(m.Offset(stride), x1)
	}
	VINSERTI32X4(U8(1), x1, y, y)
	z := ZMM()
	VCVTPH2PS(y, z)
	return z
}

// legacyTileZ is legacyTile for AVX-512 VNNI, after q80TileZ: each zmm
// register holds two blocks, values of the first in bytes 0–31 and of the
// second in bytes 32–63, so that one vpdpbusd does 64 multiply-adds of
// unsigned weight levels with signed activations. Q5_0 levels carry a bias
// of 16 and IQ4_NL grid values are made unsigned by adding 128; the integer
// sums start at −bias·Σx. Fifth bits are set through a 64-bit mask (the two
// blocks' qh side by side). Lanes 0–7 of a product belong to the first
// block and lanes 8–15 to the second, and so do the scale vectors; m·s goes
// to lanes 0 and 8. An odd last block is processed as a pair with itself,
// its twin's scales set to zero.
func legacyTileZ(s isa, k legacyKind, R, T int, ret bool) {
	frame := 0
	if k.mOff >= 0 && T > 1 {
		frame = 64 * R
	}
	name := begin(s, k.name, R, T, ret, "byte", "nb", frame, true)
	legacyDoc(name, k, R, T, ret)
	wp, xp, nb, acc := tileArgs(s, R, T, ZMM)
	ones := ZMM()
	VMOVDQU32(c01b, ones)
	hiLanes := hiNibbleLanes()
	xq := k.xb - 32
	hasM := k.mOff >= 0
	var mws Mem
	if hasM && T > 1 {
		mws = AllocLocal(64 * R)
	}
	body := func(tail bool) {
		if T == 1 {
			prefetch(wp, nil, 0, 0, 2*k.wb)
		}
		wv, dw := make([]VecVirtual, R), make([]VecVirtual, R)
		var mw []VecVirtual
		for r := 0; r < R; r++ {
			t := nibblesZ(Mem{Base: wp[r], Disp: k.qsOff}, k.wb, tail, hiLanes)
			if k.qhOff >= 0 {
				bits := GP64()
				MOVL(Mem{Base: wp[r], Disp: k.qhOff}, bits.As32())
				if !tail {
					hb := GP64()
					MOVL(Mem{Base: wp[r], Disp: k.qhOff + k.wb}, hb.As32())
					SHLQ(U8(32), hb)
					ORQ(hb, bits)
				}
				kb := K()
				KMOVQ(bits, kb)
				VPADDB(c10, t, kb, t)
			}
			if k.nl {
				g := ZMM()
				VMOVDQU32(cIQ4, g)
				VPSHUFB(t, g, t)
				VPXORD(c80, t, t)
			}
			wv[r] = t
			dw[r] = halvesZ(Mem{Base: wp[r]}, k.wb, tail)
			if hasM {
				m := halvesZ(Mem{Base: wp[r], Disp: k.mOff}, k.wb, tail)
				if T > 1 {
					VMOVUPS(m, mws.Offset(64*r))
				} else {
					mw = append(mw, m)
				}
			}
		}
		for t := 0; t < T; t++ {
			xv := ZMM()
			VBROADCASTI64X4(Mem{Base: xp[t], Disp: xq}, xv)
			if !tail {
				VINSERTI64X4(U8(1), Mem{Base: xp[t], Disp: xq + k.xb}, xv, xv)
			}
			dx := halvesZ(Mem{Base: xp[t]}, k.xb, tail)
			var sx VecVirtual
			if hasM {
				sx = halvesZ(Mem{Base: xp[t], Disp: 2}, k.xb, tail)
			}
			var init VecVirtual
			if bias := map[bool]int{true: 128, false: k.bias}[k.nl]; bias != 0 {
				init = biasInitZ(s, xv, ones, map[bool]int{true: 7, false: 4}[bias == 128])
			}
			for r := 0; r < R; r++ {
				p := ZMM()
				if init != nil {
					VMOVDQA32(init, p)
				} else {
					s.zero(p)
				}
				VPDPBUSD(xv, wv[r], p)
				VCVTDQ2PS(p, p)
				d := ZMM()
				VMULPS(dw[r], dx, d)
				VFMADD231PS(p, d, acc[r][t])
				if hasM {
					ms := ZMM()
					if T > 1 {
						VMULPS(mws.Offset(64*r), sx, ms)
					} else {
						VMULPS(mw[r], sx, ms)
					}
					VFMADD231PS(cE0, ms, acc[r][t])
				}
			}
		}
	}
	pairLoopZ(wp, xp, nb, k.wb, k.xb, body)
	finish(s, acc, ret)
}

// quantQ81 is quantQ80 for Q8_1 blocks: the same d and values (at offset
// 4), and s = d·Σq rounded to binary16 at offset 2.
func quantQ81() {
	TEXT("quantQ8_1AVX2", NOSPLIT, "func(x *float32, y *byte, nb int)")
	Pragma("noescape")
	Doc(
		"quantQ8_1AVX2 quantizes nb blocks of 32 float32 values at x into Q8_1",
		"blocks (36 bytes) at y, as ggml's x86 quantize_row_q8_1 does:",
		"",
		"\tfor b := 0; b < nb; b++ {",
		"\t\tamax := max |x[32b+j]|",
		"\t\td := amax / 127",
		"\t\tid := 0 if amax == 0, else 127 / amax",
		"\t\tr[j] := x86Round(x[32b+j] * id) for j < 32",
		"\t\ty[36b:] = f16(d), f16(float32(Σr) * d), then sat8(r[j])",
		"\t}",
		"",
		"A block holding a NaN or an infinity gets the binary16 NaN 0x7e00 as d",
		"and s, and zero values.",
	)
	quantBlocks(4, 36, func(x, y Register, amax VecVirtual) {
		d, vid := q8Scale(amax)
		h := XMM()
		VCVTPS2PH(U8(0), d, h)
		VPEXTRW(U8(0), h, Mem{Base: y})
		q := q8Round(x, vid)
		// Σq (of the int32, wrapping, as ggml's vpaddd) before the packing
		// overwrites q.
		sum := YMM()
		VPADDD(q[1], q[0], sum)
		t := YMM()
		VPADDD(q[3], q[2], t)
		VPADDD(t, sum, sum)
		hi := XMM()
		VEXTRACTI128(U8(1), sum, hi)
		sx := sum.AsX()
		VPADDD(hi, sx, sx)
		VPSHUFD(U8(0x4e), sx, hi)
		VPADDD(hi, sx, sx)
		VPSHUFD(U8(0xb1), sx, hi)
		VPADDD(hi, sx, sx)
		VCVTDQ2PS(sx, sx)
		VMULSS(d, sx, sx)
		VCVTPS2PH(U8(0), sx, h)
		VPEXTRW(U8(0), h, Mem{Base: y, Disp: 2})
		packStore(q, Mem{Base: y, Disp: 4})
		JMP(LabelRef("next"))

		Label("nonfinite")
		MOVL(U32(0x7e007e00), Mem{Base: y})
		zy := YMM()
		VPXOR(zy, zy, zy)
		VMOVDQU(zy, Mem{Base: y, Disp: 4})
	})
}
