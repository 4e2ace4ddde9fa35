package main

import (
	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// genAxpy4 emits the weighted sum of four value rows that attention adds
// into its output, for float32 rows and for binary16 rows (an F16 KV
// cache), which are widened in registers. It multiplies and adds without
// fusing, in the order of the Go reference, so that every implementation
// gives the same bits.
func genAxpy4() {
	for _, half := range []bool{false, true} {
		name, elem, size := "axpy4F32AVX2", "float32", 4
		if half {
			name, elem, size = "axpy4F16AVX2", "uint16 (binary16)", 2
		}
		TEXT(name, NOSPLIT, "func(y *float32, e *[4]float32, v0, v1, v2, v3 *byte, n int)")
		Pragma("noescape")
		Doc(
			name+" adds e[0]·v0 + e[1]·v1 + e[2]·v2 + e[3]·v3 to y over n elements (a",
			"multiple of 8), the rows v0…v3 holding "+elem+" values:",
			"",
			"\tfor i := 0; i < n; i++ {",
			"\t\ty[i] += (e[0]*v0[i] + e[1]*v1[i]) + (e[2]*v2[i] + e[3]*v3[i])",
			"\t}",
		)
		y := Load(Param("y"), GP64())
		ep := Load(Param("e"), GP64())
		vs := []Register{
			Load(Param("v0"), GP64()), Load(Param("v1"), GP64()),
			Load(Param("v2"), GP64()), Load(Param("v3"), GP64()),
		}
		n := Load(Param("n"), GP64())
		es := make([]VecVirtual, 4)
		for j := range es {
			es[j] = YMM()
			VBROADCASTSS(Mem{Base: ep, Disp: 4 * j}, es[j])
		}
		i := GP64()
		XORQ(i, i)
		Label("loop")
		CMPQ(i, n)
		JGE(LabelRef("done"))
		p := make([]VecVirtual, 4)
		for j := range p {
			p[j] = YMM()
			m := Mem{Base: vs[j], Index: i, Scale: uint8(size)}
			if half {
				VCVTPH2PS(m, p[j])
				VMULPS(es[j], p[j], p[j])
			} else {
				VMULPS(m, es[j], p[j])
			}
		}
		VADDPS(p[1], p[0], p[0])
		VADDPS(p[3], p[2], p[2])
		VADDPS(p[2], p[0], p[0])
		yv := Mem{Base: y, Index: i, Scale: 4}
		VADDPS(yv, p[0], p[0])
		VMOVUPS(p[0], yv)
		ADDQ(U8(8), i)
		JMP(LabelRef("loop"))
		Label("done")
		VZEROUPPER()
		RET()
	}
}
