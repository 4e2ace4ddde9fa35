package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// Kernels of Q2_K, Q3_K, Q5_K and IQ4_XS weights with Q8_K activations.
// They follow the Q4_K and Q6_K kernels: the same tiles (kTiles) and the
// same block loop (kTileLoop), on 256-bit vectors. Per block and row, the
// weights are unpacked to unsigned bytes for vpmaddubsw against the
// signed activations; vpmaddwd then applies the sub-block scales to the
// pair sums, and offsets of the unsigned levels are taken off with Q8_K's
// 16-value sums (bsums). The AVX-512 variants are the same code with each
// vpmaddwd and its vpaddd fused into one vpdpwssd (AVX-512 VNNI, EVEX on
// ymm registers), which measured up to 1.3× faster on prompts on Zen 4 and
// never clearly slower. vpdpbusd does not fit: it sums four byte products
// into an int32 lane, where the sub-block scale would then cost a vpmulld
// per product vector, instead of riding on the int16 pair sums.

// Block sizes in bytes.
const (
	q2KBytes   = 84  // scales[16], qs[64], f16 d, f16 dmin
	q3KBytes   = 110 // hmask[32], qs[64], scales[12], f16 d
	q5KBytes   = 176 // f16 d, f16 dmin, scales[12], qh[32], qs[128]
	iq4XSBytes = 136 // f16 d, u16 scales_h, scales_l[4], qs[128]
)

// Constants of these kernels, emitted once (the first ISA's pass). They
// also use legacy.go's c10 (bytes 0x10) and cIQ4 (the 16 IQ4 levels as
// int8, in every 128-bit lane), which hold the same bytes.
var (
	c03, c04           Mem // bytes 0x03, 0x04
	c32w               Mem // int16 32
	cSh4, cSh2         Mem // dword shifts 0, 4, …, 28 and 0, 2, …, 14
	cD0F, cD30, cD32   Mem // dwords 0x0f, 0x30, 32
	cPair              Mem // four vpshufb controls, 32 bytes each (see twoBitBlock)
	kq2ConstantsIssued bool
)

func kq2Constants() {
	if kq2ConstantsIssued {
		return
	}
	kq2ConstantsIssued = true
	genLegacyConstants()
	c03 = bytesConst("vec_c03", 32, func(int) byte { return 3 })
	c04 = bytesConst("vec_c04", 32, func(int) byte { return 4 })
	c32w = bytesConst("vec_c32w", 32, func(i int) byte { return byte(32 * (1 - i%2)) })
	sh4, sh2 := make([]uint32, 8), make([]uint32, 8)
	for i := range sh4 {
		sh4[i], sh2[i] = uint32(4*i), uint32(2*i)
	}
	cSh4 = dwordsConst("vec_cSh4", sh4)
	cSh2 = dwordsConst("vec_cSh2", sh2)
	rep := func(v uint32) []uint32 { return []uint32{v, v, v, v, v, v, v, v} }
	cD0F = dwordsConst("vec_cD0F", rep(0x0f))
	cD30 = dwordsConst("vec_cD30", rep(0x30))
	cD32 = dwordsConst("vec_cD32", rep(32))
	// Control k picks word 2k of a lane's eight for lane 0 and word 2k+1
	// for lane 1, repeated: from eight scale words in both lanes, the
	// scales of chunk k's two 16-value sub-blocks.
	cPair = bytesConst("vec_cPair", 128, func(i int) byte {
		k, lane, j := i/32, i%32/16, i%2
		return byte(4*k + 2*lane + j)
	})
}

// genKQuant2Kernels emits the dot product and tiles of the four types for
// both ISAs: the AVX-512 ones differ only in fusing each vpmaddwd and
// vpaddd into one vpdpwssd (see scaleAdd).
func genKQuant2Kernels(s isa) {
	kq2Constants()
	for _, tile := range []func(s isa, R, T int, ret bool){q2kTile, q3kTile, q5kTile, iq4xsTile} {
		tile(s, 1, 1, true)
		for _, rt := range kTiles {
			tile(s, rt[0], rt[1], false)
		}
	}
}

