//go:build amd64 && !purego

package vec

// quantQ8_1Asm is the AVX2 Q8_1 activation quantizer, shared by both
// assembly implementations like the other quantizers.
func quantQ8_1Asm(x []float32, dst []byte) {
	if nb := len(x) / Q8_1Values; nb > 0 {
		quantQ8_1AVX2(&x[0], &dst[0], nb)
	}
}
