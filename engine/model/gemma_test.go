package model

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/gguf"
	"github.com/baton-serving/baton/engine/kvcache"
	"github.com/baton-serving/baton/engine/testmodel"
	"github.com/baton-serving/baton/kernels"
	"github.com/baton-serving/baton/kernels/quant"
)

// gemmaSpec adapts one of archSpecs' small files to the Gemma family: a
// window of 3 positions, so that archSpecs' 5-token runs reach past it;
// for gemma3 six blocks, so that one (block 5) is global, and a global
// RoPE base unlike the local one.
func gemmaSpec(s *testmodel.Spec) {
	switch s.Arch {
	case "gemma2":
		s.SlidingWindow = 3
	case "gemma3":
		s.SlidingWindow, s.Layers, s.RopeBase = 3, 6, 1e6
	}
}

// The Gemma parts of the float64 reference (refModel, arch_test.go).

// scaleBy multiplies x by s (s = 0: unchanged).
func scaleBy(x []float64, s float32) {
	if s == 0 {
		return
	}
	for i := range x {
		x[i] *= float64(s)
	}
}

// ropeAt rotates x as block l does: local blocks with RopeBaseLocal.
func (r *refModel) ropeAt(x []float64, pos, l int) {
	if r.c.RopeBaseLocal != 0 && r.c.Local(l) {
		lr := *r
		lr.c.RopeBase, lr.c.RopeScale = r.c.RopeBaseLocal, 1
		lr.rope(x, pos)
		return
	}
	r.rope(x, pos)
}

// score turns the dot product d of a query with the key dist positions
// back into block l's attention score: scaled, soft-capped, and -Inf
// outside a local block's window (llama.cpp masks dist >= n_swa).
func (r *refModel) score(d float64, dist, l int) float64 {
	c := r.c
	if c.Local(l) && dist >= c.SlidingWindow {
		return math.Inf(-1)
	}
	s := d / math.Sqrt(float64(c.HeadDim))
	if c.AttnScale != 0 {
		s = d * float64(c.AttnScale)
	}
	if sc := float64(c.AttnSoftCap); sc > 0 {
		s = sc * math.Tanh(s/sc)
	}
	return s
}

// act is the gate activation: SiLU, or GELU as ggml defines it (its
// binary16 table, kernels.GELU, which llama.cpp c392e50 computes).
func (r *refModel) act(g float64) float64 {
	if r.gelu {
		return float64(kernels.GELU(float32(g)))
	}
	return g / (1 + math.Exp(-g))
}

// gemmaFile writes a small file of arch with a window of window positions
// (dim 64, 4 heads of 16, 2 KV heads; gemma3 with 7 blocks: 0–4 local, 5
// global, 6 local).
func gemmaFile(t testing.TB, arch string, window int, typ quant.Type) *gguf.File {
	s := testmodel.Spec{Arch: arch, Dim: 64, Hidden: 96, Layers: 3, Heads: 4, KVHeads: 2, Vocab: 300, Context: 96,
		Type: typ, Seed: 5, Std: 0.3, SlidingWindow: window}
	if arch == "gemma3" {
		s.Layers, s.RopeBase = 7, 1e6
	}
	return writeModel(t, s)
}

func randTokens(rng *rand.Rand, n, vocab int) []int32 {
	toks := make([]int32, n)
	for i := range toks {
		toks[i] = int32(rng.IntN(vocab))
	}
	return toks
}

