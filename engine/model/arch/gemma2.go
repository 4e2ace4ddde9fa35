package arch

import (
	"fmt"
	"math"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/kernels"
)

// gemma2 is Gemma 2, as llama.cpp c392e50 runs it (llm_build_gemma2 in
// src/llama.cpp, its hparams in src/llama-model.cpp):
//
//   - the token embeddings are multiplied by √embedding_length;
//   - each block is RMSNorm, attention, an RMSNorm of the attention output
//     (post_attention_norm) and the residual add, then RMSNorm, a GeGLU
//     feed-forward network (gelu_tanh(gate)·up), an RMSNorm of its output
//     (post_ffw_norm) and the residual add;
//   - RoPE is on the NeoX layout; queries are multiplied by
//     1/√query_pre_attn_scalar after RoPE and scored with scale 1, each
//     score soft-capped (attn_logit_softcapping, default 50) before the
//     softmax;
//   - even blocks (0, 2, …) attend through a sliding window
//     (attention.sliding_window, default 4096), odd ones to the whole
//     sequence;
//   - the logits are soft-capped (final_logit_softcapping, default 30);
//   - the output head is always the token embedding: llama.cpp c392e50
//     binds no output.weight for gemma2 (a file with one has a tensor too
//     many, for it and for Baton).
//
// llama.cpp's converter stores Gemma's norm weights as 1+w (Gemma's
// RMSNorm multiplies by 1+w), so the file's weights multiply as they are.
// No metadata key carries query_pre_attn_scalar: llama.cpp picks it by
// the model's size, head_dim for Gemma-2-2B and 9B (26 and 42 blocks),
// embedding_length/head_count for 27B (46 blocks). Baton applies the same
// rule, taking head_dim for any block count other than 46 (llama.cpp
// c392e50 aborts on those).
func gemma2() *Arch {
	return &Arch{
		Name:       "gemma2",
		Tensors:    gemmaTensors(false),
		RopeLayout: kernels.RopeNeoX,
		Act:        GELU,
		Configure:  configureGemma2,
		Keys:       gemma2Keys,
		// llama.cpp's gemma2 asserts rope.dimension_count = key_length.
		WholeHeadRope: true,
	}
}

// Gemma 2's defaults, as llama.cpp c392e50's hparams (and Google's
// configs) have them.
const (
	gemma2Window       = 4096
	gemma2AttnSoftCap  = 50
	gemma2FinalSoftCap = 30
)

// gemmaTensors is the tensor table of Gemma 2 (qkNorm false) and Gemma 3
// (qkNorm true, and an optional output head, which ik_llama.cpp binds when
// present).
func gemmaTensors(gemma3 bool) []Tensor {
	ts := []Tensor{
		Mat("token_embd.weight", TokEmbd, Vocab, Dim),
		Norm("output_norm.weight", OutputNorm, Dim),
	}
	if gemma3 {
		ts = append(ts, Mat("output.weight", Output, Vocab, Dim).Opt())
	}
	ts = append(ts,
		Norm("blk.%d.attn_norm.weight", AttnNorm, Dim),
		Mat("blk.%d.attn_q.weight", Wq, QDim, Dim),
		Mat("blk.%d.attn_k.weight", Wk, KVDim, Dim),
		Mat("blk.%d.attn_v.weight", Wv, KVDim, Dim),
		Mat("blk.%d.attn_output.weight", Wo, Dim, QDim),
	)
	if gemma3 {
		ts = append(ts,
			Norm("blk.%d.attn_q_norm.weight", QNorm, HeadDim),
			Norm("blk.%d.attn_k_norm.weight", KNorm, HeadDim),
		)
	}
	return append(ts,
		Norm("blk.%d.post_attention_norm.weight", PostAttnNorm, Dim),
		Norm("blk.%d.ffn_norm.weight", FFNNorm, Dim),
		Mat("blk.%d.ffn_gate.weight", Gate, Hidden, Dim),
		Mat("blk.%d.ffn_up.weight", Up, Hidden, Dim),
		Mat("blk.%d.ffn_down.weight", Down, Dim, Hidden),
		Norm("blk.%d.post_ffw_norm.weight", PostFFNNorm, Dim),
	)
}

