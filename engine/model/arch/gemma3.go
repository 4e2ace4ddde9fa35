package arch

import (
	"fmt"
	"math"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/gguf"
	"github.com/baton-serving/baton/kernels"
)

// gemma3 is the text model of Gemma 3, as llama.cpp d32676d runs it
// (src/models/gemma3.cpp; ik_llama.cpp 8337e4cd3's build_gemma3 computes
// the same; llama.cpp c392e50 predates it): Gemma 2's blocks (embedding
// scale √embedding_length, post-attention and post-FFN norms, GeGLU, NeoX
// RoPE, norm weights stored as 1+w) with
//
//   - an RMSNorm of each query and key head (attn_q_norm, attn_k_norm)
//     after the projections, before RoPE;
//   - local (sliding-window) and global blocks, when the file has an
//     attention.sliding_window > 0: block il is global when
//     (il+1) % attention.sliding_window_pattern == 0 (default 6: five
//     local blocks to one global; 1: every block global; 0: every block
//     local). Local blocks attend through the window and rotate with
//     rope.freq_base_swa (default 10000) and no position scaling; global
//     blocks attend to the whole sequence with rope.freq_base (1e6 in
//     Google's files) and the file's rope.scaling (linear, factor 8, in
//     the 4B and larger models). Without a window (the key absent or 0,
//     which the converter writes for sliding_window_pattern 1) every
//     block is global;
//   - no attention soft-cap: the scores are q·k times 1/√head_dim (for 62
//     blocks, 27B, 1/√(embedding_length/head_count)) inside the softmax;
//   - the logits soft-capped by final_logit_softcapping when the file has
//     one > 0 (Google's Gemma 3 configs have none);
//   - an output.weight when the file has one, else the token embedding.
//
// llama.cpp reads sliding_window_pattern as a scalar and ignores an array
// (a per-layer list, which Gemma 3's converter never writes), keeping 6;
// Baton refuses an array instead of guessing which layers it meant.
func gemma3() *Arch {
	return &Arch{
		Name:       "gemma3",
		Tensors:    gemmaTensors(true),
		RopeLayout: kernels.RopeNeoX,
		Act:        GELU,
		Configure:  configureGemma3,
		Keys:       gemma3Keys,
	}
}

const (
	gemma3Pattern       = 6
	gemma3LocalRopeBase = 10000
	// gemma3Window is Gemma-3-1B's window, what the writer stores when
	// the Spec names none.
	gemma3Window = 512
)

func configureGemma3(m *Meta, c *Config) error {
	c.EmbedScale = sqrtf(c.Dim)
	qpas, err := gemmaQueryScalar(m, c, 62)
	if err != nil {
		return err
	}
	c.AttnScale = 1 / sqrtf(qpas)
	if err := optionalSoftCap(m, "final_logit_softcapping", &c.FinalSoftCap); err != nil {
		return err
	}
	wkey := m.Arch + ".attention.sliding_window"
	w, ok := m.F.Get(wkey)
	if !ok {
		return nil // no window: every block global, as llama.cpp reads it
	}
	if n, isInt := m.F.Uint(wkey); !isInt || n > MaxDim {
		return fmt.Errorf("model: %s = %v, want an integer in [0, %d]: %w", wkey, w, MaxDim, engine.ErrInvalidInput)
	} else if n == 0 {
		return nil
	}
	if c.SlidingWindow = gemmaWindow(m, c, 0); m.Err != nil {
		return m.Err
	}
	c.SWAPattern = gemma3Pattern
	key := m.Arch + ".attention.sliding_window_pattern"
	if v, ok := m.F.Get(key); ok {
		n, isInt := m.F.Uint(key)
		switch {
		case v.Type() == gguf.TypeArray:
			return fmt.Errorf("model: %s is an array (a per-layer pattern), which gemma3 does not support (llama.cpp would ignore it and take %d): %w", key, gemma3Pattern, engine.ErrUnsupported)
		case !isInt || n > MaxDim:
			return fmt.Errorf("model: %s = %v, want an integer in [0, %d]: %w", key, v, MaxDim, engine.ErrInvalidInput)
		}
		c.SWAPattern = int(n)
	}
	if c.SWAPattern == 1 {
		// Every block global: no local block to window or rotate apart.
		c.SlidingWindow, c.SWAPattern = 0, 0
		return nil
	}
	c.RopeBaseLocal = m.Float("rope.freq_base_swa", gemma3LocalRopeBase)
	return m.Err
}

// optionalSoftCap reads a soft-cap key that may be absent or 0 (no cap,
// as llama.cpp reads it), and is otherwise a finite number > 0.
func optionalSoftCap(m *Meta, suffix string, dst *float32) error {
	key := m.Arch + "." + suffix
	v, ok := m.F.Get(key)
	if !ok {
		return nil
	}
	f, isNum := m.F.Float(key)
	switch {
	case isNum && f == 0:
		return nil
	case !isNum || !(f > 0) || math.IsInf(f, 0) || f > math.MaxFloat32:
		return fmt.Errorf("model: %s = %v, want 0 (none) or a finite number > 0: %w", key, v, engine.ErrInvalidInput)
	}
	*dst = float32(f)
	return nil
}

// gemma3Keys are the keys llama.cpp's converter writes for Gemma 3 beyond
// the common ones: the window, and those that differ from llama.cpp's
// defaults (a local rope base other than 10000, a pattern other than 6, a
// final soft-cap), so that a file of the defaults holds the window alone.
func gemma3Keys(c Config) []KV {
	p := "gemma3."
	kvs := []KV{{p + "attention.sliding_window", gemmaKeyWindow(c, gemma3Window)}}
	if c.SWAPattern != 0 && c.SWAPattern != gemma3Pattern {
		kvs = append(kvs, KV{p + "attention.sliding_window_pattern", uint32(c.SWAPattern)})
	}
	if c.RopeBaseLocal != 0 && c.RopeBaseLocal != gemma3LocalRopeBase {
		kvs = append(kvs, KV{p + "rope.freq_base_swa", c.RopeBaseLocal})
	}
	if c.FinalSoftCap > 0 {
		kvs = append(kvs, KV{p + "final_logit_softcapping", c.FinalSoftCap})
	}
	return kvs
}