// scaleAdd adds to the int32 lanes of acc the pair sums of the int16
// words p times the int16 words sc: vpmaddwd and vpaddd, or on AVX-512
// VNNI the single vpdpwssd. p is clobbered.
func scaleAdd(s isa, sc Op, p, acc VecVirtual) {
	if s.evex {
		VPDPWSSD(sc, p, acc)
		return
	}
	VPMADDWD(sc, p, p)
	VPADDD(p, acc, acc)
}

// kq2Fields adds the four types to writeTables' field names.
func kq2Fields(field, dotField map[string]string) {
	for kind, q := range map[string]string{"Q2_K": "q2_K", "Q3_K": "q3_K", "Q5_K": "q5_K", "IQ4_XS": "iq4_XS"} {
		field[kind] = "q[" + q + "]"
		dotField[kind] = "dotQ[" + q + "]"
	}
}

// kq2Doc writes a tile's doc comment, as kDoc does for Q4_K and Q6_K.
func kq2Doc(name, kind string, R, T int, ret bool, wb int, notes []string, body ...string) {
	lines := []string{
		"\t\t\tvar sum float32",
		"\t\t\tfor b := 0; b < nb; b++ {",
		fmt.Sprintf("\t\t\t\twq, xq := w[r*ws+%d*b:], x[t*xs+292*b:]", wb),
	}
	lines = append(lines, body...)
	lines = append(lines, "\t\t\t}")
	notes = append([]string{"where f16 and f32 read little-endian binary16 and float32 values,"}, notes...)
	notes = append(notes, "The integer sums are exact; the float additions happen in vector lanes.")
	kernelDoc(name, kind+" weights with Q8_K activations", R, T, ret, lines, notes...)
}

// lowBits sets dst to bits [sh, sh+n) of each byte of src, at the bottom of
// the byte (mask holds 2ⁿ−1 in every byte).
func lowBits(src VecVirtual, sh int, mask Mem, dst VecVirtual) {
	if sh == 0 {
		VPAND(mask, src, dst)
		return
	}
	VPSRLW(U8(sh), src, dst)
	VPAND(mask, dst, dst)
}

// bitTo ORs bit b of each byte of src into bit to of the same byte of dst,
// with mask holding 1<<to in every byte; tmp is scratch. Whole-word shifts
// move bits across the byte boundary only into positions the mask clears.
func bitTo(src VecVirtual, b, to int, mask Mem, dst, tmp VecVirtual) {
	switch {
	case b > to:
		VPSRLW(U8(b-to), src, tmp)
	case b < to:
		VPSLLW(U8(to-b), src, tmp)
	default:
		VPAND(mask, src, tmp)
		VPOR(tmp, dst, dst)
		return
	}
	VPAND(mask, tmp, tmp)
	VPOR(tmp, dst, dst)
}

// q5kHigh ORs bit b of each byte of qh into bit 4 of lv: the fifth bit of
// the Q5_K values in lv.
func q5kHigh(qh VecVirtual, b int, lv VecVirtual) {
	tmp := YMM()
	bitTo(qh, b, 4, c10, lv, tmp)
}