// TestGemmaConfig: the hyper-parameters read from a Gemma file are
// llama.cpp's: embedding scale √dim, the query scale (Gemma 2) or score
// scale (Gemma 3) 1/√head_dim, the soft-caps (Gemma 2), the window and its
// pattern, the local RoPE base (Gemma 3), NeoX RoPE, a tied head.
func TestGemmaConfig(t *testing.T) {
	c2 := load(t, gemmaFile(t, "gemma2", 8, quant.F32), Options{Threads: 1}).Config()
	want2 := Config{EmbedScale: 8, QueryScale: 0.25, AttnScale: 1, AttnSoftCap: 50, FinalSoftCap: 30, SlidingWindow: 8, SWAPattern: 2}
	got2 := Config{EmbedScale: c2.EmbedScale, QueryScale: c2.QueryScale, AttnScale: c2.AttnScale, AttnSoftCap: c2.AttnSoftCap,
		FinalSoftCap: c2.FinalSoftCap, SlidingWindow: c2.SlidingWindow, SWAPattern: c2.SWAPattern, RopeBaseLocal: c2.RopeBaseLocal}
	if got2 != want2 || c2.RopeLayout != kernels.RopeNeoX || !c2.TiedOutput {
		t.Errorf("gemma2: %+v", c2)
	}
	if !c2.Local(0) || c2.Local(1) || !c2.Local(2) {
		t.Errorf("gemma2: even blocks are local, odd ones global: %v %v %v", c2.Local(0), c2.Local(1), c2.Local(2))
	}
	c3 := load(t, gemmaFile(t, "gemma3", 8, quant.F32), Options{Threads: 1}).Config()
	want3 := Config{EmbedScale: 8, AttnScale: 0.25, SlidingWindow: 8, SWAPattern: 6, RopeBaseLocal: 10000}
	got3 := Config{EmbedScale: c3.EmbedScale, QueryScale: c3.QueryScale, AttnScale: c3.AttnScale, AttnSoftCap: c3.AttnSoftCap,
		FinalSoftCap: c3.FinalSoftCap, SlidingWindow: c3.SlidingWindow, SWAPattern: c3.SWAPattern, RopeBaseLocal: c3.RopeBaseLocal}
	if got3 != want3 || c3.RopeBase != 1e6 || c3.RopeLayout != kernels.RopeNeoX {
		t.Errorf("gemma3: %+v", c3)
	}
	for il := range 7 {
		if c3.Local(il) != (il != 5) {
			t.Errorf("gemma3 block %d: local %v", il, c3.Local(il))
		}
	}
	// query_pre_attn_scalar has no key: llama.cpp takes head_dim, but
	// embedding_length/head_count for the 27B models (46 and 62 blocks).
	for _, tc := range []struct {
		arch          string
		layers        int
		query, scores float32
	}{
		{"gemma2", 26, 1 / float32(math.Sqrt(32)), 1}, {"gemma2", 46, 0.25, 1},
		{"gemma3", 26, 0, 1 / float32(math.Sqrt(32))}, {"gemma3", 62, 0, 0.25},
	} {
		s := testmodel.Spec{Arch: tc.arch, Dim: 64, Hidden: 32, Layers: tc.layers, Heads: 4, KVHeads: 2, HeadDim: 32,
			Vocab: testmodel.MinVocab, Context: 16, Type: quant.F32, Seed: 1}
		c := m0Config(t, writeModel(t, s))
		if c.QueryScale != tc.query || c.AttnScale != tc.scores {
			t.Errorf("%s with %d blocks (dim 64, 4 heads of 32): query scale %v, score scale %v; want %v, %v",
				tc.arch, tc.layers, c.QueryScale, c.AttnScale, tc.query, tc.scores)
		}
	}
}

// TestGemmaWindowApplied: positions within the window see the same
// logits whether or not local blocks have one, and positions past it
// different ones. Ignoring the window (or applying it to no block) fails
// the second half; applying it to the wrong positions, the first.
func TestGemmaWindowApplied(t *testing.T) {
	const window = 6
	for _, name := range []string{"gemma2", "gemma3"} {
		t.Run(name, func(t *testing.T) {
			toks := randTokens(rand.New(rand.NewPCG(1, 2)), 20, 300)
			win := refLogits(t, load(t, gemmaFile(t, name, window, quant.F32), Options{Threads: 1}), toks)
			full := refLogits(t, load(t, gemmaFile(t, name, 96, quant.F32), Options{Threads: 1}), toks)
			for n := 1; n <= len(toks); n++ {
				same := slices.Equal(win[n], full[n])
				// After n tokens the last position is n-1; it sees keys
				// n-window … n-1, all of them while n <= window.
				if n <= window && !same {
					t.Errorf("after %d tokens (inside the window): logits differ", n)
				}
				if n > window && same {
					t.Errorf("after %d tokens (past the window of %d): logits equal to the unwindowed model's", n, window)
				}
			}
		})
	}
}

