package arch

import "github.com/baton-serving/baton/kernels"

// llama is the Llama architecture (Llama 2 and 3.x, TinyLlama, SmolLM, the
// llama2.c models, and Mistral, whose files llama.cpp writes as "llama"):
// pre-norm blocks of RMSNorm, grouped-query attention with RoPE on
// adjacent pairs, a SwiGLU feed-forward network; a final RMSNorm and an
// output head that may be tied to the token embedding. Biases are
// optional, as in llama.cpp, and so are Llama 3.1's rope_freqs factors.
func llama() *Arch {
	return &Arch{
		Name:             "llama",
		Tensors:          llamaTensors(),
		RopeLayout:       kernels.RopeNormal,
		Act:              SiLU,
		LlamaCppNumerics: true,
		WholeHeadRope:    true,
	}
}

// llamaTensors is the Llama tensor table, with every bias optional.
func llamaTensors() []Tensor {
	return []Tensor{
		Mat("token_embd.weight", TokEmbd, Vocab, Dim),
		Norm("output_norm.weight", OutputNorm, Dim),
		Mat("output.weight", Output, Vocab, Dim).Opt(),
		Norm("rope_freqs.weight", RopeFreqs, RopePairs).Opt(),
		Norm("blk.%d.attn_norm.weight", AttnNorm, Dim),
		Mat("blk.%d.attn_q.weight", Wq, QDim, Dim),
		Mat("blk.%d.attn_k.weight", Wk, KVDim, Dim),
		Mat("blk.%d.attn_v.weight", Wv, KVDim, Dim),
		Mat("blk.%d.attn_output.weight", Wo, Dim, QDim),
		Vec("blk.%d.attn_q.bias", Bq, QDim).Opt(),
		Vec("blk.%d.attn_k.bias", Bk, KVDim).Opt(),
		Vec("blk.%d.attn_v.bias", Bv, KVDim).Opt(),
		Vec("blk.%d.attn_output.bias", Bo, Dim).Opt(),
		Norm("blk.%d.ffn_norm.weight", FFNNorm, Dim),
		Mat("blk.%d.ffn_gate.weight", Gate, Hidden, Dim),
		Mat("blk.%d.ffn_up.weight", Up, Hidden, Dim),
		Mat("blk.%d.ffn_down.weight", Down, Dim, Hidden),
		Vec("blk.%d.ffn_gate.bias", BGate, Hidden).Opt(),
		Vec("blk.%d.ffn_up.bias", BUp, Hidden).Opt(),
		Vec("blk.%d.ffn_down.bias", BDown, Dim).Opt(),
	}
}