// q2kTile emits a Q2_K·Q8_K tile. Per block and row the integer sums are
//
//	isum = Σ_s sc_s · Σ_{i in sub-block s} q_i·x_i
//	msum = Σ_s m_s · bsums[s]
//
// and the block adds f16(d)·xd·isum − f16(dmin)·xd·msum.
func q2kTile(s isa, R, T int, ret bool) {
	name := begin(s, "Q2_K", R, T, ret, "byte", "nb", 64*R, true)
	kq2Doc(name, "Q2_K", R, T, ret, q2KBytes, []string{
		"and two2K(wq[16:80], i) is the 2-bit value i: bits 2k, 2k+1 of",
		"qs[32h+l] for i = 128h+32k+l (ggml's dequantize_row_q2_K).",
	},
		"\t\t\t\tvar isum, msum int32",
		"\t\t\t\tfor j := 0; j < 16; j++ { // 16-value sub-blocks",
		"\t\t\t\t\tvar dot int32",
		"\t\t\t\t\tfor i := 16 * j; i < 16*j+16; i++ {",
		"\t\t\t\t\t\tdot += int32(two2K(wq[16:80], i)) * int32(int8(xq[4+i]))",
		"\t\t\t\t\t}",
		"\t\t\t\t\tisum += int32(wq[j]&15) * dot",
		"\t\t\t\t\tmsum += int32(wq[j]>>4) * int32(bsum(xq, j))",
		"\t\t\t\t}",
		"\t\t\t\td := f32(xq[0:])",
		"\t\t\t\tsum += float32(isum)*(f16(wq[80:])*d) - float32(msum)*(f16(wq[82:])*d)",
	)
	// Per row: the 16 mins and the 16 scales as words (64 bytes).
	kTileLoop(s, R, T, ret, q2KBytes, 64, func(s isa, wp, xp []GPVirtual, acc, isum [][]VecVirtual, stack Mem) {
		for r := range wp {
			base := stack.Offset(64 * r)
			x, m := XMM(), XMM()
			VMOVDQU(Mem{Base: wp[r]}, x)
			VPSRLW(U8(4), x, m)
			VPAND(c0F, m, m)
			mw := YMM()
			VPMOVZXBW(m, mw)
			VMOVDQU(mw, base)
			VPAND(c0F, x, x)
			v := YMM()
			VPMOVZXBW(x, v)
			VMOVDQU(v, base.Offset(32))
		}
		twoBitBlock(s, wp, xp, isum, stack, 64, 16, nil)
		for r := range wp {
			base := stack.Offset(64 * r)
			dw, dm := YMM(), YMM()
			s.f16Bcast(Mem{Base: wp[r], Disp: 80}, dw)
			s.f16Bcast(Mem{Base: wp[r], Disp: 82}, dm)
			for t := range xp {
				dy := YMM()
				VBROADCASTSS(Mem{Base: xp[t]}, dy)
				d := YMM()
				VMULPS(dy, dw, d)
				VCVTDQ2PS(isum[r][t], isum[r][t])
				VFMADD231PS(isum[r][t], d, acc[r][t])
				mv := YMM()
				VMOVDQU(Mem{Base: xp[t], Disp: 260}, mv)
				VPMADDWD(base, mv, mv)
				VCVTDQ2PS(mv, mv)
				VMULPS(dy, dm, dy)
				VFNMADD231PS(mv, dy, acc[r][t])
			}
		}
	})
}

// twoBitBlock adds Σ_s sc_s·Σ q·x for the 2-bit values at qsOff of each
// row (Q2_K, Q3_K): 32 values (two sub-blocks) per vpmaddubsw, scaled by
// vpmaddwd with the sixteen scale words at stack + perRow·r + 32, which a
// vpshufb spreads to the two sub-blocks of each 32 values. With hmOff
// non-nil (Q3_K), the third bit of each value, from the 32 bytes at
// *hmOff, is added as 4.
func twoBitBlock(s isa, wp, xp []GPVirtual, isum [][]VecVirtual, stack Mem, perRow, qsOff int, hmOff *int) {
	R, T := len(wp), len(xp)
	hm := make([]VecVirtual, R)
	if hmOff != nil {
		for r := range hm {
			hm[r] = YMM()
			VMOVDQU(Mem{Base: wp[r], Disp: *hmOff}, hm[r])
		}
	}
	for h := 0; h < 2; h++ {
		qs, sh := make([]VecVirtual, R), make([]VecVirtual, R)
		for r := range qs {
			qs[r] = YMM()
			VMOVDQU(Mem{Base: wp[r], Disp: qsOff + 32*h}, qs[r])
			// Scales 8h … 8h+7 in both lanes.
			sh[r] = YMM()
			VPERMQ(U8(0x44+0xaa*h), stack.Offset(perRow*r+32), sh[r])
		}
		for k := 0; k < 4; k++ {
			lv, sc := make([]VecVirtual, R), make([]VecVirtual, R)
			for r := range lv {
				lv[r] = YMM()
				lowBits(qs[r], 2*k, c03, lv[r])
				if hmOff != nil {
					tmp := YMM()
					bitTo(hm[r], 4*h+k, 2, c04, lv[r], tmp)
				}
				sc[r] = YMM()
				VPSHUFB(cPair.Offset(32*k), sh[r], sc[r])
			}
			for t := 0; t < T; t++ {
				for r := 0; r < R; r++ {
					p := YMM()
					VPMADDUBSW(Mem{Base: xp[t], Disp: 4 + 128*h + 32*k}, lv[r], p)
					scaleAdd(s, sc[r], p, isum[r][t])
				}
			}
		}
	}
}

