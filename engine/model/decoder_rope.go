package model

import (
	"fmt"
	"math"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/model/arch"
	"github.com/baton-serving/baton/kernels"
)

// YaRN's correction range, as llama.cpp c392e50 defaults it
// (llama_context_default_params: yarn_beta_fast, yarn_beta_slow). They are
// llama.cpp command-line settings, not file metadata.
const (
	yarnBetaFast = 32
	yarnBetaSlow = 1
)

// ropeFactors checks the rope frequency factors m bound (Llama 3.1's
// rope_freqs, phi3's longrope pair) and returns the ones its RoPE divides
// frequencies by, as llama.cpp's build_rope_factors picks them: rope_freqs
// when present, else rope_factors_long when the context window in use
// exceeds the original one (Config.LongRope), else rope_factors_short.
// nil means none.
func (m *decoder) ropeFactors() ([]float32, error) {
	for _, r := range []arch.Role{arch.RopeFreqs, arch.RopeLong, arch.RopeShort} {
		for i, f := range m.g[r].v {
			if !(f > 0) || math.IsInf(float64(f), 0) {
				return nil, fmt.Errorf("model: %s[%d] = %v, want a finite number > 0: %w", ropeTensorName(m.a, r), i, f, engine.ErrInvalidInput)
			}
		}
	}
	switch {
	case m.g[arch.RopeFreqs].v != nil:
		return m.g[arch.RopeFreqs].v, nil
	case m.cfg.LongRope():
		return m.g[arch.RopeLong].v, nil
	default:
		return m.g[arch.RopeShort].v, nil
	}
}

// ropeTensorName is the GGUF name of a's tensor for the global role r.
func ropeTensorName(a *arch.Arch, r arch.Role) string {
	for _, t := range a.Tensors {
		if t.Parts[0].Role == r {
			return t.Name
		}
	}
	return r.String()
}

// ropeRow fills one token row's RoPE table for position pos: the angle of
// pair i is pos·RopeScale·base^(−2i/RopeDim)/factor[i], as ggml's rope
// computes it with ext_factor 0, and both cos and sin are multiplied by
// RopeAttnFactor (llama.cpp's attn_factor, 1 for most files). With YaRN
// (Config.RopeYarn, ext_factor 1) each angle blends the scaled and the
// unscaled one by YaRN's ramp, and the multiplier grows by
// 1 + 0.1·ln(1/RopeScale). Without either, it is exactly kernels.RopeTable.
func (m *decoder) ropeRow(cos, sin []float32, pos int) {
	c := m.cfg
	if !c.RopeYarn {
		kernels.RopeTable(cos, sin, pos, c.RopeBase, c.RopeScale, m.factors)
		if a := c.RopeAttnFactor; a != 1 && a != 0 {
			for i := range cos {
				cos[i] *= a
				sin[i] *= a
			}
		}
		return
	}
	lo, hi := yarnCorrDims(c.RopeDim, c.RopeOrigContext, c.RopeBase)
	scale := float64(c.RopeScale)
	mscale := float64(c.RopeAttnFactor)
	if mscale == 0 {
		mscale = 1
	}
	mscale *= 1 + 0.1*math.Log(1/scale)
	for i := range cos {
		extrap := float64(pos) * math.Pow(float64(c.RopeBase), -float64(2*i)/float64(c.RopeDim))
		if m.factors != nil {
			extrap /= float64(m.factors[i])
		}
		interp := scale * extrap
		// ggml's rope_yarn_ramp: 1 below the low correction dimension, 0
		// above the high one, linear between.
		y := (float64(i) - lo) / math.Max(0.001, hi-lo)
		mix := 1 - math.Min(1, math.Max(0, y))
		s, co := math.Sincos(interp*(1-mix) + extrap*mix)
		cos[i], sin[i] = float32(co*mscale), float32(s*mscale)
	}
}

// yarnCorrDims is ggml's ggml_rope_yarn_corr_dims, in its float32
// arithmetic (the floor and ceil make the rounding matter at the edges):
// the pair indices between which YaRN moves from extrapolating to
// interpolating.
func yarnCorrDims(dims, origCtx int, base float32) (lo, hi float64) {
	corr := func(rot float32) float32 {
		return float32(dims) * float32(math.Log(float64(float32(origCtx)/(rot*2*float32(math.Pi))))) / (2 * float32(math.Log(float64(base))))
	}
	start := math.Floor(float64(corr(yarnBetaFast)))
	end := math.Ceil(float64(corr(yarnBetaSlow)))
	return math.Max(0, start), math.Min(float64(dims-1), end)
}

// layerWindow is layer li's sliding attention window, 0 for none: every
// layer's when SWAPattern is 0 (phi3), else the local layers' (those with
// (li+1) % SWAPattern ≠ 0). A window at least as long as the context
// window masks nothing and is dropped, so such a model runs on backends
// without kernels.ExtendedOps.
func layerWindow(c Config, li int) int {
	w := c.SlidingWindow
	if w <= 0 || w >= c.ContextLength {
		return 0
	}
	if c.SWAPattern > 0 && (li+1)%c.SWAPattern == 0 {
		return 0
	}
	return w
}

// windowOps finds the backend's extended operations when a layer attends
// within a sliding window, and refuses a backend without them.
func (m *decoder) windowOps() error {
	for li := range m.cfg.Layers {
		if layerWindow(m.cfg, li) == 0 {
			continue
		}
		ext, ok := m.be.(kernels.ExtendedOps)
		if !ok {
			return fmt.Errorf("model: %s attends within a sliding window of %d positions, which backend %s does not run (no kernels.ExtendedOps): %w",
				m.a.Name, m.cfg.SlidingWindow, m.be.Name(), engine.ErrUnsupported)
		}
		m.ext = ext
		return nil
	}
	return nil
}
