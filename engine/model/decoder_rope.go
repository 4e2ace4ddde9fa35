package model

import (
	"fmt"
	"math"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/model/arch"
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