// TestGemmaBatchedPagedMatchesForward: Forward of a whole prompt at once
// gives the logits of feeding it a token at a time, and ForwardBatch over
// paged caches (pages of 3 and 4 positions, chunks of random sizes mixed
// with other sequences) gives them bit for bit, past the window too.
func TestGemmaBatchedPagedMatchesForward(t *testing.T) {
	for _, name := range []string{"gemma2", "gemma3"} {
		t.Run(name, func(t *testing.T) {
			m := load(t, gemmaFile(t, name, 5, quant.F32), Options{Threads: 2})
			cfg := m.Config()
			rng := rand.New(rand.NewPCG(3, 4))
			var seqs [][]int32
			var refs [][][]float32
			for range 4 {
				toks := randTokens(rng, 12+rng.IntN(20), cfg.Vocab)
				seqs = append(seqs, toks)
				refs = append(refs, refLogits(t, m, toks))
			}
			// Whole prompts in one Forward call, contiguous cache.
			for i, toks := range seqs {
				cache, err := NewContiguousCache(cfg, len(toks))
				if err != nil {
					t.Fatal(err)
				}
				lg := make([]float32, cfg.Vocab)
				if err := m.Forward(toks, 0, cache, lg); err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(lg, refs[i][len(toks)]) {
					t.Errorf("sequence %d: Forward of the whole prompt differs from one token at a time", i)
				}
			}
			for _, pageSize := range []int{3, 4} {
				pool, err := kvcache.New(cfg.KVLayout(pageSize, quant.F32), 64)
				if err != nil {
					t.Fatal(err)
				}
				done := make([]int, len(seqs))
				tables := make([]*kvcache.BlockTable, len(seqs))
				for i := range tables {
					tables[i] = pool.NewTable()
				}
				checked := 0
				for step := 0; step < 200; step++ {
					var batch []Chunk
					var who []int
					for i, toks := range seqs {
						if done[i] == len(toks) || rng.IntN(3) == 0 {
							continue
						}
						n := min(1+rng.IntN(7), len(toks)-done[i])
						if err := tables[i].Grow(done[i] + n); err != nil {
							t.Fatal(err)
						}
						batch = append(batch, Chunk{Tokens: toks[done[i] : done[i]+n], Pos: done[i], Pages: tables[i].Pages(), Logits: make([]float32, cfg.Vocab)})
						who = append(who, i)
					}
					if len(batch) == 0 {
						continue
					}
					if err := m.ForwardBatch(pool, batch); err != nil {
						t.Fatal(err)
					}
					for k, ch := range batch {
						i := who[k]
						done[i] += len(ch.Tokens)
						if !slices.Equal(ch.Logits, refs[i][done[i]]) {
							t.Fatalf("pages of %d, step %d: sequence %d after %d tokens: ForwardBatch logits differ from Forward's", pageSize, step, i, done[i])
						}
						checked++
					}
				}
				for i, toks := range seqs {
					if done[i] != len(toks) {
						t.Fatalf("pages of %d: sequence %d reached %d of %d tokens", pageSize, i, done[i], len(toks))
					}
					if err := tables[i].Release(); err != nil {
						t.Fatal(err)
					}
				}
				if checked < 10 {
					t.Fatalf("only %d logit vectors checked", checked)
				}
			}
		})
	}
}

// TestGemmaQuantized: a Q8_0 file runs and stays close to its F32 twin
// (same seed, same weights up to quantization; weights and activations
// rounded to 8 bits through 3–7 blocks move these logits by 5–13 %, a
// weight bound to the wrong role by ~100 %).
func TestGemmaQuantized(t *testing.T) {
	for _, name := range []string{"gemma2", "gemma3"} {
		t.Run(name, func(t *testing.T) {
			toks := randTokens(rand.New(rand.NewPCG(5, 6)), 10, 300)
			a := refLogits(t, load(t, gemmaFile(t, name, 4, quant.F32), Options{Threads: 1}), toks)
			b := refLogits(t, load(t, gemmaFile(t, name, 4, quant.Q8_0), Options{Threads: 1}), toks)
			for n := 1; n <= len(toks); n++ {
				if e := relLogitErr(a[n], b[n]); e > 0.25 {
					t.Errorf("after %d tokens: Q8_0 relative logit error %.3g", n, e)
				}
			}
		})
	}
}

