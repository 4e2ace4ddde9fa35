package testmodel

import (
	"slices"

	"github.com/baton-serving/baton/kernels/quant"
)

// PresetInfo is one named shape: its name, a one-line description and the
// Spec it stands for.
type PresetInfo struct {
	Name string
	Doc  string
	Spec Spec
}

// TinyStd is the weight std of most tiny-ARCH presets: large enough that
// a greedy step's top-2 probability margin stays well above 1e-3 at dim 256
// (see docs/models.md), so their output can be compared token for token
// with another engine's. The Gemma presets use less (see presetList).
const TinyStd = 1.0

// tinyShape is the shape of the tiny-ARCH presets: rows of 256, so every
// block type (K-quants included) can store them, 2 layers, 4 query heads
// sharing 2 KV heads, and a context long enough for a prompt and 48
// generated tokens.
func tinyShape(archName string) Spec {
	return Spec{Arch: archName, Dim: 256, Hidden: 512, Layers: 2, Heads: 4, KVHeads: 2, Vocab: 512, Context: 256,
		Type: quant.F32, Seed: 1, Std: TinyStd}
}

// llama3Rope is Llama 3.1/3.2's rope_scaling (config.json: rope_type
// "llama3", factor 32 for 3.2 and 8 for 3.1, low_freq_factor 1,
// high_freq_factor 4, original_max_position_embeddings 8192), which
// llama.cpp's converter turns into rope_freqs.weight.
var llama3Rope = Llama3Rope{Factor: 32, LowFreqFactor: 1, HighFreqFactor: 4, OrigContext: 8192}

