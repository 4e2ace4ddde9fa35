package model

import (
	"math"

	"github.com/baton-serving/baton/kernels"
)

// YaRN's correction range, in rotations over the original context: pairs
// that turn more than yarnBetaFast times are extrapolated, fewer than
// yarnBetaSlow times interpolated (llama.cpp's defaults).
const (
	yarnBetaFast = 32
	yarnBetaSlow = 1
)

// ropeTable fills the RoPE table of one position for configuration c: what
// kernels.RopeTable computes, and with YaRN or an attention factor their
// corrections too, in float64 as RopeTable does:
//
//	θ_i    = pos · base^(−2i/RopeDim) / freqs_i    (extrapolated)
//	θ'_i   = RopeScale · θ_i                        (interpolated)
//	r_i    = 1 − clamp((i − lo)/max(0.001, hi − lo), 0, 1)
//	angle  = θ'_i·(1 − r_i) + θ_i·r_i
//	cos, sin ← (cos, sin)(angle) · attn · (1 + 0.1·ln(1/RopeScale))
//
// where lo and hi are the pair indices at which a pair turns yarnBetaFast
// and yarnBetaSlow times over RopeYarnOrigCtx positions (floor and ceil,
// clamped to [0, RopeDim−1]), as ggml's rope with ext_factor 1 does.
func ropeTable(cos, sin []float32, pos int, c Config, freqs []float32) {
	if c.RopeYarnOrigCtx == 0 && (c.RopeAttnFactor == 0 || c.RopeAttnFactor == 1) {
		kernels.RopeTable(cos, sin, pos, c.RopeBase, c.RopeScale, freqs)
		return
	}
	sin = sin[:len(cos)]
	base, scale, dims := float64(c.RopeBase), float64(c.RopeScale), float64(c.RopeDim)
	mscale := 1.0
	if c.RopeAttnFactor > 0 {
		mscale = float64(c.RopeAttnFactor)
	}
	var lo, hi float64
	if c.RopeYarnOrigCtx > 0 {
		corr := func(beta float64) float64 {
			return dims * math.Log(float64(c.RopeYarnOrigCtx)/(beta*2*math.Pi)) / (2 * math.Log(base))
		}
		lo = max(0, math.Floor(corr(yarnBetaFast)))
		hi = min(dims-1, math.Ceil(corr(yarnBetaSlow)))
		mscale *= 1 + 0.1*math.Log(1/scale)
	}
	for i := range cos {
		theta := float64(pos) * math.Pow(base, -float64(2*i)/dims)
		if freqs != nil {
			theta /= float64(freqs[i])
		}
		angle := scale * theta
		if c.RopeYarnOrigCtx > 0 {
			r := 1 - min(1, max(0, (float64(i)-lo)/max(0.001, hi-lo)))
			angle = angle*(1-r) + theta*r
		}
		s, co := math.Sincos(angle)
		cos[i], sin[i] = float32(co*mscale), float32(s*mscale)
	}
}
