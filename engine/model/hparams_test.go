package model

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/gguf"
	"github.com/baton-serving/baton/kernels"
	"github.com/baton-serving/baton/kernels/quant"
)

// hparamPrompt is the prompt and decoded tokens of this file's reference
// comparisons: 8 positions, past gemmaFile's window of 4.
var hparamPrompt = []int32{1, 270, 281, 299, 17, 263, 290, 275}

// checkAgainst runs f (loaded as m) over hparamPrompt and compares each
// step's logits with the float64 reference under configuration c, which
// the test sets from what the file says (not from m.Config(), which would
// carry the same mistake as the decoder). Seven Gemma blocks at std 0.3
// amplify float32 rounding to ~1.5e-4 of the logits' spread; a setting
// read wrong moves them by more than 1e-2 (checked by the callers).
func checkAgainst(t *testing.T, f *gguf.File, m Model, c Config) [][]float32 {
	t.Helper()
	got := run(t, m, hparamPrompt[:4], hparamPrompt[4:])
	r := &refModel{f: f, c: c, neox: c.RopeLayout == kernels.RopeNeoX, gelu: true}
	for i := range got {
		want := r.logits(t, hparamPrompt[:4+i])
		if e := relLogitErr(want, got[i]); e > 1e-3 {
			t.Errorf("position %d: relative logit error %.3g against the reference", 3+i, e)
		}
	}
	return got
}

// TestGemma3Keys: gemma3's rope.freq_base_swa, attention.sliding_window_pattern
// and final_logit_softcapping are read and applied as llama.cpp d32676d
// does (src/models/gemma3.cpp): the local blocks' rope base, which blocks
// are local, a soft-cap of the logits; without a window every block is
// global with the global rope base. Each edited file computes what the
// reference computes with the setting the file names, and differs from
// the unedited file.
func TestGemma3Keys(t *testing.T) {
	base := gemmaFile(t, "gemma3", 4, quant.F32) // 7 blocks, window 4, rope base 1e6
	baseLogits := run(t, load(t, base, Options{Threads: 1}), hparamPrompt[:4], hparamPrompt[4:])
	want := m0Config(t, base)
	tests := []struct {
		name  string
		kvs   map[string]any
		edit  func(c *Config)
		local []bool // blocks 0–6
	}{
		{"freq_base_swa", map[string]any{"gemma3.rope.freq_base_swa": float32(500)},
			func(c *Config) { c.RopeBaseLocal = 500 }, []bool{true, true, true, true, true, false, true}},
		{"pattern 2", map[string]any{"gemma3.attention.sliding_window_pattern": uint32(2)},
			func(c *Config) { c.SWAPattern = 2 }, []bool{true, false, true, false, true, false, true}},
		{"pattern 0: every block local", map[string]any{"gemma3.attention.sliding_window_pattern": uint32(0)},
			func(c *Config) { c.SWAPattern = 0 }, []bool{true, true, true, true, true, true, true}},
		{"pattern 1: every block global", map[string]any{"gemma3.attention.sliding_window_pattern": uint32(1)},
			func(c *Config) { c.SWAPattern, c.SlidingWindow, c.RopeBaseLocal = 0, 0, 0 }, make([]bool, 7)},
		{"no window", map[string]any{"gemma3.attention.sliding_window": nil},
			func(c *Config) { c.SWAPattern, c.SlidingWindow, c.RopeBaseLocal = 0, 0, 0 }, make([]bool, 7)},
		{"window 0", map[string]any{"gemma3.attention.sliding_window": uint32(0), "gemma3.rope.freq_base_swa": float32(500)},
			func(c *Config) { c.SWAPattern, c.SlidingWindow, c.RopeBaseLocal = 0, 0, 0 }, make([]bool, 7)},
		{"final soft-cap", map[string]any{"gemma3.final_logit_softcapping": float32(2)},
			func(c *Config) { c.FinalSoftCap = 2 }, []bool{true, true, true, true, true, false, true}},
		{"final soft-cap 0", map[string]any{"gemma3.final_logit_softcapping": float32(0)},
			func(c *Config) {}, []bool{true, true, true, true, true, false, true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := rewriteKVs(t, base, setKVs(tc.kvs), nil)
			m := load(t, f, Options{Threads: 1})
			c := want
			tc.edit(&c)
			got := m.Config()
			if got.RopeBaseLocal != c.RopeBaseLocal || got.SWAPattern != c.SWAPattern || got.SlidingWindow != c.SlidingWindow || got.FinalSoftCap != c.FinalSoftCap {
				t.Errorf("config: local rope base %v, pattern %d, window %d, final soft-cap %v; want %v, %d, %d, %v",
					got.RopeBaseLocal, got.SWAPattern, got.SlidingWindow, got.FinalSoftCap, c.RopeBaseLocal, c.SWAPattern, c.SlidingWindow, c.FinalSoftCap)
			}
			for il, l := range tc.local {
				if got.Local(il) != l {
					t.Errorf("block %d: local %v, want %v", il, got.Local(il), l)
				}
			}
			logits := checkAgainst(t, f, m, c)
			unchanged := tc.name == "final soft-cap 0"
			if same := slices.EqualFunc(logits, baseLogits, slices.Equal[[]float32]); same != unchanged {
				t.Errorf("logits equal to the unedited file's: %v, want %v", same, unchanged)
			}
			// The reference tells the setting apart: read as the unedited
			// file's, the last step is far from what the file computes.
			r := &refModel{f: f, c: want, neox: true, gelu: true}
			if e := relLogitErr(r.logits(t, hparamPrompt), logits[len(logits)-1]); !unchanged && e < 1e-2 {
				t.Errorf("the reference with the unedited settings is only %.3g away", e)
			}
		})
	}
	// Bad values are errors naming the key.
	for _, tc := range []struct {
		key  string
		val  any
		want error
		text string
	}{
		{"gemma3.attention.sliding_window_pattern", []uint32{1, 1, 0, 1, 1, 0, 1}, engine.ErrUnsupported,
			"gemma3.attention.sliding_window_pattern is an array (a per-layer pattern)"},
		{"gemma3.attention.sliding_window_pattern", "six", engine.ErrInvalidInput, `gemma3.attention.sliding_window_pattern = "six", want an integer`},
		{"gemma3.rope.freq_base_swa", float32(-1), engine.ErrInvalidInput, "gemma3.rope.freq_base_swa = -1, want a finite number > 0"},
		{"gemma3.final_logit_softcapping", float32(-3), engine.ErrInvalidInput, "gemma3.final_logit_softcapping = -3, want 0 (none) or a finite number > 0"},
		{"gemma3.attention.sliding_window", "wide", engine.ErrInvalidInput, `gemma3.attention.sliding_window = "wide", want an integer in [0,`},
	} {
		_, err := Load(rewriteKVs(t, base, setKVs(map[string]any{tc.key: tc.val}), nil), Options{Threads: 1})
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.text) {
			t.Errorf("%s = %v: Load = %v, want %v containing %q", tc.key, tc.val, err, tc.want, tc.text)
		}
	}
}

