//go:build amd64 && !purego

package vec

import "unsafe"

// fTile and qTile are the signatures of the generated register tiles: an
// R×T tile writes out[t·os/4 + r] for r < R, t < T, the dot product of
// weight row r (at w + r·ws) with activation row t, strides in bytes.
// Quantized tiles take nb blocks and find activation row t at x + t·xs.
// Float tiles take n elements (a multiple of the vector width vl) and
// activations packed by packTokens: vl values of token 0, vl values of
// token 1, …, then the next vl values of each token. For one token that is
// the plain row.
// fTilePF is the float matrix-matrix tile that also prefetches the row at
// pf (the same columns of a row of the next row group).
type (
	fTile   func(w *byte, ws int, x *float32, n int, out *float32, os int)
	fTilePF func(w *byte, ws int, x *float32, n int, out *float32, os int, pf *byte)
	qTile   func(w *byte, ws int, x *byte, xs int, nb int, out *float32, os int)
)

// kernelTables gathers one ISA's kernels by shape; tiles_amd64.go fills it.
type kernelTables struct {
	dotF32, dotF16, dotBF16 func(w *byte, x *float32, n int) float32
	dotQ                    [numQ]func(w, x *byte, nb int) float32
	f32, f16, bf16          [5][5]fTile
	f32PF, f16PF, bf16PF    fTilePF // the mmR×mmT tiles, prefetching
	q                       [numQ][5][5]qTile
}

// shape is the tiling used for one family of kernels: mmR×mmT tiles for
// matrix-matrix products, mvR×1 for matrix-vector ones, and dR×1 for
// one-token matrix-matrix products (decoding), which stream the weights
// from memory once. A dR×1 tile must sum each row in the order of the
// mmR×mmT tiles, so that a token's result does not depend on the batch.
// Every smaller tile must exist too, for the edges.
type shape struct{ mmR, mmT, mvR, dR int }

type geometry struct {
	vl             int // float32 lanes of the float kernels
	chunk          int // row piece of float matrix-matrix products, a multiple of vl
	chunk16        int // the same for 2-byte weights (F16, BF16)
	float, q80, kq shape
	main           *kernelTables // float, Q8_0 and Q4_0 kernels
	kquant         *kernelTables // Q4_K and Q6_K kernels
	legacy         *kernelTables // Q4_1, Q5_0, Q5_1 and IQ4_NL kernels
	lq             shape         // and their tiles
}

// actBudget bounds the bytes of activations a matrix-matrix product works
// on while it sweeps the weight rows once. Larger blocks mean fewer sweeps
// of the weights through memory; the activations then stream from L2 or
// L3, which keeps up with the tiles. For float weights it is also the size
// of the packed copy of the activations that each call allocates.
const actBudget = 512 << 10

// tokenBlock returns how many tokens to process per sweep over the weight
// rows: as many as fit in actBudget, in whole tiles.
func tokenBlock(rowBytes, mmT int) int {
	tb := actBudget / max(rowBytes, 1) / mmT * mmT
	return max(tb, mmT)
}

// fKernels drives the float tiles of one weight type.
type fKernels struct {
	dot   func(w *byte, x *float32, n int) float32
	tiles *[5][5]fTile
	// pf is the mmR×mmT tile that prefetches a row of the next row group
	// (nil: none, then the plain tile runs).
	pf fTilePF
	shape
	vl, size int
	chunk    int                                 // elements per row piece
	tail     func(w []byte, x []float32) float32 // pure Go, for cols % vl
}

func (k *fKernels) dotRow(w []byte, x []float32) float32 {
	n := len(x) &^ (k.vl - 1)
	var s float32
	if n > 0 {
		s = k.dot(&w[0], &x[0], n)
	}
	if n < len(x) {
		s += k.tail(w[n*k.size:], x[n:])
	}
	return s
}

