package model

import "github.com/baton-serving/baton/kernels/vec"

// siluBlock is the piece of a row whose exponentials are taken together,
// in a buffer on the stack.
const siluBlock = 256

// siluMul sets gate[i] = silu(gate[i])·up[i] = gate[i]/(1+e^(−gate[i]))·up[i]
// over rows of width elements: the SwiGLU activation between the
// feed-forward products. The exponentials come from vec.ExpSum, whose
// vector code is many times faster than math.Exp; it treats a slice's last
// len mod 8 elements separately, so each row is cut at the same places
// whatever the number of rows, and an element's result never depends on
// the batch.
func siluMul(gate, up []float32, width int) {
	up = up[:len(gate)]
	var buf [siluBlock]float32
	for r := 0; r+width <= len(gate); r += width {
		for b := r; b < r+width; b += siluBlock {
			g := gate[b:min(b+siluBlock, r+width)]
			u := up[b : b+len(g)]
			e := buf[:len(g)]
			for i, v := range g {
				e[i] = -v
			}
			vec.ExpSum(e, e, 0)
			for i, v := range g {
				g[i] = v / (1 + e[i]) * u[i]
			}
		}
	}
}