// TestPhi4MiniLongRope: a Phi-4-mini-like file rotates part of each head
// (rope.dimension_count 12 of 16, as Phi-4-mini's 96 of 128) and carries
// longrope factors of one value per rotated pair (6), as llama.cpp d32676d
// declares them ({n_rot/2}); it loads and computes what the reference
// does with those factors, long and short.
func TestPhi4MiniLongRope(t *testing.T) {
	s := archSpecs()["phi3"]
	s.LongRope, s.RopeOrigContext = true, 16
	full := writeModel(t, s)
	cut := func(info gguf.TensorInfo, data []byte) (gguf.TensorInfo, []byte, bool) {
		if strings.HasPrefix(info.Name, "rope_factors_") {
			info.Dims = []uint64{6}
			data = data[:4*6]
		}
		return info, data, true
	}
	f := rewriteKVs(t, full, setKVs(map[string]any{"phi3.rope.dimension_count": uint32(12)}), cut)
	for _, ctx := range []int{0, 16} {
		m, err := Load(f, Options{Threads: 1, ContextLength: ctx})
		if err != nil {
			t.Fatalf("context %d: %v", ctx, err)
		}
		t.Cleanup(func() { m.Close() })
		c := m.Config()
		if c.RopeDim != 12 || c.HeadDim != 16 {
			t.Fatalf("rope dims %d of %d", c.RopeDim, c.HeadDim)
		}
		r := refFor(t, f, m)
		if len(r.factors) != 6 {
			t.Fatalf("%d factors in the file", len(r.factors))
		}
		got := run(t, m, phi3Prompt[:3], phi3Prompt[3:6])
		checkRef(t, r, got, 3)
	}
	// Factors of the head width (c392e50's {n_embd_head/2}) no longer fit.
	g := rewriteKVs(t, full, setKVs(map[string]any{"phi3.rope.dimension_count": uint32(12)}), nil)
	if _, err := Load(g, Options{Threads: 1}); !errors.Is(err, engine.ErrInvalidInput) || !strings.Contains(err.Error(), "tensor rope_factors_long.weight has dims [8], want [6]") {
		t.Errorf("factors of 8 with 12 rotated dimensions: %v", err)
	}
}