// q3kTile emits a Q3_K·Q8_K tile. The 3-bit values u (0..7) stand for
// u−4, so per block and row
//
//	isum = Σ_s sc_s · (Σ_{i in sub-block s} u_i·x_i − 4·bsums[s])
//
// and the block adds f16(d)·xd·isum.
func q3kTile(s isa, R, T int, ret bool) {
	name := begin(s, "Q3_K", R, T, ret, "byte", "nb", 64*R, true)
	kq2Doc(name, "Q3_K", R, T, ret, q3KBytes, []string{
		"scale3K(wq[96:108], j) is the 6-bit scale of sub-block j less 32",
		"(ggml's dequantize_row_q3_K unpacking), and three3K(wq, i) the",
		"3-bit value i: bits 2k, 2k+1 of qs[32h+l] (wq[32:96]) for",
		"i = 128h+32k+l, minus 4 unless bit 4h+k of hmask[l] (wq[0:32]) is set.",
	},
		"\t\t\t\tvar isum int32",
		"\t\t\t\tfor j := 0; j < 16; j++ { // 16-value sub-blocks",
		"\t\t\t\t\tvar dot int32",
		"\t\t\t\t\tfor i := 16 * j; i < 16*j+16; i++ {",
		"\t\t\t\t\t\tdot += int32(three3K(wq, i)) * int32(int8(xq[4+i]))",
		"\t\t\t\t\t}",
		"\t\t\t\t\tisum += int32(scale3K(wq[96:108], j)) * dot",
		"\t\t\t\t}",
		"\t\t\t\tsum += float32(isum) * (f16(wq[108:]) * f32(xq[0:]))",
	)
	// Per row: the 16 scales as words (32 bytes), at offset 32 where
	// twoBitBlock reads them.
	kTileLoop(s, R, T, ret, q3KBytes, 64, func(s isa, wp, xp []GPVirtual, acc, isum [][]VecVirtual, stack Mem) {
		for r := range wp {
			q3kScales(wp[r], stack.Offset(64*r+32))
		}
		hmOff := 0
		twoBitBlock(s, wp, xp, isum, stack, 64, 32, &hmOff)
		// 4·Σ_j sc_j·bsums[j] off: the offset of the 3-bit values.
		kOffsetAcc(s, wp, xp, acc, isum, func(r int) Mem { return stack.Offset(64*r + 32) }, 2, 108)
	})
}

