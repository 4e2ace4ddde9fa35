package arch

import "github.com/baton-serving/baton/kernels"

// gemma3 is the text model of Gemma 3, as ik_llama.cpp 8337e4cd3 runs it
// (build_gemma3 in src/graphs/build_gemma3.cpp, its hparams in
// src/llama-hparams.cpp; llama.cpp c392e50 predates it): Gemma 2's blocks
// (embedding scale √embedding_length, post-attention and post-FFN norms,
// GeGLU, NeoX RoPE, norm weights stored as 1+w) with
//
//   - an RMSNorm of each query and key head (attn_q_norm, attn_k_norm)
//     after the projections, before RoPE;
//   - five local blocks to one global: block il is global when
//     (il+1) % 6 == 0. Local blocks attend through the sliding window
//     (attention.sliding_window, required) and rotate with RoPE base 10000
//     and no position scaling; global blocks attend to the whole sequence
//     with rope.freq_base (1e6 in Google's files) and the file's
//     rope.scaling (linear, factor 8, in the 4B and larger models);
//   - no soft-caps: the scores are q·k times 1/√head_dim (for 62 blocks,
//     27B, 1/√(embedding_length/head_count)) inside the softmax;
//   - an output.weight when the file has one, else the token embedding.
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
	qpas := c.HeadDim
	if c.Layers == 62 {
		qpas = c.Dim / c.Heads
	}
	c.AttnScale = 1 / sqrtf(qpas)
	c.SWAPattern = gemma3Pattern
	c.RopeBaseLocal = gemma3LocalRopeBase
	c.SlidingWindow = gemmaWindow(m, c, 0)
	return m.Err
}

// gemma3Keys are the keys llama.cpp's converter writes for Gemma 3 beyond
// the common ones.
func gemma3Keys(c Config) []KV {
	return []KV{{"gemma3.attention.sliding_window", gemmaKeyWindow(c, gemma3Window)}}
}
