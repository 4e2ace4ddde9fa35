package arch

import "github.com/baton-serving/baton/kernels"

// qwen2 is Qwen2 and Qwen2.5: Llama's blocks with biases on the query, key
// and value projections (required, as llama.cpp requires them; no output
// bias), and RoPE on the NeoX layout (each head's first half paired with
// its second). llama.cpp c392e50's build_qwen2 adds each bias right after
// its product, before RoPE.
func qwen2() *Arch {
	return &Arch{
		Name: "qwen2",
		Tensors: []Tensor{
			Mat("token_embd.weight", TokEmbd, Vocab, Dim),
			Norm("output_norm.weight", OutputNorm, Dim),
			Mat("output.weight", Output, Vocab, Dim).Opt(),
			Norm("blk.%d.attn_norm.weight", AttnNorm, Dim),
			Mat("blk.%d.attn_q.weight", Wq, QDim, Dim),
			Mat("blk.%d.attn_k.weight", Wk, KVDim, Dim),
			Mat("blk.%d.attn_v.weight", Wv, KVDim, Dim),
			Mat("blk.%d.attn_output.weight", Wo, Dim, QDim),
			Vec("blk.%d.attn_q.bias", Bq, QDim),
			Vec("blk.%d.attn_k.bias", Bk, KVDim),
			Vec("blk.%d.attn_v.bias", Bv, KVDim),
			Norm("blk.%d.ffn_norm.weight", FFNNorm, Dim),
			Mat("blk.%d.ffn_gate.weight", Gate, Hidden, Dim),
			Mat("blk.%d.ffn_up.weight", Up, Hidden, Dim),
			Mat("blk.%d.ffn_down.weight", Down, Dim, Hidden),
		},
		RopeLayout:    kernels.RopeNeoX,
		Act:           SiLU,
		SquareAttn:    true,
		WholeHeadRope: true,
	}
}
