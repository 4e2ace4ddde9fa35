// Package kerneltest makes the random operands that the tests of the CPU
// backend (package kernels) and of the CUDA backend (kernels/cuda) share.
// Only tests import it.
package kerneltest

import "math/rand/v2"

// RandFloats returns n values uniform in [-scale, scale).
func RandFloats(rng *rand.Rand, n int, scale float32) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = (2*rng.Float32() - 1) * scale
	}
	return x
}

// ExactActivations returns n activations that Q8_0 and Q8_K quantize
// without loss: multiples q/128 of |q| ≤ 127, the first of every 32 being
// 127/128, so that every block's scale is exactly 1/128 (Q8_K's, −1/128).
// With them, a quantized product must equal the reference float product
// up to float rounding, and the CPU backend's quantized products compute
// the same sums as a GPU's float ones.
func ExactActivations(rng *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		if i%32 == 0 {
			x[i] = 127.0 / 128
		} else {
			x[i] = float32(rng.IntN(255)-127) / 128
		}
	}
	return x
}
