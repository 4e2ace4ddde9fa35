package vec

import (
	"math/rand/v2"
	"testing"
)

// The 1.1B-shape benchmarks compare the legacy types with Q4_0 and Q8_0 on
// the ffn_down matrix of TinyLlama 1.1B (2048 rows of 5632 values): MB/s
// is weight bytes streamed per second, single-threaded.
//
//	go test -bench 'Legacy1B' -run '^$' -benchtime=200ms ./vec/
var legacyBenchTypes = []string{"Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL"}

func BenchmarkMatVecLegacy1B(b *testing.B) { benchMatVec(b, 2048, 5632, 5, legacyBenchTypes) }

// BenchmarkMatMulLegacy1B: a 64-token prompt through the same matrix.
func BenchmarkMatMulLegacy1B(b *testing.B) {
	benchMatMul(b, 2048, 5632, 64, 6, legacyBenchTypes, false)
}

func BenchmarkQuantizeQ8_1(b *testing.B) {
	const n = 5632
	x := randF32(rand.New(rand.NewPCG(7, 7)), n, 1)
	dst := make([]byte, n/Q8_1Values*Q8_1Bytes)
	for _, im := range impls() {
		b.Run(im.name, func(b *testing.B) {
			b.SetBytes(4 * n)
			for b.Loop() {
				im.quantQ8_1(x, dst)
			}
		})
	}
}
