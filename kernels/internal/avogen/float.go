package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// wtype is a floating-point weight storage type.
type wtype struct {
	name string
	size int // bytes per element
	desc string
}

var (
	wF32  = wtype{"F32", 4, "float32"}
	wF16  = wtype{"F16", 2, "IEEE binary16 (converted with vcvtph2ps)"}
	wBF16 = wtype{"BF16", 2, "bfloat16 (widened by a 16-bit shift)"}
)

// floatTiles lists the register tiles (rows × tokens) generated for an ISA.
// The largest is the matrix-matrix micro-kernel; R×1 tiles serve
// matrix-vector products and the 1×1 tile the plain dot product.
func floatTiles(s isa) [][2]int {
	rmax, tmax := floatRows(s), 4
	var ts [][2]int
	for r := 1; r <= rmax; r++ {
		for t := 1; t <= tmax; t++ {
			ts = append(ts, [2]int{r, t})
		}
	}
	if rmax < 4 {
		ts = append(ts, [2]int{4, 1})
	}
	return ts
}

// floatRows is the height of the matrix-matrix float tiles: on AVX2, 12
// accumulators + 3 weights + 1 activation fill the 16 registers.
func floatRows(s isa) int {
	if s.evex {
		return 4
	}
	return 3
}

func genFloatKernels(s isa) {
	for _, wt := range []wtype{wF32, wF16, wBF16} {
		floatTile(s, wt, 1, 1, true, false)
		for _, rt := range floatTiles(s) {
			floatTile(s, wt, rt[0], rt[1], false, false)
		}
		floatTile(s, wt, floatRows(s), 4, false, true)
	}
}

// loadW loads s.vl weights of type wt from m into dst as float32.
func loadW(s isa, wt wtype, m Mem, dst VecVirtual) {
	switch wt {
	case wF32:
		VMOVUPS(m, dst)
	case wF16:
		VCVTPH2PS(m, dst)
	case wBF16:
		VPMOVZXWD(m, dst)
		VPSLLD(U8(16), dst, dst)
	}
}

