package main

import (
	"math"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// Constants of the activation quantizers (8 float32 lanes each).
var (
	cAbs    Mem // 0x7fffffff
	cInf    Mem // +Inf
	c127f   Mem // 127.0
	cM127f  Mem // −127.0
	cOnef   Mem // 1.0
	c127i   Mem // int32 127
	cPackDw Mem // vpermd indices undoing the lane interleave of the packs
)

func genQuantConstants() {
	splat := func(name string, v uint32) Mem {
		return dwordsConst(name, []uint32{v, v, v, v, v, v, v, v})
	}
	cAbs = splat("vec_cAbs", 0x7fffffff)
	cInf = splat("vec_cInf", 0x7f800000)
	c127f = splat("vec_c127f", 0x42fe0000)
	cM127f = splat("vec_cM127f", 0xc2fe0000)
	cOnef = splat("vec_cOnef", 0x3f800000)
	c127i = splat("vec_c127i", 127)
	cPackDw = dwordsConst("vec_cPackDw", []uint32{0, 4, 1, 5, 2, 6, 3, 7})
}

// The quantizers are AVX2 code; the AVX-512 implementation uses them too,
// since quantizing activations costs little next to the products.
func genQuantizers(s isa) {
	if s.evex {
		return
	}
	genQuantConstants()
	quantQ80()
	quantQ8K()
	genExpSum()
	genAxpy4()
}

// absMax loads n float32 vectors from base+off, and returns the vector of
// lane-wise maxima of their magnitudes and a GP register holding the
// vmovmskps of "every value was finite" (0xff when all were).
func absMax(base Register, off, n int) (VecVirtual, GPVirtual) {
	var m, fin VecVirtual
	for i := 0; i < n; i++ {
		v := YMM()
		VANDPS(Mem{Base: base, Disp: off + 32*i}, cAbsReg(), v)
		c := YMM()
		VCMPPS(U8(0x11), cInf, v, c) // |x| < +Inf, false for NaN
		if i == 0 {
			m, fin = v, c
			continue
		}
		VMAXPS(v, m, m)
		VANDPS(c, fin, fin)
	}
	mask := GP32()
	VMOVMSKPS(fin, mask)
	return m, mask.As64().(GPVirtual)
}

// cAbsReg loads the magnitude mask into a fresh register (vandps takes
// memory only as its second source, and the loaded x must be that one).
func cAbsReg() VecVirtual {
	r := YMM()
	VMOVUPS(cAbs, r)
	return r
}

// hmax reduces the 8 lanes of m to their maximum in lane 0 of the result.
func hmax(m VecVirtual) VecVirtual {
	hi := XMM()
	VEXTRACTF128(U8(1), m, hi)
	x := m.AsX()
	VMAXPS(hi, x, x)
	VPERMILPS(U8(0x4e), x, hi)
	VMAXPS(hi, x, x)
	VPERMILPS(U8(0xb1), x, hi)
	VMAXSS(hi, x, x)
	return x.(VecVirtual)
}

// packStore packs four vectors of int32 (values in int8 range) into 32
// bytes, in order, and stores them at m.
func packStore(q [4]VecVirtual, m Mem) {
	VPACKSSDW(q[1], q[0], q[0])
	VPACKSSDW(q[3], q[2], q[2])
	VPACKSSWB(q[2], q[0], q[0])
	idx := YMM()
	VMOVDQU(cPackDw, idx)
	VPERMD(q[0], idx, q[0])
	VMOVDQU(q[0], m)
}

// quantBlocks emits a quantizer's loop over the nb blocks of vecs float32
// vectors at x, each quantized into yBytes at y: per block it finds the
// largest magnitude, jumps to the label "nonfinite" (which body emits) for
// a block holding a NaN or an infinity, and otherwise calls body with lane
// 0 of amax holding it; body ends every block at the label "next", where x
// and y move one block on.
func quantBlocks(vecs, yBytes int, body func(x, y Register, amax VecVirtual)) {
	x := Load(Param("x"), GP64())
	y := Load(Param("y"), GP64())
	nb := Load(Param("nb"), GP64())
	TESTQ(nb, nb)
	JZ(LabelRef("done"))
	Label("block")
	m, fin := absMax(x, 0, vecs)
	CMPQ(fin, U8(0xff))
	JNE(LabelRef("nonfinite"))
	body(x, y, hmax(m))
	Label("next")
	ADDQ(U32(32*vecs), x)
	ADDQ(U32(yBytes), y)
	DECQ(nb)
	JNZ(LabelRef("block"))
	Label("done")
	VZEROUPPER()
	RET()
}

// q8Scale computes, from lane 0 of amax, the scale d = amax/127 of a Q8_0
// or Q8_1 block (lane 0 of d) and the multiplier id = 127/amax of ggml's
// x86 quantizers, 0 for an all-zero block, broadcast to 8 lanes. (ggml's
// scalar reference multiplies by 1/d, which differs in the last place for
// about a third of the blocks.)
func q8Scale(amax VecVirtual) (d, vid VecVirtual) {
	d = XMM()
	VDIVSS(c127f, amax, d)
	id := XMM()
	VMOVSS(c127f, id)
	VDIVSS(amax, id, id)
	// id = 0 where amax == 0 (all-zero block): 127/0 would turn 0·x into NaN.
	z := XMM()
	VXORPS(z, z, z)
	nz := XMM()
	VCMPSS(U8(4), z, amax, nz) // amax != 0
	VANDPS(nz, id, id)
	vid = YMM()
	VBROADCASTSS(id, vid)
	return d, vid
}

// q8Round returns the four vectors of int32 x[j]·id for the 32 values at
// x, rounded as ggml's x86 quantizers round them: vcvtps2dq under Go's
// MXCSR (nearest, ties to even; ggml's vroundps before it changes nothing,
// and gcc drops it), which makes a NaN or an out-of-range product (the
// +Inf of a block whose 127/amax overflows) 0x80000000, and the packs
// saturate that to −128.
func q8Round(x Register, vid VecVirtual) [4]VecVirtual {
	var q [4]VecVirtual
	for i := range q {
		q[i] = YMM()
		VMULPS(Mem{Base: x, Disp: 32 * i}, vid, q[i])
		VCVTPS2DQ(q[i], q[i])
	}
	return q
}

func quantQ80() {
	TEXT("quantQ8_0AVX2", NOSPLIT, "func(x *float32, y *byte, nb int)")
	Pragma("noescape")
	Doc(
		"quantQ8_0AVX2 quantizes nb blocks of 32 float32 values at x into Q8_0",
		"blocks (34 bytes) at y, as ggml's x86 quantize_row_q8_0 does:",
		"",
		"\tfor b := 0; b < nb; b++ {",
		"\t\tamax := max |x[32b+j]|",
		"\t\td := amax / 127",
		"\t\tid := 0 if amax == 0, else 127 / amax",
		"\t\ty[34b:] = f16(d), then sat8(x86Round(x[32b+j] * id)) for j < 32",
		"\t}",
		"",
		"A block holding a NaN or an infinity gets the binary16 NaN 0x7e00 as d",
		"and zero values.",
	)
	quantBlocks(4, 34, func(x, y Register, amax VecVirtual) {
		d, vid := q8Scale(amax)
		h := XMM()
		VCVTPS2PH(U8(0), d, h) // round to nearest even
		VPEXTRW(U8(0), h, Mem{Base: y})
		q := q8Round(x, vid)
		packStore(q, Mem{Base: y, Disp: 2})
		JMP(LabelRef("next"))

		Label("nonfinite")
		MOVW(U16(0x7e00), Mem{Base: y})
		zy := YMM()
		VPXOR(zy, zy, zy)
		VMOVDQU(zy, Mem{Base: y, Disp: 2})
	})
}

func quantQ8K() {
	TEXT("quantQ8_KAVX2", NOSPLIT, "func(x *float32, y *byte, nb int)")
	Pragma("noescape")
	Doc(
		"quantQ8_KAVX2 quantizes nb blocks of 256 float32 values at x into Q8_K",
		"blocks (292 bytes) at y, as ggml's quantize_row_q8_K reference does:",
		"",
		"\tfor b := 0; b < nb; b++ {",
		"\t\tv := the first x[256b+j] of largest magnitude",
		"\t\tif v == 0 { y[292b:] = 0 (292 bytes); continue }",
		"\t\tiscale := -127 / v",
		"\t\tif iscale is ±Inf { y[292b:] = float32(1 / iscale), then zeros; continue }",
		"\t\tq[j] = min(127, roundHalfEven(iscale * x[256b+j])) for j < 256",
		"\t\ty[292b:] = float32(1 / iscale), q as int8, then int16(Σ q[16g:16g+16]) for g < 16",
		"\t}",
		"",
		"A block holding a NaN or an infinity gets d = NaN and zero values and sums.",
	)
	quantBlocks(32, 292, func(x, y Register, amax VecVirtual) {
		z := XMM()
		VXORPS(z, z, z)
		VUCOMISS(z, amax)
		JE(LabelRef("zero"))

		// Find the first value whose magnitude is amax: its sign sets the sign
		// of the scale.
		av := YMM()
		VBROADCASTSS(amax, av)
		i := GP64()
		XORQ(i, i)
		Label("find")
		a := YMM()
		VANDPS(Mem{Base: x, Index: i, Scale: 1}, cAbsReg(), a)
		VCMPPS(U8(0), av, a, a) // equal
		mask := GP32()
		VMOVMSKPS(a, mask)
		TESTL(mask, mask)
		JNZ(LabelRef("found"))
		ADDQ(U8(32), i)
		JMP(LabelRef("find"))
		Label("found")
		BSFL(mask, mask)
		LEAQ(Mem{Base: i, Index: mask.As64(), Scale: 4}, i)
		vmax := XMM()
		VMOVSS(Mem{Base: x, Index: i, Scale: 1}, vmax)
		is := XMM()
		VMOVSS(cM127f, is)
		VDIVSS(vmax, is, is) // iscale = −127 / v
		one := XMM()
		VMOVSS(cOnef, one)
		VDIVSS(is, one, one) // d = 1 / iscale
		VMOVSS(one, Mem{Base: y})
		// A block so small that iscale overflows: ggml's nearest_int makes
		// every ±Inf and NaN product 0 (vcvtps2dq would give −128).
		ai := XMM()
		VANDPS(cAbs, is, ai)
		VUCOMISS(cInf, ai)
		JE(LabelRef("clear"))
		vis := YMM()
		VBROADCASTSS(is, vis)
		for c := 0; c < 8; c++ { // 32 values: two 16-value groups
			var q [4]VecVirtual
			for k := range q {
				q[k] = YMM()
				VMULPS(Mem{Base: x, Disp: 128*c + 32*k}, vis, q[k])
				VCVTPS2DQ(q[k], q[k]) // MXCSR rounding: nearest even
				VPMINSD(c127i, q[k], q[k])
			}
			// bsums of the two groups: (q0+q1) and (q2+q3), each summed across.
			s0, s1 := YMM(), YMM()
			VPADDD(q[1], q[0], s0)
			VPADDD(q[3], q[2], s1)
			VPHADDD(s1, s0, s0)
			VPHADDD(s0, s0, s0)
			hi := XMM()
			VEXTRACTI128(U8(1), s0, hi)
			VPADDD(hi, s0.AsX(), hi)
			VPACKSSDW(hi, hi, hi)
			VMOVSS(hi, Mem{Base: y, Disp: 260 + 4*c})
			packStore(q, Mem{Base: y, Disp: 4 + 32*c})
		}
		JMP(LabelRef("next"))

		Label("nonfinite")
		MOVL(U32(0x7fc00000), Mem{Base: y})
		JMP(LabelRef("clear"))
		Label("zero")
		MOVL(U32(0), Mem{Base: y})
		Label("clear")
		zy := YMM()
		VPXOR(zy, zy, zy)
		for off := 4; off < 292; off += 32 {
			if off+32 > 292 {
				off = 292 - 32
			}
			VMOVDQU(zy, Mem{Base: y, Disp: off})
		}
	})
}

// genExpSum emits the AVX2 exponential of the softmax; the AVX-512
// implementation uses it too.
func genExpSum() {
	splat := func(name string, v float32) Mem {
		b := math.Float32bits(v)
		return dwordsConst(name, []uint32{b, b, b, b, b, b, b, b})
	}
	cHi := splat("vec_cExpHi", 88.72283)
	cLo := splat("vec_cExpLo", -87.33654)
	cLog2e := splat("vec_cLog2e", math.Log2E)
	cLn2Hi := splat("vec_cLn2Hi", 0.693359375)
	cLn2Lo := splat("vec_cLn2Lo", -2.12194440e-4)
	coef := []Mem{
		splat("vec_cExp7", 1.0/5040), splat("vec_cExp6", 1.0/720), splat("vec_cExp5", 1.0/120),
		splat("vec_cExp4", 1.0/24), splat("vec_cExp3", 1.0/6), splat("vec_cExp2", 0.5),
	}

	TEXT("expSumAVX2", NOSPLIT, "func(dst *float32, x *float32, n int, shift float32) float32")
	Pragma("noescape")
	Doc(
		"expSumAVX2 sets dst[i] = e^(x[i]−shift) for i < n (a multiple of 8) and",
		"returns the float32 sum of the results, kept in 8 lanes:",
		"",
		"\tvar sum float32",
		"\tfor i := 0; i < n; i++ {",
		"\t\tdst[i] = Exp32(x[i] - shift)",
		"\t\tsum += dst[i]",
		"\t}",
		"\treturn sum",
		"",
		"It evaluates Exp32's reduction and polynomial with fused multiply-adds,",
		"so a result can differ from Exp32's in the last place.",
	)
	dst := Load(Param("dst"), GP64())
	x := Load(Param("x"), GP64())
	n := Load(Param("n"), GP64())
	sh := XMM()
	Load(Param("shift"), sh)
	shv := YMM()
	VBROADCASTSS(sh, shv)
	acc := YMM()
	VXORPS(acc, acc, acc)
	i := GP64()
	XORQ(i, i)
	Label("loop")
	CMPQ(i, n)
	JGE(LabelRef("done"))
	t := YMM()
	VMOVUPS(Mem{Base: x, Index: i, Scale: 4}, t)
	VSUBPS(shv, t, t)
	// tc: t clamped to the range where the reduction below is valid; the
	// lanes outside it are fixed up at the end.
	tc := YMM()
	VMINPS(cHi, t, tc)
	VMAXPS(cLo, tc, tc)
	nf := YMM()
	VMULPS(cLog2e, tc, nf)
	VROUNDPS(U8(0), nf, nf) // nearest even
	r := YMM()
	VMOVAPS(tc, r)
	VFNMADD231PS(cLn2Hi, nf, r)
	VFNMADD231PS(cLn2Lo, nf, r)
	p := YMM()
	VMOVUPS(coef[0], p)
	for _, c := range coef[1:] {
		VFMADD213PS(c, r, p) // p = p·r + c
	}
	r2 := YMM()
	VMULPS(r, r, r2)
	VFMADD213PS(r, r2, p) // p·r² + r
	VADDPS(cOnef, p, p)
	// 2ⁿ as two factors 2^⌊n/2⌋ and 2^(n−⌊n/2⌋), both normal for the
	// clamped n in [−126, 128].
	e := YMM()
	VCVTPS2DQ(nf, e)
	e1 := YMM()
	VPSRAD(U8(1), e, e1)
	VPSUBD(e1, e, e)
	VPADDD(c127i, e1, e1)
	VPSLLD(U8(23), e1, e1)
	VPADDD(c127i, e, e)
	VPSLLD(U8(23), e, e)
	VMULPS(e1, p, p)
	VMULPS(e, p, p)
	// Fix up: t > hi gives +Inf, t < lo gives 0, NaN stays NaN.
	m := YMM()
	VCMPPS(U8(0x1e), cHi, t, m) // t > hi (ordered)
	VBLENDVPS(m, cInf, p, p)
	VCMPPS(U8(0x11), cLo, t, m) // t < lo (ordered)
	VANDNPS(p, m, p)
	VCMPPS(U8(3), t, t, m) // unordered: NaN
	VBLENDVPS(m, t, p, p)
	VMOVUPS(p, Mem{Base: dst, Index: i, Scale: 4})
	VADDPS(p, acc, acc)
	ADDQ(U8(8), i)
	JMP(LabelRef("loop"))
	Label("done")
	s := avx2.hsum(acc)
	VZEROUPPER()
	Store(s, ReturnIndex(0))
	RET()
}