// presetList returns the presets in the order --help lists them: the tiny
// test shapes first, then the real models' shapes. The real shapes are the
// published config.json values (hidden_size, intermediate_size,
// num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim,
// vocab_size, max_position_embeddings, rope_theta, rms_norm_eps,
// tie_word_embeddings, sliding_window, rope_scaling) as llama.cpp's
// converter writes them into GGUF metadata. Their Type is the default for
// the preset; callers may override it.
func presetList() []PresetInfo {
	tiny := func(archName string, edit func(*Spec)) Spec {
		s := tinyShape(archName)
		if edit != nil {
			edit(&s)
		}
		return s
	}
	return []PresetInfo{
		{"tiny", "llama, dim 64, 2 layers, vocab 512, std 0.02: unit tests that only need a model to run",
			Spec{Dim: 64, Hidden: 192, Layers: 2, Heads: 4, KVHeads: 2, Vocab: 512, Context: 256, Type: quant.F32, Seed: 1}},
		{"tiny-llama", "llama (Llama 2 style), dim 256, 2 layers, 4/2 heads, std 1",
			tiny("llama", nil)},
		{"tiny-llama3", "llama with Llama 3.2's rope_freqs (llama3 scaling), rope base 500000, tied, std 1",
			tiny("llama", func(s *Spec) {
				s.RopeBase, s.Tied, s.Llama3Rope = 500000, true, llama3Rope
			})},
		{"tiny-qwen2", "qwen2 (q/k/v biases), rope base 1e6, eps 1e-6, tied, std 1",
			tiny("qwen2", func(s *Spec) { s.RopeBase, s.NormEps, s.Tied = 1e6, 1e-6, true })},
		{"tiny-qwen3", "qwen3 (q/k norms), 4 heads of 128 (key_length ≠ dim/heads), rope base 1e6, eps 1e-6, tied, std 1",
			tiny("qwen3", func(s *Spec) { s.HeadDim, s.RopeBase, s.NormEps, s.Tied = 128, 1e6, 1e-6, true })},
		{"tiny-phi3", "phi3 (fused attn_qkv and gate+up ffn_up), window 32 on every layer, untied, std 1",
			tiny("phi3", func(s *Spec) { s.SlidingWindow = 32 })},
		// 26 layers, as Gemma-2-2B: llama.cpp c392e50 picks gemma2's query
		// scale by model size and aborts on any other layer count than 26,
		// 42 and 46. Std 0.15 (about 3/√dim): Gemma multiplies the embedding
		// by √dim and gemma2's head is always the embedding, so with a
		// larger std every step repeats its input token; even at 0.15 a
		// prompt's continuation is a handful of distinct tokens.
		{"tiny-gemma2", "gemma2, 26 layers (window 32 on even ones), 4 heads of 128, soft-caps 50/30, eps 1e-6, tied, std 0.15",
			tiny("gemma2", func(s *Spec) {
				s.Layers, s.HeadDim, s.SlidingWindow, s.NormEps, s.Tied, s.Std = 26, 128, 32, 1e-6, true, 0.15
			})},
		// Untied (gemma3 files may carry output.weight): tied, a random
		// Gemma 3 repeats its input token at any std with clear margins.
		{"tiny-gemma3", "gemma3, 6 layers (5 local with window 32, 1 global), 4 heads of 128, rope bases 1e6/10000, eps 1e-6, untied, std 0.35",
			tiny("gemma3", func(s *Spec) {
				s.Layers, s.HeadDim, s.SlidingWindow, s.RopeBase, s.NormEps, s.Std = 6, 128, 32, 1e6, 1e-6, 0.35
			})},

		{"llama-110m", "the llama2.c stories110M shape (Llama 2 vocabulary size), tied",
			Spec{Dim: 768, Hidden: 2048, Layers: 12, Heads: 12, KVHeads: 12, Vocab: 32000, Context: 1024, Type: quant.Q8_0, Tied: true, Seed: 1}},
		{"tinyllama-1.1b", "TinyLlama-1.1B: llama, 2048×22, 32/4 heads, vocab 32000",
			Spec{Dim: 2048, Hidden: 5632, Layers: 22, Heads: 32, KVHeads: 4, Vocab: 32000, Context: 2048, Type: quant.Q8_0, Seed: 1}},
		{"llama3.2-1b", "Llama-3.2-1B: llama, 2048×16, 32/8 heads, vocab 128256, rope base 500000 with llama3 rope_freqs, tied",
			Spec{Arch: "llama", Dim: 2048, Hidden: 8192, Layers: 16, Heads: 32, KVHeads: 8, Vocab: 128256, Context: 131072,
				RopeBase: 500000, NormEps: 1e-5, Tied: true, Llama3Rope: llama3Rope, Type: quant.Q8_0, Seed: 1}},
		{"qwen2.5-0.5b", "Qwen2.5-0.5B: qwen2, 896×24, 14/2 heads, vocab 151936, rope base 1e6, tied (dim 896: not a K-quant row)",
			Spec{Arch: "qwen2", Dim: 896, Hidden: 4864, Layers: 24, Heads: 14, KVHeads: 2, Vocab: 151936, Context: 32768,
				RopeBase: 1e6, NormEps: 1e-6, Tied: true, Type: quant.Q8_0, Seed: 1}},
		{"qwen3-0.6b", "Qwen3-0.6B: qwen3, 1024×28, 16/8 heads of 128, vocab 151936, rope base 1e6, tied",
			Spec{Arch: "qwen3", Dim: 1024, Hidden: 3072, Layers: 28, Heads: 16, KVHeads: 8, HeadDim: 128, Vocab: 151936, Context: 40960,
				RopeBase: 1e6, NormEps: 1e-6, Tied: true, Type: quant.Q8_0, Seed: 1}},
		{"phi3-mini", "Phi-3-mini-4k: phi3, 3072×32, 32/32 heads of 96, vocab 32064, window 2047, context 4096",
			Spec{Arch: "phi3", Dim: 3072, Hidden: 8192, Layers: 32, Heads: 32, KVHeads: 32, Vocab: 32064, Context: 4096,
				RopeBase: 10000, NormEps: 1e-5, SlidingWindow: 2047, Type: quant.Q8_0, Seed: 1}},
		{"gemma2-2b", "Gemma-2-2B: gemma2, 2304×26, 8/4 heads of 256, vocab 256000, window 4096, soft-caps 50/30, tied",
			Spec{Arch: "gemma2", Dim: 2304, Hidden: 9216, Layers: 26, Heads: 8, KVHeads: 4, HeadDim: 256, Vocab: 256000, Context: 8192,
				RopeBase: 10000, NormEps: 1e-6, SlidingWindow: 4096, Tied: true, Type: quant.Q8_0, Seed: 1}},
		{"gemma3-1b", "Gemma-3-1B: gemma3, 1152×26, 4/1 heads of 256, vocab 262144, window 512, rope bases 1e6/10000, tied (dim 1152: not a K-quant row)",
			Spec{Arch: "gemma3", Dim: 1152, Hidden: 6912, Layers: 26, Heads: 4, KVHeads: 1, HeadDim: 256, Vocab: 262144, Context: 32768,
				RopeBase: 1e6, NormEps: 1e-6, SlidingWindow: 512, Tied: true, Type: quant.Q8_0, Seed: 1}},
	}
}

// Preset returns the named preset (see Presets).
func Preset(name string) (Spec, bool) {
	for _, p := range presetList() {
		if p.Name == name {
			return p.Spec, true
		}
	}
	return Spec{}, false
}

// Presets lists the preset names, sorted.
func Presets() []string {
	var names []string
	for _, p := range presetList() {
		names = append(names, p.Name)
	}
	slices.Sort(names)
	return names
}

// PresetInfos lists the presets with their descriptions, tiny test shapes
// first, then the real models' shapes.
func PresetInfos() []PresetInfo { return presetList() }