// dot4 computes the dot products with x of four weight rows stride values
// apart in one 4×1 tile, the rest of each row (len(x) mod vl) in Go.
func (k *fKernels) dot4(dst *[4]float32, w []byte, stride int, x []float32) {
	n := len(x) &^ (k.vl - 1)
	*dst = [4]float32{}
	if n > 0 {
		k.tiles[4][1](&w[0], stride*k.size, &x[0], n, &dst[0], 0)
	}
	if n < len(x) {
		for i := range dst {
			dst[i] += k.tail(w[(i*stride+n)*k.size:(i*stride+len(x))*k.size], x[n:])
		}
	}
}

func (k *fKernels) matVec(dst []float32, w []byte, x []float32, rows, cols int) {
	rb := cols * k.size
	n := cols &^ (k.vl - 1)
	clear(dst[:rows]) // the tiles accumulate
	if n > 0 {
		for r := 0; r < rows; {
			R := min(k.mvR, rows-r)
			k.tiles[R][1](&w[r*rb], rb, &x[0], n, &dst[r], 0)
			r += R
		}
	}
	if n < cols {
		for r := range dst[:rows] {
			dst[r] += k.tail(w[r*rb+n*k.size:(r+1)*rb], x[n:])
		}
	}
}

// Matrix-matrix products work on pieces of the rows, so that a tile's
// weights and activations stay in L1 while the tile moves across the
// tokens instead of streaming from L2: qChunkBytes of activations per
// token for quantized weights, geometry.chunk elements for float ones.
const qChunkBytes = 4096

// packLen is the length of tokens packed activation rows of cols values:
// the whole vectors of each row (packTokens' layout, tile by tile).
func (k *fKernels) packLen(cols, tokens int) int { return tokens * (cols &^ (k.vl - 1)) }

// pack lays out tokens rows of x in tiles of mmT tokens, as matMul packs
// each token block: token blocks are whole tiles, so a block of the whole
// packing is the block matMul would have packed.
func (k *fKernels) pack(dst, x []float32, cols, tokens int) {
	n := cols &^ (k.vl - 1)
	for t := 0; t < tokens; t += k.mmT {
		T := min(k.mmT, tokens-t)
		packTokens(dst[t*n:(t+T)*n], x[t*cols:], cols, n, T, k.vl)
	}
}

func (k *fKernels) matMul(dst []float32, ldd int, w []byte, x, xp []float32, rows, cols, tokens int) {
	for t := range tokens {
		clear(dst[t*ldd : t*ldd+rows]) // the tiles accumulate
	}
	rb := cols * k.size
	n := cols &^ (k.vl - 1)
	if n > 0 {
		tb := min(tokenBlock(4*n, k.mmT), tokens)
		kc := k.chunk
		var packed []float32
		switch {
		case tokens == 1:
			// One token's packed order is its row: decoding copies nothing.
			packed = x[:n]
		case xp == nil:
			packed = make([]float32, tb*n)
		}
		for t0 := 0; t0 < tokens; t0 += tb {
			t1 := min(t0+tb, tokens)
			if tokens > 1 && xp != nil {
				packed = xp[t0*n : t1*n]
			} else if tokens > 1 {
				for t := t0; t < t1; t += k.mmT {
					T := min(k.mmT, t1-t)
					packTokens(packed[(t-t0)*n:(t-t0+T)*n], x[t*cols:], cols, n, T, k.vl)
				}
			}
			mmR := k.mmR
			if tokens == 1 {
				mmR = k.dR
			}
			for r := 0; r < rows; r += mmR {
				R := min(mmR, rows-r)
				for c := 0; c < n; c += kc {
					m := min(kc, n-c)
					for t := t0; t < t1; t += k.mmT {
						T := min(k.mmT, t1-t)
						// Packed, a token tile's values c.. start at T·c.
						wt, xt, out := &w[r*rb+c*k.size], &packed[(t-t0)*n+T*c], &dst[t*ldd+r]
						// The j-th token tile over these columns prefetches
						// them in row j of the next row group: its weights
						// come from memory while this group computes.
						if j := (t - t0) / k.mmT; k.pf != nil && R == k.mmR && T == k.mmT && j < mmR && r+mmR+j < rows {
							k.pf(wt, rb, xt, m, out, 4*ldd, &w[(r+mmR+j)*rb+c*k.size])
							continue
						}
						k.tiles[R][T](wt, rb, xt, m, out, 4*ldd)
					}
				}
			}
		}
	}
	if n < cols {
		for t := range tokens {
			xt := x[t*cols+n : (t+1)*cols]
			out := dst[t*ldd : t*ldd+rows]
			for r := range out {
				out[r] += k.tail(w[r*rb+n*k.size:(r+1)*rb], xt)
			}
		}
	}
}