// TestGemmaLoadErrors: bad Gemma metadata or tensors are clear errors
// naming the key or tensor.
func TestGemmaLoadErrors(t *testing.T) {
	drop := func(name string) func(gguf.TensorInfo, []byte) (gguf.TensorInfo, []byte, bool) {
		return func(info gguf.TensorInfo, data []byte) (gguf.TensorInfo, []byte, bool) {
			return info, data, info.Name != name
		}
	}
	setKV := func(key string, val any) kvEdit { return setKVs(map[string]any{key: val}) }
	tests := []struct {
		arch, name string
		kv         kvEdit
		tensor     func(gguf.TensorInfo, []byte) (gguf.TensorInfo, []byte, bool)
		want       error
		text       string
	}{
		{"gemma2", "window beyond context", setKV("gemma2.attention.sliding_window", uint32(97)), nil, engine.ErrInvalidInput,
			"gemma2.attention.sliding_window = 97 is larger than the context length gemma2.context_length = 96"},
		{"gemma3", "window beyond context", setKV("gemma3.attention.sliding_window", uint32(4096)), nil, engine.ErrInvalidInput,
			"gemma3.attention.sliding_window = 4096 is larger than the context length gemma3.context_length = 96"},
		{"gemma2", "window 0", setKV("gemma2.attention.sliding_window", uint32(0)), nil, engine.ErrInvalidInput,
			"gemma2.attention.sliding_window = 0, want an integer in [1,"},
		{"gemma2", "attention soft-cap 0", setKV("gemma2.attn_logit_softcapping", float32(0)), nil, engine.ErrInvalidInput,
			"gemma2.attn_logit_softcapping = 0, want a finite number > 0"},
		{"gemma2", "attention soft-cap negative", setKV("gemma2.attn_logit_softcapping", float32(-50)), nil, engine.ErrInvalidInput,
			"gemma2.attn_logit_softcapping = -50, want a finite number > 0"},
		{"gemma2", "final soft-cap NaN", setKV("gemma2.final_logit_softcapping", float32(math.NaN())), nil, engine.ErrInvalidInput,
			"gemma2.final_logit_softcapping = NaN, want a finite number > 0"},
		{"gemma2", "final soft-cap Inf", setKV("gemma2.final_logit_softcapping", float32(math.Inf(1))), nil, engine.ErrInvalidInput,
			"gemma2.final_logit_softcapping = +Inf, want a finite number > 0"},
		{"gemma2", "post-attention norm missing", nil, drop("blk.1.post_attention_norm.weight"), engine.ErrInvalidInput,
			"tensor blk.1.post_attention_norm.weight is missing"},
		{"gemma3", "post-FFN norm missing", nil, drop("blk.2.post_ffw_norm.weight"), engine.ErrInvalidInput,
			"tensor blk.2.post_ffw_norm.weight is missing"},
		{"gemma3", "k norm missing", nil, drop("blk.0.attn_k_norm.weight"), engine.ErrInvalidInput,
			"tensor blk.0.attn_k_norm.weight is missing"},
		{"gemma3", "relabelled gemma2", relabel("gemma3", "gemma2"), nil, engine.ErrUnsupported,
			"tensors blk.0.attn_q_norm.weight, blk.0.attn_k_norm.weight, blk.1.attn_q_norm.weight, blk.1.attn_k_norm.weight, blk.2.attn_q_norm.weight and 10 more are not part of the architecture"},
		{"gemma2", "relabelled gemma3", relabel("gemma2", "gemma3"), nil, engine.ErrInvalidInput,
			"tensor blk.0.attn_q_norm.weight is missing"},
	}
	for _, tc := range tests {
		t.Run(tc.arch+"/"+tc.name, func(t *testing.T) {
			g := rewriteKVs(t, gemmaFile(t, tc.arch, 8, quant.F32), tc.kv, tc.tensor)
			_, err := Load(g, Options{Threads: 1})
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.text) {
				t.Fatalf("Load = %v, want %v containing %q", err, tc.want, tc.text)
			}
		})
	}
	// A Gemma 2 file with its defaults: no window or soft-cap keys.
	g := rewriteKVs(t, gemmaFile(t, "gemma2", 8, quant.F32), setKVs(map[string]any{
		"gemma2.attention.sliding_window": nil, "gemma2.attn_logit_softcapping": nil, "gemma2.final_logit_softcapping": nil}), nil)
	m := load(t, g, Options{Threads: 1})
	if c := m.Config(); c.SlidingWindow != 4096 || c.AttnSoftCap != 50 || c.FinalSoftCap != 30 {
		t.Errorf("gemma2 defaults: window %d, soft-caps %v %v", c.SlidingWindow, c.AttnSoftCap, c.FinalSoftCap)
	}
}

// TestGemmaNeedsExtendedOps: on a backend without ExtendedOps a Gemma file
// is refused, naming the backend and what the model needs, and nothing is
// left allocated.
func TestGemmaNeedsExtendedOps(t *testing.T) {
	for _, name := range []string{"gemma2", "gemma3"} {
		cpu := &countingCPU{CPU: kernels.NewCPU(1)}
		// opaque (backend_test.go) shows kernels.Backend alone: a backend
		// without ExtendedOps, as the CUDA one is today.
		_, err := Load(gemmaFile(t, name, 8, quant.F32), Options{Backend: opaque{cpu}})
		if !errors.Is(err, engine.ErrUnsupported) || !strings.Contains(err.Error(), "gelu activation") ||
			!strings.Contains(err.Error(), "sliding-window attention") || !strings.Contains(err.Error(), fmt.Sprintf("architecture %s needs", name)) {
			t.Errorf("%s: Load = %v", name, err)
		}
		if b, m := cpu.live(); b != 0 || m != 0 {
			t.Errorf("%s: %d buffers and %d matrices left", name, b, m)
		}
		cpu.Close()
	}
}