// TestMetadataBounds: sizes the decoder's scratch space is allocated by
// (feed_forward_length, the query heads' width, the vocabulary) are
// checked against embedding_length and the token embedding before
// anything is sized by them: Inspect, which reads no tensor, refuses such
// a file naming the key, and Load refuses it allocating almost nothing.
func TestMetadataBounds(t *testing.T) {
	f := writeModel(t, archSpecs()["llama"]) // dim 64, 4 heads of 16, vocab 300
	for _, tc := range []struct {
		name string
		kvs  map[string]any
		text string
	}{
		{"hidden", map[string]any{"llama.feed_forward_length": uint32(1 << 20)},
			"llama.feed_forward_length 1048576 is more than 64 × embedding_length 64"},
		{"head width", map[string]any{"llama.attention.key_length": uint32(1 << 16), "llama.attention.value_length": uint32(1 << 16), "llama.rope.dimension_count": uint32(64)},
			"llama.attention.head_count 4 × key_length 65536 is more than 64 × embedding_length 64"},
		{"vocab", map[string]any{"llama.vocab_size": uint32(1 << 24)},
			"token_embd.weight is 300×64, but llama.embedding_length is 64 and the vocabulary (llama.vocab_size) 16777216"},
		{"vocab from the tokens", map[string]any{"llama.vocab_size": nil, "llama.embedding_length": uint32(128), "llama.attention.key_length": uint32(16), "llama.attention.value_length": uint32(16)},
			"token_embd.weight is 300×64, but llama.embedding_length is 128 and the vocabulary (tokenizer.ggml.tokens) 300"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := rewriteKVs(t, f, setKVs(tc.kvs), nil)
			if _, _, err := Inspect(g, 0); !errors.Is(err, engine.ErrInvalidInput) || !strings.Contains(err.Error(), tc.text) {
				t.Errorf("Inspect = %v, want ErrInvalidInput containing %q", err, tc.text)
			}
			if _, err := Load(g, Options{Threads: 1}); !errors.Is(err, engine.ErrInvalidInput) || !strings.Contains(err.Error(), tc.text) {
				t.Errorf("Load = %v, want ErrInvalidInput containing %q", err, tc.text)
			}
		})
	}
}

// TestGemmaQueryScalarZero: Gemma's 27B block counts (gemma2 46, gemma3
// 62) scale queries by 1/√(embedding_length/head_count); with more heads
// than dimensions (a key_length makes that loadable) the quotient is 0
// and the scale +Inf, which made every logit NaN. Such a file is refused,
// naming the keys.
func TestGemmaQueryScalarZero(t *testing.T) {
	for _, tc := range []struct {
		arch   string
		layers uint32
	}{{"gemma2", 46}, {"gemma3", 62}} {
		s := archSpecs()[tc.arch]
		s.Layers, s.SlidingWindow = 5, 4 // 5 blocks of tensors: enough for block_count's bound
		f := writeModel(t, s)
		p := tc.arch + "."
		g := rewriteKVs(t, f, setKVs(map[string]any{p + "block_count": tc.layers, p + "attention.head_count": uint32(128),
			p + "attention.key_length": uint32(16), p + "attention.value_length": uint32(16)}), nil)
		c, _, err := Inspect(g, 0)
		text := "embedding_length 64 / " + tc.arch + ".attention.head_count 128 is 0"
		if !errors.Is(err, engine.ErrInvalidInput) || !strings.Contains(err.Error(), text) {
			t.Errorf("%s with %d blocks, 128 heads over 64 dimensions: Inspect = %v (query scale %v, score scale %v), want ErrInvalidInput containing %q",
				tc.arch, tc.layers, err, c.QueryScale, c.AttnScale, text)
		}
	}
}