// packTokens interleaves the first n values of T activation rows (row t at
// x[t·cols:]) vl values at a time into dst (T·n values): dst holds values
// k..k+vl of token 0, then of token 1, and so on, for k = 0, vl, 2·vl, ….
func packTokens(dst, x []float32, cols, n, T, vl int) {
	for t := range T {
		row := x[t*cols : t*cols+n]
		for k := 0; k < n; k += vl {
			copy(dst[(k/vl*T+t)*vl:][:vl], row[k:k+vl])
		}
	}
}

// qKernels drives the tiles of one quantized weight type.
type qKernels struct {
	dot   func(w, x *byte, nb int) float32
	tiles *[5][5]qTile
	shape
	wBytes, xBytes int
}

func (k *qKernels) dotRow(w, xq []byte, nb int) float32 {
	if nb == 0 {
		return 0
	}
	return k.dot(&w[0], &xq[0], nb)
}

func (k *qKernels) matVec(dst []float32, w, xq []byte, rows, nb int) {
	clear(dst[:rows]) // the tiles accumulate
	if nb == 0 {
		return
	}
	rb := nb * k.wBytes
	for r := 0; r < rows; {
		R := min(k.mvR, rows-r)
		k.tiles[R][1](&w[r*rb], rb, &xq[0], 0, nb, &dst[r], 0)
		r += R
	}
}

func (k *qKernels) matMul(dst []float32, ldd int, w, xq []byte, rows, nb, tokens int) {
	for t := range tokens {
		clear(dst[t*ldd : t*ldd+rows]) // the tiles accumulate
	}
	if nb == 0 {
		return
	}
	rb, xr := nb*k.wBytes, nb*k.xBytes
	tb := tokenBlock(xr, k.mmT)
	// Blocks per chunk, even so that the AVX-512 kernels, which take
	// blocks in pairs, see an odd count only at the end of a row.
	kc := max(2, qChunkBytes/k.xBytes&^1)
	mmR := k.mmR
	if tokens == 1 {
		mmR = k.dR
	}
	for t0 := 0; t0 < tokens; t0 += tb {
		t1 := min(t0+tb, tokens)
		for r := 0; r < rows; r += mmR {
			R := min(mmR, rows-r)
			for c := 0; c < nb; c += kc {
				m := min(kc, nb-c)
				for t := t0; t < t1; t += k.mmT {
					T := min(k.mmT, t1-t)
					k.tiles[R][T](&w[r*rb+c*k.wBytes], rb, &xq[t*xr+c*k.xBytes], xr, m, &dst[t*ldd+r], 4*ldd)
				}
			}
		}
	}
}

// f32Bytes views float32 weights as their bytes (little-endian on amd64).
func f32Bytes(w []float32) []byte {
	if len(w) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&w[0])), 4*len(w))
}

func tailF32(w []byte, x []float32) float32 {
	return dotF32Go(unsafe.Slice((*float32)(unsafe.Pointer(&w[0])), len(x)), x)
}

