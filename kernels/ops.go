package kernels

import (
	"math"
)

// These are the plain-Go reference operations. Each works on caller-owned
// slices and allocates nothing, so a faster backend can replace any one of them
// and be tested against it element by element. Slice lengths are the caller's
// contract: the model binds shapes once at load time and never passes
// mismatched slices, so the functions do not re-check them on the hot path.

// Dot returns the inner product of a and b over len(a) elements.
func Dot(a, b []float32) float32 {
	b = b[:len(a)]
	var s float32
	for i, v := range a {
		s += v * b[i]
	}
	return s
}

// RMSNorm writes x / rms(x) * weight to dst, where rms(x) = sqrt(mean(x²) + eps).
// dst may alias x. The sum of squares is accumulated in float64 so that long
// rows (8192+ elements) do not lose the small components.
//
// The rounding is ggml-cpu's rms_norm followed by its weight multiplication,
// bit for bit: float32 squares summed in float64, the mean rounded to
// float32, scale = 1/sqrtf(mean + eps) in float32, and (x·scale)·w. The norm
// feeds the activation quantizers (Q8_0, Q8_K) of quantized weights, where
// rows of a quantized embedding normalize to values exactly on rounding
// ties: a last-bit difference there changes a quantized activation by a
// whole step, and the model's outputs by far more than rounding
// (TestRMSNormMatchesGGML).
func RMSNorm(dst, x, weight []float32, eps float32) {
	var ss float64
	for _, v := range x {
		ss += float64(float32(v * v))
	}
	mean := float32(ss / float64(len(x)))
	scale := 1 / float32(math.Sqrt(float64(mean+eps)))
	weight = weight[:len(x)]
	dst = dst[:len(x)]
	for i, v := range x {
		dst[i] = float32(v*scale) * weight[i]
	}
}

// RopeLayout says which elements of a head vector RoPE rotates together.
type RopeLayout int

const (
	// RopeNormal rotates adjacent pairs (x[2i], x[2i+1]): llama.cpp's rope
	// type 0, used by the llama architecture (whose converters permute Q/K so
	// that Hugging Face weights fit it).
	RopeNormal RopeLayout = iota
	// RopeNeoX rotates the halves (x[i], x[i+d/2]) of the rotated dimensions
	// d: GPT-NeoX's layout, used by qwen2 and others.
	RopeNeoX
)

// String names the layout as llama.cpp does.
func (l RopeLayout) String() string {
	switch l {
	case RopeNormal:
		return "normal"
	case RopeNeoX:
		return "neox"
	}
	return "unknown"
}

// RopeTable fills cos[i] and sin[i] with the rotation of frequency pair i at
// position pos: theta_i = pos·freqScale · base^(-2i/rotDim) / factor_i, where
// rotDim = 2·len(cos) and factor_i = freqFactors[i] when freqFactors is not nil
// (Llama 3.1's rope_freqs), 1 otherwise. The angle is computed in float64:
// float32 would lose ~1e-5 rad at positions in the thousands.
func RopeTable(cos, sin []float32, pos int, base, freqScale float32, freqFactors []float32) {
	rotDim := 2 * len(cos)
	sin = sin[:len(cos)]
	p := float64(pos) * float64(freqScale)
	for i := range cos {
		theta := p * math.Pow(float64(base), -float64(2*i)/float64(rotDim))
		if freqFactors != nil {
			theta /= float64(freqFactors[i])
		}
		s, c := math.Sincos(theta)
		cos[i], sin[i] = float32(c), float32(s)
	}
}

// Rope rotates one head vector x in place with the table from RopeTable. Only
// the first 2·len(cos) elements are rotated; the rest pass through unchanged
// (partial rotary embeddings).
func Rope(x, cos, sin []float32, layout RopeLayout) {
	n := len(cos)
	sin = sin[:n]
	switch layout {
	case RopeNeoX:
		lo, hi := x[:n], x[n:2*n]
		for i := range n {
			a, b := lo[i], hi[i]
			lo[i] = a*cos[i] - b*sin[i]
			hi[i] = a*sin[i] + b*cos[i]
		}
	default:
		x = x[:2*n]
		for i := range n {
			a, b := x[2*i], x[2*i+1]
			x[2*i] = a*cos[i] - b*sin[i]
			x[2*i+1] = a*sin[i] + b*cos[i]
		}
	}
}

// Softmax replaces x with exp(x - max(x)) / Σ exp(x - max(x)). Subtracting the
// maximum keeps every exponent ≤ 0, so large logits cannot overflow; the sum is
// kept in float64. An empty x is left alone.
func Softmax(x []float32) {
	if len(x) == 0 {
		return
	}
	m := x[0]
	for _, v := range x[1:] {
		if v > m {
			m = v
		}
	}
	var sum float64
	for i, v := range x {
		e := float32(math.Exp(float64(v - m)))
		x[i] = e
		sum += float64(e)
	}
	inv := float32(1 / sum)
	for i := range x {
		x[i] *= inv
	}
}

// SiLU returns x·sigmoid(x).
func SiLU(x float32) float32 {
	return x / (1 + float32(math.Exp(float64(-x))))
}

// SiLUMul writes silu(gate[i])·up[i] to dst: the SwiGLU activation of a
// gated feed-forward block. dst may alias gate or up.
func SiLUMul(dst, gate, up []float32) {
	gate = gate[:len(dst)]
	up = up[:len(dst)]
	for i := range dst {
		dst[i] = SiLU(gate[i]) * up[i]
	}
}

// Add writes a[i]+b[i] to dst. dst may alias a or b (the residual stream adds
// in place).
func Add(dst, a, b []float32) {
	a = a[:len(dst)]
	b = b[:len(dst)]
	for i := range dst {
		dst[i] = a[i] + b[i]
	}
}

// AttendHead computes scaled dot-product attention of one query head q over n
// cached positions and writes the weighted sum of values to out (len(q)
// elements). k and v start at this head's first element of position 0, and
// consecutive positions are stride elements apart — the layout of a
// contiguous cache whose rows hold every KV head side by side. scores is
// scratch space of at least n elements. Scores are scaled by 1/sqrt(len(q)).
func AttendHead(out, q, k, v []float32, n, stride int, scores []float32) {
	d := len(q)
	scale := float32(1 / math.Sqrt(float64(d)))
	scores = scores[:n]
	for t := range n {
		scores[t] = Dot(q, k[t*stride:t*stride+d]) * scale
	}
	Softmax(scores)
	out = out[:d]
	clear(out)
	for t, w := range scores {
		row := v[t*stride : t*stride+d]
		for i, x := range row {
			out[i] += w * x
		}
	}
}

// Attention computes causal attention for one query position over the first n
// positions of a contiguous K/V cache with grouped-query heads. q and out hold
// nHeads heads of headDim elements; k and v hold n rows of nKVHeads·headDim
// elements. Query head h reads KV head h / (nHeads/nKVHeads), so each KV head
// serves a run of consecutive query heads (llama.cpp's and Hugging Face's
// mapping). scores is scratch space of at least n elements. nHeads must be a
// multiple of nKVHeads; the model checks that at load time.
func Attention(out, q, k, v []float32, n, nHeads, nKVHeads, headDim int, scores []float32) {
	group := nHeads / nKVHeads
	stride := nKVHeads * headDim
	for h := range nHeads {
		off := (h / group) * headDim
		AttendHead(out[h*headDim:(h+1)*headDim], q[h*headDim:(h+1)*headDim], k[off:], v[off:], n, stride, scores)
	}
}