// floatTile emits the R×T dot-product tile for weights of type wt:
//
//	out[t·os + 4r] = Σ_{k<n} w[r·ws + size·k] · x[t·xs + 4k]   (byte offsets)
//
// or, with ret, the 1×1 dot product returned as a result. Each accumulator
// is a vector of partial sums over k ≡ lane (mod vl), reduced horizontally
// at the end. Tiles with one token keep the activations in registers and
// unroll over k; wider tiles load each weight vector once per step and use
// it for all T tokens.
//
// One-token tiles no taller than the matrix-matrix ones (those that decode
// with) sum each row in one accumulator, in the same order as the wider
// tiles, so that a token's results do not depend on how many tokens share
// the product; the dot product and the taller matrix-vector tile split the
// sum over U accumulators, which hides the latency of the additions.
func floatTile(s isa, wt wtype, R, T int, ret, pf bool) {
	U, A := 1, 1 // steps of vl unrolled per iteration, accumulators
	if T == 1 {
		U = 2
		if R == 1 {
			U = 4
		}
		A = U
		if !ret && R <= floatRows(s) {
			A = 1
		}
	}
	var name string
	if pf {
		name = beginPrefetching(s, wt.name, R, T)
	} else {
		name = begin(s, wt.name, R, T, ret, "float32", "n", 0, false)
	}
	conv := map[string]string{"F32": "f32", "F16": "f16", "BF16": "bf16"}[wt.name]
	if ret {
		Doc(
			fmt.Sprintf("%s returns the dot product of n %s weights at w", name, wt.desc),
			"with n float32 activations at x:",
			"",
			"\tvar sum float32",
			"\tfor k := 0; k < n; k++ {",
			fmt.Sprintf("\t\tsum += %s(w[%d*k:]) * x[k]", conv, wt.size),
			"\t}",
			"\treturn sum",
			"",
			fmt.Sprintf("n must be a multiple of %d. The sum is kept in %d-lane vector", s.vl, s.vl),
			fmt.Sprintf("partial sums (%d accumulators) added together at the end.", A),
		)
	} else {
		lines := []string{
			fmt.Sprintf("%s computes a %d-row × %d-token tile of dot products of", name, R, T),
			fmt.Sprintf("%s weights (row stride ws bytes) with float32 activations,", wt.desc),
			fmt.Sprintf("packed %d tokens × %d values at a time:", T, s.vl),
			"",
			fmt.Sprintf("\tfor r := 0; r < %d; r++ {", R),
			fmt.Sprintf("\t\tfor t := 0; t < %d; t++ {", T),
			"\t\t\tvar sum float32",
			"\t\t\tfor k := 0; k < n; k++ {",
			fmt.Sprintf("\t\t\t\tsum += %s(w[r*ws+%d*k:]) * x[(k/%d*%d+t)*%d+k%%%d]", conv, wt.size, s.vl, T, s.vl, s.vl),
			"\t\t\t}",
			"\t\t\tout[t*os/4+r] += sum",
			"\t\t}",
			"\t}",
			"",
			fmt.Sprintf("n must be a multiple of %d. The sums are kept in %d-lane vector", s.vl, s.vl),
			fmt.Sprintf("partial sums (%d accumulator(s) per output) added together at the end.", A),
		}
		if pf {
			lines = append(lines, "",
				fmt.Sprintf("It also prefetches the n·%d bytes at pf, one cache line a step: a row", wt.size),
				"of the next row group, which the caller names. The sums are the tile's",
				fmt.Sprintf("without prefetching (tile%s_%dx%d_%s), bit for bit.", wt.name, R, T, s.name))
		}
		Doc(lines...)
	}
	wp := ptrs("w", "ws", R)
	var pfp Register
	if pf {
		pfp = Load(Param("pf"), GP64())
	}
	xb := Load(Param("x"), GP64())
	n := Load(Param("n"), GP64())
	k := GP64()
	XORQ(k, k)
	s.beginKernel()

	acc := make([][][]VecVirtual, R)
	for r := range acc {
		acc[r] = make([][]VecVirtual, T)
		for t := range acc[r] {
			acc[r][t] = make([]VecVirtual, A)
			for u := range acc[r][t] {
				acc[r][t][u] = s.wide()
				s.zero(acc[r][t][u])
			}
		}
	}
	wmem := func(r, off int) Mem {
		return Mem{Base: wp[r], Index: k, Scale: uint8(wt.size), Disp: off * wt.size}
	}
	// One token reads its activations at x + 4k. Several tokens read them
	// packed (see the doc comment) through a pointer that advances with k:
	// their rows are usually a multiple of 4 KiB apart, and seven
	// streams that map to the same L1 sets evict each other.
	xmem := func(t, off int) Mem {
		if T == 1 {
			return Mem{Base: xb, Index: k, Scale: 4, Disp: off * 4}
		}
		return Mem{Base: xb, Disp: (t*s.vl + off) * 4}
	}
	step := func(u0, nu int) {
		if T == 1 && nu > 1 {
			prefetch(wp, k, uint8(wt.size), 0, nu*s.vl*wt.size)
		}
		if T == 1 {
			for u := u0; u < u0+nu; u++ {
				xv := s.wide()
				VMOVUPS(xmem(0, (u-u0)*s.vl), xv)
				for r := 0; r < R; r++ {
					a := acc[r][0][u%A]
					if wt == wF32 {
						VFMADD231PS(wmem(r, (u-u0)*s.vl), xv, a)
						continue
					}
					wv := s.wide()
					loadW(s, wt, wmem(r, (u-u0)*s.vl), wv)
					VFMADD231PS(wv, xv, a)
				}
			}
			return
		}
		if pf {
			PREFETCHT0(Mem{Base: pfp, Index: k, Scale: uint8(wt.size)})
		}
		wv := make([]VecVirtual, R)
		for r := range wv {
			wv[r] = s.wide()
			loadW(s, wt, wmem(r, 0), wv[r])
		}
		for t := 0; t < T; t++ {
			if R == 1 {
				VFMADD231PS(xmem(t, 0), wv[0], acc[0][t][0])
				continue
			}
			xv := s.wide()
			VMOVUPS(xmem(t, 0), xv)
			for r := 0; r < R; r++ {
				VFMADD231PS(wv[r], xv, acc[r][t][0])
			}
		}
	}

	if U > 1 {
		nMain := GP64()
		MOVQ(n, nMain)
		ANDQ(I32(-s.vl*U), nMain)
		Label("main")
		CMPQ(k, nMain)
		JGE(LabelRef("tail"))
		step(0, U)
		ADDQ(U32(s.vl*U), k)
		JMP(LabelRef("main"))
	}
	Label("tail")
	CMPQ(k, n)
	JGE(LabelRef("done"))
	step(0, 1)
	ADDQ(U32(s.vl), k)
	if T > 1 {
		ADDQ(U32(4*s.vl*T), xb)
	}
	JMP(LabelRef("tail"))

	Label("done")
	sums := make([][]VecVirtual, R)
	for r := range sums {
		sums[r] = make([]VecVirtual, T)
		for t := range sums[r] {
			a := acc[r][t]
			for u := 1; u < A; u++ {
				VADDPS(a[u], a[0], a[0])
			}
			sums[r][t] = a[0]
		}
	}
	finish(s, sums, ret)
}
