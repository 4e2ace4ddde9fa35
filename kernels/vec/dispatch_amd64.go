//go:build amd64 && !purego

package vec

import "golang.org/x/sys/cpu"

func chooseImpl() *impl { return impls()[0] }

// impls lists every implementation this build can run on this CPU, the
// preferred one first.
func impls() []*impl {
	var out []*impl
	x := &cpu.X86
	avx2 := x.HasAVX2 && x.HasFMA && x.HasF16C
	if avx2 && x.HasAVX512F && x.HasAVX512BW && x.HasAVX512VL && x.HasAVX512DQ && x.HasAVX512VNNI {
		out = append(out, avx512Impl)
	}
	if avx2 {
		out = append(out, avx2Impl)
	}
	return append(out, genericImpl)
}

// Register tiles (rows × tokens) of the generated kernels; they must match
// what kernels/internal/avogen emits, which tiles_amd64.go records. The
// K-quants have AVX2 kernels only (see the avogen command), which the
// AVX-512 implementation shares.
var (
	avx2Impl   = newAsmImpl("avx2", avx2Geometry)
	avx512Impl = newAsmImpl("avx512", avx512Geometry)

	avx2Geometry = geometry{
		vl:    8,
		chunk: 512, // 3 rows + 4 tokens: 28 KiB of F32 in a 32 KiB L1
		// Half-size weights leave room for twice the row piece, which
		// made F16 prompts 4-9% faster (1.1B shape, Zen 3).
		chunk16: 1024,
		float:   shape{mmR: 3, mmT: 4, mvR: 4, dR: 3},
		q80:     shape{mmR: 2, mmT: 4, mvR: 4, dR: 1}, // one row streams fastest (Zen 3)
		kq:      shape{mmR: 1, mmT: 4, mvR: 1, dR: 1},
		main:    kernelsAVX2,
		kquant:  kernelsAVX2,
		legacy:  kernelsAVX2,
		lq:      shape{mmR: 2, mmT: 4, mvR: 4, dR: 1},
	}
	avx512Geometry = geometry{
		vl:      16,
		chunk:   1024, // 4 rows + 4 tokens: 32 KiB of F32 in a 48 KiB L1
		chunk16: 1024,
		float:   shape{mmR: 4, mmT: 4, mvR: 4, dR: 4},
		q80:     shape{mmR: 4, mmT: 4, mvR: 4, dR: 4},
		kq:      shape{mmR: 1, mmT: 4, mvR: 1, dR: 1},
		main:    kernelsAVX512,
		kquant:  kernelsAVX2,
		legacy:  kernelsAVX512,
		lq:      shape{mmR: 4, mmT: 4, mvR: 4, dR: 4},
	}
)