// q3kScales unpacks the sixteen 6-bit scales of the Q3_K block at w (bytes
// 96–107: low nibbles of scales 0–7 then, in the high nibbles, 8–15; the
// top bit pairs of scale j at bits 2·(j/4) of byte 8 + j%4), less 32, to
// base as sixteen words.
func q3kScales(w GPVirtual, base Mem) {
	a0, a1, tmp := GP32(), GP32(), GP32()
	MOVL(Mem{Base: w, Disp: 96}, a0)
	MOVL(Mem{Base: w, Disp: 100}, a1)
	MOVL(Mem{Base: w, Disp: 104}, tmp)
	// part(src, shift, hshift): (src>>shift)&0x0f0f0f0f | ((tmp>>hshift)&0x03030303)<<4
	part := func(src GPVirtual, shift, hshift int) GPVirtual {
		lo, hi := GP32(), GP32()
		MOVL(src, lo)
		if shift > 0 {
			SHRL(U8(shift), lo)
		}
		ANDL(U32(0x0f0f0f0f), lo)
		MOVL(tmp, hi)
		if hshift > 0 {
			SHRL(U8(hshift), hi)
		}
		ANDL(U32(0x03030303), hi)
		SHLL(U8(4), hi)
		ORL(hi, lo)
		return lo
	}
	s0, s1 := part(a0, 0, 0), part(a1, 0, 2)
	s2, s3 := part(a0, 4, 4), part(a1, 4, 6)
	// 32-bit operations zero the upper halves, so OR-ing is enough.
	lo, hi := s0.As64().(GPVirtual), s2.As64().(GPVirtual)
	SHLQ(U8(32), s1.As64())
	ORQ(s1.As64(), lo)
	SHLQ(U8(32), s3.As64())
	ORQ(s3.As64(), hi)
	x := XMM()
	VMOVQ(lo, x)
	VPINSRQ(U8(1), hi, x, x)
	w16 := YMM()
	VPMOVZXBW(x, w16)
	VPSUBW(c32w, w16, w16)
	VMOVDQU(w16, base)
}

// q5kTile emits a Q5_K·Q8_K tile: Q4_K's (q4kBlock), with the fifth bit of
// each value from qh.
func q5kTile(s isa, R, T int, ret bool) {
	name := begin(s, "Q5_K", R, T, ret, "byte", "nb", 64*R, true)
	kq2Doc(name, "Q5_K", R, T, ret, q5KBytes, []string{
		"scaleMinK4(j, s) unpacks the 6-bit scale and min of sub-block j as",
		"ggml's get_scale_min_k4 does, five5K(wq, i) is the low nibble of",
		"qs[32*(i/64) + i%32] (wq[48:]) if i%64 < 32 and its high nibble",
		"otherwise, plus 16 if bit 2*(i/64) + (i%64)/32 of qh[i%32]",
		"(wq[16:48]) is set, and bsum(xq, g) is the int16 at xq[260+2*g:].",
	},
		"\t\t\t\tvar isum, msum int32",
		"\t\t\t\tfor j := 0; j < 8; j++ { // 32-value sub-blocks",
		"\t\t\t\t\tsc, m := scaleMinK4(j, wq[4:16])",
		"\t\t\t\t\tvar dot int32",
		"\t\t\t\t\tfor i := 32 * j; i < 32*j+32; i++ {",
		"\t\t\t\t\t\tdot += int32(five5K(wq, i)) * int32(int8(xq[4+i]))",
		"\t\t\t\t\t}",
		"\t\t\t\t\tisum += int32(sc) * dot",
		"\t\t\t\t\tmsum += int32(m) * (int32(bsum(xq, 2*j)) + int32(bsum(xq, 2*j+1)))",
		"\t\t\t\t}",
		"\t\t\t\td := f32(xq[0:])",
		"\t\t\t\tsum += float32(isum)*(f16(wq[0:])*d) - float32(msum)*(f16(wq[2:])*d)",
	)
	kTileLoop(s, R, T, ret, q5KBytes, 64, func(s isa, wp, xp []GPVirtual, acc, isum [][]VecVirtual, stack Mem) {
		q4kBlock(s, wp, xp, acc, isum, stack, true)
	})
}