func configureGemma2(m *Meta, c *Config) error {
	c.EmbedScale = sqrtf(c.Dim)
	// The queries carry the scale (llama.cpp scales q after RoPE and
	// scores with 1), so that the soft-cap sees the same numbers.
	qpas, err := gemmaQueryScalar(m, c, 46)
	if err != nil {
		return err
	}
	c.QueryScale = 1 / sqrtf(qpas)
	c.AttnScale = 1
	c.AttnSoftCap = m.Float("attn_logit_softcapping", gemma2AttnSoftCap)
	c.FinalSoftCap = m.Float("final_logit_softcapping", gemma2FinalSoftCap)
	c.SWAPattern = 2
	c.SlidingWindow = gemmaWindow(m, c, gemma2Window)
	return m.Err
}

// gemmaQueryScalar is query_pre_attn_scalar, which no key carries:
// head_dim, but embedding_length/head_count (integer division, as
// llama.cpp computes it) for the 27B models, whose block count is
// layers27B. A quotient of 0 (fewer dimensions than heads, with a
// key_length) would scale the queries by 1/√0 = +Inf and make every score
// NaN; it is refused, naming the keys.
func gemmaQueryScalar(m *Meta, c *Config, layers27B int) (int, error) {
	if c.Layers != layers27B {
		return c.HeadDim, nil
	}
	if q := c.Dim / c.Heads; q > 0 {
		return q, nil
	}
	return 0, fmt.Errorf("model: %s with %d blocks scales queries by 1/√(embedding_length/head_count), but %s.embedding_length %d / %s.attention.head_count %d is 0: %w",
		m.Arch, c.Layers, m.Arch, c.Dim, m.Arch, c.Heads, engine.ErrInvalidInput)
}

// sqrtf is C's sqrtf of a float converted from n: float64's square root,
// rounded once (exact for the float32 inputs it is given).
func sqrtf(n int) float32 { return float32(math.Sqrt(float64(float32(n)))) }

// gemmaWindow reads attention.sliding_window: def when absent (def 0: the
// key is required), an error naming the key when it is not an integer in
// [1, context_length].
func gemmaWindow(m *Meta, c *Config, def int) int {
	key := m.Arch + ".attention.sliding_window"
	if !m.Has("attention.sliding_window") && def > 0 {
		return def
	}
	w := m.Count("attention.sliding_window", 0)
	if m.Err == nil && w > c.TrainContextLength {
		m.Fail("%s = %d is larger than the context length %s.context_length = %d: %w",
			key, w, m.Arch, c.TrainContextLength, engine.ErrInvalidInput)
	}
	return w
}

// gemmaKeyWindow is the window the writer stores: c's, or the
// architecture's default clamped to the context.
func gemmaKeyWindow(c Config, def int) uint32 {
	if c.SlidingWindow > 0 {
		return uint32(c.SlidingWindow)
	}
	return uint32(min(def, c.TrainContextLength))
}

// gemma2Keys are the keys llama.cpp's converter writes for Gemma 2 beyond
// the common ones.
func gemma2Keys(c Config) []KV {
	p := "gemma2."
	capAt := func(v, def float32) float32 {
		if v > 0 {
			return v
		}
		return def
	}
	return []KV{
		{p + "attn_logit_softcapping", capAt(c.AttnSoftCap, gemma2AttnSoftCap)},
		{p + "final_logit_softcapping", capAt(c.FinalSoftCap, gemma2FinalSoftCap)},
		{p + "attention.sliding_window", gemmaKeyWindow(c, gemma2Window)},
	}
}
