//go:build amd64 && !purego

package vec

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/baton-serving/baton/kernels/quant"
)

// geometryOf returns the geometry an assembly implementation was built
// from; ok is false for the pure-Go one.
func geometryOf(im *impl) (g geometry, ok bool) {
	switch im {
	case avx512Impl:
		return avx512Geometry, true
	case avx2Impl:
		return avx2Geometry, true
	}
	return g, false
}

// TestPrefetchingTiles: float matrix-matrix products give the same bits
// with the prefetching tiles (tileF32_4x4P_AVX512 and the like) as without
// them, over shapes with row-group, token-tile and column edges; the
// prefetches read no further than the weights they are given.
func TestPrefetchingTiles(t *testing.T) {
	for _, im := range impls() {
		g, ok := geometryOf(im)
		if !ok {
			continue
		}
		if g.main.f32PF == nil || g.main.f16PF == nil || g.main.bf16PF == nil {
			t.Fatalf("%s: no prefetching tiles", im.name)
		}
		plain := *g.main
		plain.f32PF, plain.f16PF, plain.bf16PF = nil, nil, nil
		g.main = &plain
		without := newAsmImpl(im.name+"-noprefetch", g)
		rng := rand.New(rand.NewPCG(31, 32))
		for _, sh := range [][3]int{{8, 64, 4}, {19, 80, 16}, {33, 1040, 9}, {64, 2048, 32}, {13, 48, 3}, {70, 96, 70}} {
			rows, cols, tokens := sh[0], sh[1], sh[2]
			x := randF32(rng, tokens*cols, 1)
			w32 := randF32(rng, rows*cols, 1)
			w16 := make([]byte, 2*rows*cols)
			for i := range rows * cols {
				h := quant.F32ToF16(w32[i])
				w16[2*i], w16[2*i+1] = byte(h), byte(h>>8)
			}
			for _, typ := range []string{"F32", "F16", "BF16"} {
				run := func(im *impl) []float32 {
					dst := make([]float32, tokens*rows)
					switch typ {
					case "F32":
						im.matMulF32(dst, rows, w32, x, nil, rows, cols, tokens)
					case "F16":
						im.matMulF16(dst, rows, w16, x, nil, rows, cols, tokens)
					default:
						im.matMulBF16(dst, rows, w16, x, nil, rows, cols, tokens)
					}
					return dst
				}
				got, want := run(im), run(without)
				for i := range want {
					if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
						t.Errorf("%s %s %v: element %d = %v with prefetching, %v without", im.name, typ, sh, i, got[i], want[i])
						break
					}
				}
			}
		}
	}
}

// BenchmarkDecodeBatch: a product of 16 tokens, as a batched decode step
// computes, with weights read from memory (a 98 MB F32 matrix, the 110M
// shape's output layer: larger than the caches), with and without the
// prefetching tiles.
func BenchmarkDecodeBatch(b *testing.B) {
	for _, im := range impls() {
		g, ok := geometryOf(im)
		if !ok {
			continue
		}
		plain := *g.main
		plain.f32PF = nil
		g.main = &plain
		without := newAsmImpl(im.name+"-noprefetch", g)
		const rows, cols, tokens = 32000, 768, 16
		rng := rand.New(rand.NewPCG(33, 34))
		w, x := randF32(rng, rows*cols, 1), randF32(rng, tokens*cols, 1)
		dst := make([]float32, tokens*rows)
		for _, v := range []*impl{im, without} {
			b.Run(fmt.Sprintf("F32/%s", v.name), func(b *testing.B) {
				b.SetBytes(int64(4 * rows * cols))
				for b.Loop() {
					v.matMulF32(dst, rows, w, x, nil, rows, cols, tokens)
				}
				reportFlops(b, float64(rows*cols*tokens))
			})
		}
	}
}
