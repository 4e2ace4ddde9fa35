package arch

import "github.com/baton-serving/baton/kernels"

// qwen3 is Qwen3 (dense): Llama's blocks without biases, with an RMSNorm of
// each query and key head (attn_q_norm, attn_k_norm, HeadDim weights shared
// by the heads) after the projections and before RoPE, which is on the NeoX
// layout. Its head dimension (attention.key_length) need not be
// embedding_length/head_count: Qwen3-0.6B has 16 heads of 128 over a width
// of 1024. As read from ik_llama.cpp's build_qwen3 (8337e4cd3).
func qwen3() *Arch {
	return &Arch{
		Name: "qwen3",
		Tensors: []Tensor{
			Mat("token_embd.weight", TokEmbd, Vocab, Dim),
			Norm("output_norm.weight", OutputNorm, Dim),
			Mat("output.weight", Output, Vocab, Dim).Opt(),
			Norm("blk.%d.attn_norm.weight", AttnNorm, Dim),
			Mat("blk.%d.attn_q.weight", Wq, QDim, Dim),
			Mat("blk.%d.attn_k.weight", Wk, KVDim, Dim),
			Mat("blk.%d.attn_v.weight", Wv, KVDim, Dim),
			Mat("blk.%d.attn_output.weight", Wo, Dim, QDim),
			Norm("blk.%d.attn_q_norm.weight", QNorm, HeadDim),
			Norm("blk.%d.attn_k_norm.weight", KNorm, HeadDim),
			Norm("blk.%d.ffn_norm.weight", FFNNorm, Dim),
			Mat("blk.%d.ffn_gate.weight", Gate, Hidden, Dim),
			Mat("blk.%d.ffn_up.weight", Up, Hidden, Dim),
			Mat("blk.%d.ffn_down.weight", Down, Dim, Hidden),
		},
		RopeLayout:    kernels.RopeNeoX,
		Act:           SiLU,
		WholeHeadRope: true,
	}
}