func newAsmImpl(name string, g geometry) *impl {
	kt := g.main
	f := func(dot func(w *byte, x *float32, n int) float32, tiles *[5][5]fTile, pf fTilePF, size int,
		tail func(w []byte, x []float32) float32) *fKernels {
		chunk := g.chunk
		if size == 2 {
			chunk = g.chunk16
		}
		return &fKernels{dot: dot, tiles: tiles, pf: pf, shape: g.float, vl: g.vl, size: size, chunk: chunk, tail: tail}
	}
	f32 := f(kt.dotF32, &kt.f32, kt.f32PF, 4, tailF32)
	f16 := f(kt.dotF16, &kt.f16, kt.f16PF, 2, dotF16Go)
	bf16 := f(kt.dotBF16, &kt.bf16, kt.bf16PF, 2, dotBF16Go)
	im := &impl{
		name:   name,
		dotF32: func(a, b []float32) float32 { return f32.dotRow(f32Bytes(a), b) },
		dot4F32: func(dst *[4]float32, w []float32, stride int, x []float32) {
			f32.dot4(dst, f32Bytes(w), stride, x)
		},
		dot4F16: f16.dot4,
		dotF16:  f16.dotRow,
		dotBF16: bf16.dotRow,
		matVecF32: func(dst, w, x []float32, rows, cols int) {
			f32.matVec(dst, f32Bytes(w), x, rows, cols)
		},
		matVecF16:  f16.matVec,
		matVecBF16: bf16.matVec,
		matMulF32: func(dst []float32, ldd int, w, x, xp []float32, rows, cols, tokens int) {
			f32.matMul(dst, ldd, f32Bytes(w), x, xp, rows, cols, tokens)
		},
		packLen:    f32.packLen,
		pack:       f32.pack,
		matMulF16:  f16.matMul,
		matMulBF16: bf16.matMul,
		quantQ8_0:  quantQ8_0Asm,
		quantQ8_K:  quantQ8_KAsm,
		quantQ8_1:  quantQ8_1Asm,
		expSum:     expSumAsm,
		axpy4:      axpy4Asm,
		axpy4F16:   axpy4F16Asm,
	}
	for q := range numQ {
		sh, qt := g.q80, g.main
		if q == q4_K || q == q6_K || isKQuant2(q) {
			sh, qt = g.kq, g.kquant
		}
		if isKQuant2(q) && g.main.dotQ[q] != nil {
			qt = g.main // this ISA's own kernels (AVX-512: vpdpwssd)
		}
		if legacyQ(q) {
			sh, qt = g.lq, g.legacy
		}
		k := &qKernels{dot: qt.dotQ[q], tiles: &qt.q[q], shape: sh,
			wBytes: qinfo[q].wBytes, xBytes: qinfo[q].xBytes}
		im.dotQ[q] = k.dotRow
		im.matVecQ[q] = k.matVec
		im.matMulQ[q] = k.matMul
	}
	return im
}

// The activation quantizers are AVX2 code, shared by both implementations.

func quantQ8_0Asm(x []float32, dst []byte) {
	if nb := len(x) / Q8_0Values; nb > 0 {
		quantQ8_0AVX2(&x[0], &dst[0], nb)
	}
}

func quantQ8_KAsm(x []float32, dst []byte) {
	if nb := len(x) / Q8_KValues; nb > 0 {
		quantQ8_KAVX2(&x[0], &dst[0], nb)
	}
}

func expSumAsm(dst, x []float32, shift float32) float32 {
	n := len(x) &^ 7
	var s float32
	if n > 0 {
		s = expSumAVX2(&dst[0], &x[0], n, shift)
	}
	if n < len(x) {
		s += expSumGo(dst[n:len(x)], x[n:], shift)
	}
	return s
}

func axpy4Asm(y []float32, e *[4]float32, v0, v1, v2, v3 []float32) {
	n := len(y) &^ 7
	if n > 0 {
		axpy4F32AVX2(&y[0], e, f32Ptr(v0), f32Ptr(v1), f32Ptr(v2), f32Ptr(v3), n)
	}
	if n < len(y) {
		axpy4Go(y[n:], e, v0[n:], v1[n:], v2[n:], v3[n:])
	}
}

func axpy4F16Asm(y []float32, e *[4]float32, v0, v1, v2, v3 []byte) {
	n := len(y) &^ 7
	if n > 0 {
		axpy4F16AVX2(&y[0], e, &v0[0], &v1[0], &v2[0], &v3[0], n)
	}
	if n < len(y) {
		axpy4F16Go(y[n:], e, v0[2*n:], v1[2*n:], v2[2*n:], v3[2*n:])
	}
}

// f32Ptr is the address of a float32 row as bytes, for the kernels that
// take rows of either width.
func f32Ptr(v []float32) *byte { return (*byte)(unsafe.Pointer(&v[0])) }
