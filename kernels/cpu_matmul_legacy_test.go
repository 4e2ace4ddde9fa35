package kernels

import (
	"math"

	"github.com/baton-serving/baton/kernels/quant"
)

// offsetErr bounds the error that Q4_1 and Q5_1 weights add to a product
// with x beyond the activations' rounding: their kernels take a block's
// offset m times the Q8_1 block sum s = d·Σq, which is stored as binary16
// (within 2⁻¹¹ of itself, and |s| ≤ Σ|x| plus half a step per value). The
// offset is the block's least dequantized value, which its level 0 holds.
func offsetErr(typ quant.Type, w, x []float32) float64 {
	if typ != quant.Q4_1 && typ != quant.Q5_1 {
		return 0
	}
	var e float64
	for b := 0; b < len(x); b += 32 {
		m, sx, amax := math.Inf(1), 0.0, 0.0
		for i := b; i < b+32; i++ {
			m = min(m, float64(w[i]))
			sx += math.Abs(float64(x[i]))
			amax = max(amax, math.Abs(float64(x[i])))
		}
		e += math.Abs(m) * (sx + 16*amax/127) / 2048
	}
	return e
}