// iq4xsTile emits an IQ4_XS·Q8_K tile. The 4-bit indices become the signed
// levels by vpshufb from a table; vpmaddubsw wants one unsigned operand,
// so it multiplies |level| by the activation with the level's sign. Per
// block and row
//
//	isum = Σ_s (ls_s − 32) · Σ_{i in sub-block s} level_i·x_i
//
// and the block adds f16(d)·xd·isum.
func iq4xsTile(s isa, R, T int, ret bool) {
	name := begin(s, "IQ4_XS", R, T, ret, "byte", "nb", 32*R, true)
	kq2Doc(name, "IQ4_XS", R, T, ret, iq4XSBytes, []string{
		"scaleIQ4(wq, j) is sub-block j's 6-bit scale less 32: the low",
		"nibble from nibble j%2 of wq[4+j/2], the top two bits from bits",
		"2j, 2j+1 of the uint16 at wq[2:], and levelIQ4(wq, i) is",
		"kvalues_iq4nl[n] for the nibble n of value i: the low nibble of",
		"wq[8+16*(i/32)+i%16] if i%32 < 16, else its high nibble.",
	},
		"\t\t\t\tvar isum int32",
		"\t\t\t\tfor j := 0; j < 8; j++ { // 32-value sub-blocks",
		"\t\t\t\t\tvar dot int32",
		"\t\t\t\t\tfor i := 32 * j; i < 32*j+32; i++ {",
		"\t\t\t\t\t\tdot += int32(levelIQ4(wq, i)) * int32(int8(xq[4+i]))",
		"\t\t\t\t\t}",
		"\t\t\t\t\tisum += int32(scaleIQ4(wq, j)) * dot",
		"\t\t\t\t}",
		"\t\t\t\tsum += float32(isum) * (f16(wq[0:]) * f32(xq[0:]))",
	)
	kTileLoop(s, R, T, ret, iq4XSBytes, 32, func(s isa, wp, xp []GPVirtual, acc, isum [][]VecVirtual, stack Mem) {
		R := len(wp)
		tab := YMM()
		VMOVDQU(cIQ4, tab)
		for r := 0; r < R; r++ {
			// Eight dword scales: (scales_l >> 4j) & 15 | ((scales_h<<4) >> 2j) & 0x30, less 32.
			lo, hi := YMM(), YMM()
			VPBROADCASTD(Mem{Base: wp[r], Disp: 4}, lo)
			VPSRLVD(cSh4, lo, lo)
			VPAND(cD0F, lo, lo)
			VPBROADCASTW(Mem{Base: wp[r], Disp: 2}, hi)
			VPSLLD(U8(4), hi, hi)
			VPSRLVD(cSh2, hi, hi)
			VPAND(cD30, hi, hi)
			VPOR(hi, lo, lo)
			VPSUBD(cD32, lo, lo)
			VMOVDQU(lo, stack.Offset(32*r))
		}
		for sb := 0; sb < 8; sb++ {
			lv, av, sc := make([]VecVirtual, R), make([]VecVirtual, R), make([]VecVirtual, R)
			for r := 0; r < R; r++ {
				// Sub-block sb's 16 bytes: low nibbles (its first 16
				// values) in lane 0, high nibbles in lane 1.
				x, hx := XMM(), XMM()
				VMOVDQU(Mem{Base: wp[r], Disp: 8 + 16*sb}, x)
				VPSRLW(U8(4), x, hx)
				lv[r] = YMM()
				VINSERTI128(U8(1), hx, x.AsY(), lv[r])
				VPAND(c0F, lv[r], lv[r])
				VPSHUFB(lv[r], tab, lv[r])
				av[r] = YMM()
				VPABSB(lv[r], av[r])
				sc[r] = YMM()
				VPBROADCASTW(stack.Offset(32*r+4*sb), sc[r])
			}
			for t := range xp {
				for r := 0; r < R; r++ {
					p := YMM()
					VMOVDQU(Mem{Base: xp[t], Disp: 4 + 32*sb}, p)
					VPSIGNB(lv[r], p, p)
					VPMADDUBSW(p, av[r], p)
					scaleAdd(s, sc[r], p, isum[r][t])
				}
			}
		}
		for r := 0; r < R; r++ {
			dw := YMM()
			s.f16Bcast(Mem{Base: wp[r]}, dw)
			for t := range xp {
				d := YMM()
				VBROADCASTSS(Mem{Base: xp[t]}, d)
				VMULPS(dw, d, d)
				VCVTDQ2PS(isum[r][t], isum[r][t])
				VFMADD231PS(isum[r][t], d, acc[r][t])
			}
		}
	})
}
