package arch

import (
	"fmt"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/kernels"
)

// phi3 is Phi-3 (mini, small, medium; 4k and 128k) and Phi-4, which
// llama.cpp c392e50 files as "phi3" (llm_build_phi3): Llama's pre-norm
// blocks with the query, key and value projections fused into one
// attn_qkv matrix (rows: queries, keys, values) and the gate and up
// projections fused into ffn_up (rows: gate, then up; silu(gate)·up),
// NeoX RoPE, no biases. llama.cpp c392e50 requires output.weight; Baton
// ties a file without it to the embedding, as newer llama.cpp does for
// Phi-4-mini. The 128k variants carry longrope factors:
// rope_factors_long.weight and rope_factors_short.weight divide each
// pair's frequency, the long ones when the context window in use exceeds
// rope.scaling.original_context_length (Config.LongRope), and
// rope.scaling.attn_factor multiplies cos and sin. The factors have one
// value per rotated pair, rope.dimension_count/2, as llama.cpp d32676d
// declares them ({n_rot/2}): Phi-4-mini rotates 96 of its 128 head
// dimensions (partial_rotary_factor 0.75) and its files carry 48 factors.
// (c392e50 declared them head_dim/2, the same for Phi-3, whose rotation is
// whole; it could not load Phi-4-mini.)
//
// Phi-3 attends within a sliding window on every layer
// (attention.sliding_window; Phi-4 writes 0, no window), as llama.cpp
// c392e50 does and as the model was trained. llama.cpp d32676d turns
// phi3's window off whatever the file says (it logs "Phi SWA is currently
// disabled", PR 13676, pending converters that write the window
// correctly); Baton keeps c392e50's behaviour, which the phi3 goldens were
// recorded with, so on a prompt longer than the window (2047 positions for
// Phi-3-mini-4k) Baton and d32676d compute differently (docs/models.md).
func phi3() *Arch {
	return &Arch{
		Name: "phi3",
		Tensors: []Tensor{
			Mat("token_embd.weight", TokEmbd, Vocab, Dim),
			Norm("output_norm.weight", OutputNorm, Dim),
			Mat("output.weight", Output, Vocab, Dim).Opt(),
			Vec("rope_factors_long.weight", RopeLong, RopePairs).Opt().init(Factors),
			Vec("rope_factors_short.weight", RopeShort, RopePairs).Opt().init(Factors),
			Norm("blk.%d.attn_norm.weight", AttnNorm, Dim),
			Fused("blk.%d.attn_qkv.weight", Dim, Part{Wq, QDim}, Part{Wk, KVDim}, Part{Wv, KVDim}),
			Mat("blk.%d.attn_output.weight", Wo, Dim, QDim),
			Norm("blk.%d.ffn_norm.weight", FFNNorm, Dim),
			Fused("blk.%d.ffn_up.weight", Dim, Part{Gate, Hidden}, Part{Up, Hidden}),
			Mat("blk.%d.ffn_down.weight", Down, Dim, Hidden),
		},
		RopeLayout: kernels.RopeNeoX,
		Act:        SiLU,
		SquareAttn: true,
		Configure:  configurePhi3,
		Keys: func(c Config) []KV {
			return []KV{{"phi3.attention.sliding_window", uint32(c.SlidingWindow)}}
		},
	}
}

// init returns t with its writer fill set to i.
func (t Tensor) init(i Init) Tensor { t.Init = i; return t }

// configurePhi3 checks the head width, reads the original context of
// longrope (Config.RopeOrigContext) and the sliding window as
// llama.cpp c392e50 does: attention.sliding_window when present (0: no
// window), else 2047 for the 32- and 40-layer 4k models, 262144 for the
// 32-layer 128k mini, 131072 for the 40-layer 128k medium; a file without
// the key matching none of those is refused, as llama.cpp refuses it.
// Every layer is local (SWAPattern 0). A window at least as long as the
// context masks nothing; it is kept, and the decoder skips it.
func configurePhi3(m *Meta, c *Config) error {
	if c.HeadDim*c.Heads != c.Dim {
		return fmt.Errorf("model: phi3 needs head_count × key_length = embedding_length (its attention output is embedding_length square), got %d × %d ≠ %d: %w",
			c.Heads, c.HeadDim, c.Dim, engine.ErrInvalidInput)
	}
	c.RopeOrigContext = m.Count("rope.scaling.original_context_length", c.TrainContextLength)
	if m.Err != nil {
		return m.Err
	}
	key := "phi3.attention.sliding_window"
	if _, ok := m.F.Get(key); ok {
		w, ok := m.F.Uint(key)
		if !ok || w > MaxDim {
			val, _ := m.F.Get(key)
			return fmt.Errorf("model: %s = %v, want an integer in [0, %d]: %w", key, val, MaxDim, engine.ErrInvalidInput)
		}
		c.SlidingWindow = int(w)
		return nil
	}
	switch {
	case (c.Layers == 32 || c.Layers == 40) && c.TrainContextLength == 4096:
		c.SlidingWindow = 2047
	case c.Layers == 32 && c.KVHeads == 32 && c.TrainContextLength == 131072:
		c.SlidingWindow = 262144
	case c.Layers == 40 && c.TrainContextLength == 131072:
		c.SlidingWindow = 131072
	default:
		return fmt.Errorf("model: required key %s is missing (llama.cpp has no default for %d layers and a context of %d): %w",
			key, c.Layers, c.TrainContextLength, engine.ErrInvalidInput)
	}
	return nil
}
