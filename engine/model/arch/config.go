package arch

import (
	"fmt"
	"math"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/gguf"
	"github.com/baton-serving/baton/kernels"
	"github.com/baton-serving/baton/kernels/quant"
)

// MaxDim bounds every size read from metadata, so that products of two of
// them (rows·cols, positions·width) cannot overflow an int.
const MaxDim = 1 << 24

// MaxWidthRatio bounds feed_forward_length and the width of the query
// heads (head_count × key_length) by this multiple of embedding_length.
// The decoder sizes its scratch buffers by them before a tensor is read;
// published models stay under 8× (Gemma-2B's 16384 over 2048) and 2×
// (Qwen3-0.6B's 16 heads of 128 over 1024), so a file beyond 64× is
// wrong, and refused by name before anything is allocated for it.
const MaxWidthRatio = 64

// Config holds a model's hyper-parameters as read from the GGUF metadata,
// with llama.cpp's defaults filled in. engine/model calls it model.Config.
type Config struct {
	Architecture string
	Name         string // general.name, informational
	Dim          int    // embedding length
	Hidden       int    // feed-forward length
	Layers       int
	Heads        int
	KVHeads      int
	HeadDim      int
	Vocab        int
	// ContextLength is the context window Forward enforces: Options'
	// override or TrainContextLength.
	ContextLength      int
	TrainContextLength int
	NormEps            float32
	RopeBase           float32
	// RopeScale multiplies positions before rotation (1/factor of linear
	// RoPE scaling; 1 without scaling).
	RopeScale  float32
	RopeDim    int // leading dimensions of each head that RoPE rotates
	RopeLayout kernels.RopeLayout
	// TiedOutput means the output head reuses the token embedding matrix.
	TiedOutput bool
	// RopeYarnOrigCtx, when > 0, turns on YaRN (rope.scaling.type "yarn"):
	// the context length the model was trained at
	// (rope.scaling.original_context_length, else context_length), which
	// sets the dimensions between which positions go from extrapolated
	// (fast rotations) to interpolated by RopeScale (slow ones), as
	// llama.cpp's rope with ext_factor 1, beta_fast 32, beta_slow 1 does.
	RopeYarnOrigCtx int
	// RopeAttnFactor multiplies the rotated vectors (rope.scaling.attn_factor,
	// and under YaRN its magnitude correction 1 + 0.1·ln(1/RopeScale)
	// besides); 0 means 1.
	RopeAttnFactor float32
	// RopeOrigContext is phi3's rope.scaling.original_context_length (its
	// Configure reads it; TrainContextLength when absent): its longrope
	// uses rope_factors_long when the context window in use exceeds it
	// (LongRope). 0 for the other architectures.
	RopeOrigContext int

	// The fields below are the operations that need the kernels'
	// ExtendedOps (contract C1) and per-layer attention settings. An
	// architecture's Configure sets them from its metadata; engine/model
	// refuses a model that sets any on a backend without ExtendedOps, with
	// an error wrapping engine.ErrUnsupported (see Extended). Zero means
	// "not used".

	// EmbedScale multiplies the token embeddings (Gemma: √Dim).
	EmbedScale float32
	// AttnScale multiplies q·k; 0 means 1/√HeadDim.
	AttnScale float32
	// QueryScale multiplies each query after RoPE, before the scores
	// (llama.cpp's Gemma 2 scales q so, then scores with AttnScale 1).
	QueryScale float32
	// AttnSoftCap soft-caps attention scores: s ↦ c·tanh(s/c).
	AttnSoftCap float32
	// FinalSoftCap soft-caps the output logits.
	FinalSoftCap float32
	// SlidingWindow is the attention window of local layers
	// (attention.sliding_window): a query at position p sees the keys at
	// p-SlidingWindow+1 … p. Which layers are local, SWAPattern says; the
	// window a layer applies, LayerWindow.
	SlidingWindow int
	// SWAPattern: layer il is global when (il+1) % SWAPattern == 0, local
	// otherwise (Gemma 2: 2, Gemma 3: 6); 0 makes every layer local (phi3).
	SWAPattern int
	// RopeBaseLocal, when not 0, is the RoPE base of local layers, which
	// then rotate without RopeScale (Gemma 3: base 10000, scale 1; its
	// global layers keep RopeBase and RopeScale).
	RopeBaseLocal float32
}

// Local reports whether layer il is a sliding-window layer: SlidingWindow
// > 0 and, with a SWAPattern, il is not one of its global layers. Local
// layers rotate with RopeBaseLocal when it is set (Gemma 3), whatever the
// window's width.
func (c Config) Local(il int) bool {
	return c.SlidingWindow > 0 && (c.SWAPattern == 0 || (il+1)%c.SWAPattern != 0)
}

// LayerWindow is the sliding window layer il's attention applies, 0 for
// none: SlidingWindow in a local layer, unless it is at least
// ContextLength, the context window in use. Such a window masks nothing
// (no query is that far from a key), so it is dropped, and a model whose
// only extended operation it would be (phi3's 128k files, window 262144)
// runs on backends without kernels.ExtendedOps.
func (c Config) LayerWindow(il int) int {
	if !c.Local(il) || c.SlidingWindow >= c.ContextLength {
		return 0
	}
	return c.SlidingWindow
}

// window is the sliding window some layer applies (LayerWindow), 0 when
// none does.
func (c Config) window() int {
	for il := range c.Layers {
		if w := c.LayerWindow(il); w > 0 {
			return w
		}
	}
	return 0
}

// QDim is the width of all query heads together.
func (c Config) QDim() int { return c.Heads * c.HeadDim }

// KVDim is the width of one position's keys (or values) in all KV heads.
func (c Config) KVDim() int { return c.KVHeads * c.HeadDim }

// KVLayout returns the layout of paged KV cache pages for this
// configuration: pageSize positions of dtype (F32 or F16) per page.
func (c Config) KVLayout(pageSize int, dtype quant.Type) kernels.KVLayout {
	return kernels.KVLayout{Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim, PageSize: pageSize, DType: dtype}
}

// Extended lists the operations c asks for that need the kernels'
// ExtendedOps; empty when none.
func (c Config) Extended() []string {
	var need []string
	if c.EmbedScale != 0 {
		need = append(need, "embedding scale")
	}
	if c.AttnScale != 0 {
		need = append(need, "attention scale")
	}
	if c.QueryScale != 0 {
		need = append(need, "query scale")
	}
	if c.AttnSoftCap != 0 {
		need = append(need, "attention soft-cap")
	}
	if c.FinalSoftCap != 0 {
		need = append(need, "final logit soft-cap")
	}
	if w := c.window(); w > 0 {
		need = append(need, fmt.Sprintf("sliding-window attention (a window of %d positions)", w))
	}
	if c.RopeBaseLocal != 0 {
		need = append(need, "per-layer rope base")
	}
	return need
}

// LongRope reports whether the context window in use exceeds the
// original one, which makes phi3's longrope use rope_factors_long instead
// of rope_factors_short: llama.cpp c392e50 (build_rope_factors) decides by
// its context size per sequence, n_ctx/n_seq_max, which Baton's per-
// sequence ContextLength is.
func (c Config) LongRope() bool { return c.RopeOrigContext > 0 && c.ContextLength > c.RopeOrigContext }

// Meta reads {arch}.* hyper-parameters, remembering the first error.
type Meta struct {
	F    *gguf.File
	Arch string
	Err  error
}

// Fail records an error (the first one only). format and args are those of
// fmt.Errorf, without the "model: " prefix.
func (m *Meta) Fail(format string, args ...any) {
	if m.Err == nil {
		m.Err = fmt.Errorf("model: "+format, args...)
	}
}

// Has reports whether {arch}.suffix is present.
func (m *Meta) Has(suffix string) bool {
	_, ok := m.F.Get(m.Arch + "." + suffix)
	return ok
}

// Count reads a positive integer key. A missing key takes def when def > 0
// and is an error otherwise.
func (m *Meta) Count(suffix string, def int) int {
	key := m.Arch + "." + suffix
	if _, present := m.F.Get(key); !present {
		if def > 0 {
			return def
		}
		m.Fail("required key %s is missing: %w", key, engine.ErrInvalidInput)
		return 0
	}
	v, ok := m.F.Uint(key)
	if !ok || v == 0 || v > MaxDim {
		val, _ := m.F.Get(key)
		m.Fail("%s = %v, want an integer in [1, %d]: %w", key, val, MaxDim, engine.ErrInvalidInput)
		return 0
	}
	return int(v)
}

// Float reads a finite positive float key; a missing key takes def when
// def > 0 and is an error otherwise.
func (m *Meta) Float(suffix string, def float64) float32 {
	key := m.Arch + "." + suffix
	if _, present := m.F.Get(key); !present {
		if def > 0 {
			return float32(def)
		}
		m.Fail("required key %s is missing: %w", key, engine.ErrInvalidInput)
		return 0
	}
	v, ok := m.F.Float(key)
	if !ok || !(v > 0) || math.IsInf(v, 0) || v > math.MaxFloat32 {
		val, _ := m.F.Get(key)
		m.Fail("%s = %v, want a finite number > 0: %w", key, val, engine.ErrInvalidInput)
		return 0
	}
	return float32(v)
}

// ReadConfig reads the hyper-parameters of f's architecture a, with
// llama.cpp's defaults for absent keys: head_count_kv = head_count,
// key_length = embedding_length/head_count, rope.freq_base = 10000,
// rope.dimension_count = key_length, vocab_size = the tokenizer's token
// count (or the embedding's row count); then a.Configure's own keys.
func ReadConfig(f *gguf.File, a *Arch) (Config, error) {
	arch := a.Name
	m := &Meta{F: f, Arch: arch}
	c := Config{Architecture: arch, RopeLayout: a.RopeLayout, RopeScale: 1}
	c.Name, _ = f.String("general.name")
	c.Dim = m.Count("embedding_length", 0)
	c.Hidden = m.Count("feed_forward_length", 0)
	c.Layers = m.Count("block_count", 0)
	c.Heads = m.Count("attention.head_count", 0)
	c.TrainContextLength = m.Count("context_length", 0)
	c.NormEps = m.Float("attention.layer_norm_rms_epsilon", 0)
	if m.Err != nil {
		return Config{}, m.Err
	}
	// Every architecture has tensors in every block: a block count beyond
	// the file's tensors is wrong, and refused before anything is sized
	// by it.
	if c.Layers > len(f.Tensors) {
		return Config{}, fmt.Errorf("model: %s.block_count %d, but the file holds only %d tensors: %w", arch, c.Layers, len(f.Tensors), engine.ErrInvalidInput)
	}
	c.KVHeads = m.Count("attention.head_count_kv", c.Heads)
	if !m.Has("attention.key_length") && c.Dim%c.Heads != 0 {
		return Config{}, fmt.Errorf("model: embedding_length %d is not a multiple of head_count %d and %s.attention.key_length is absent: %w", c.Dim, c.Heads, arch, engine.ErrInvalidInput)
	}
	c.HeadDim = m.Count("attention.key_length", c.Dim/c.Heads)
	if vl := m.Count("attention.value_length", c.HeadDim); vl != c.HeadDim && m.Err == nil {
		m.Fail("%s.attention.value_length %d differs from key_length %d, which is not supported: %w", arch, vl, c.HeadDim, engine.ErrUnsupported)
	}
	c.RopeBase = m.Float("rope.freq_base", 10000)
	c.RopeDim = m.Count("rope.dimension_count", c.HeadDim)
	c.ContextLength = c.TrainContextLength
	if m.Err != nil {
		return Config{}, m.Err
	}
	if err := readRopeScaling(f, arch, &c); err != nil {
		return Config{}, err
	}
	if n, ok := f.Uint(arch + ".expert_count"); ok && n > 0 {
		return Config{}, fmt.Errorf("model: %s.expert_count = %d: mixture-of-experts models are not supported: %w", arch, n, engine.ErrUnsupported)
	}

	switch {
	case c.Heads%c.KVHeads != 0:
		return Config{}, fmt.Errorf("model: head_count %d is not a multiple of head_count_kv %d: %w", c.Heads, c.KVHeads, engine.ErrInvalidInput)
	case c.RopeDim > c.HeadDim || c.RopeDim%2 != 0:
		return Config{}, fmt.Errorf("model: rope.dimension_count %d must be even and at most the head dimension %d: %w", c.RopeDim, c.HeadDim, engine.ErrInvalidInput)
	case c.Heads*c.HeadDim > MaxDim:
		return Config{}, fmt.Errorf("model: %d heads of %d elements are too wide: %w", c.Heads, c.HeadDim, engine.ErrInvalidInput)
	case c.Hidden > MaxWidthRatio*c.Dim:
		return Config{}, fmt.Errorf("model: %s.feed_forward_length %d is more than %d × embedding_length %d: %w", arch, c.Hidden, MaxWidthRatio, c.Dim, engine.ErrInvalidInput)
	case c.Heads*c.HeadDim > MaxWidthRatio*c.Dim:
		return Config{}, fmt.Errorf("model: %s.attention.head_count %d × key_length %d is more than %d × embedding_length %d: %w", arch, c.Heads, c.HeadDim, MaxWidthRatio, c.Dim, engine.ErrInvalidInput)
	}

	vocabSource := arch + ".vocab_size"
	if v, ok := f.Uint(arch + ".vocab_size"); ok {
		if v == 0 || v > MaxDim {
			return Config{}, fmt.Errorf("model: %s.vocab_size = %d, want [1, %d]: %w", arch, v, MaxDim, engine.ErrInvalidInput)
		}
		c.Vocab = int(v)
	} else if toks, ok := f.Strings("tokenizer.ggml.tokens"); ok && len(toks) > 0 {
		c.Vocab, vocabSource = len(toks), "tokenizer.ggml.tokens"
	} else if t, ok := f.Tensor("token_embd.weight"); ok && len(t.Dims) == 2 && t.Dims[1] > 0 && t.Dims[1] <= MaxDim {
		c.Vocab = int(t.Dims[1])
	} else {
		return Config{}, fmt.Errorf("model: no %s.vocab_size, tokenizer.ggml.tokens or token_embd.weight to size the vocabulary: %w", arch, engine.ErrInvalidInput)
	}
	// The scratch space of a forward pass is sized by these numbers
	// before any tensor is read: a token embedding of another shape than
	// they say is refused here, naming the keys, rather than after a
	// vocabulary-wide buffer has been asked for.
	if t, ok := f.Tensor("token_embd.weight"); ok && len(t.Dims) == 2 && (t.Dims[0] != uint64(c.Dim) || t.Dims[1] != uint64(c.Vocab)) {
		return Config{}, fmt.Errorf("model: token_embd.weight is %d×%d, but %s.embedding_length is %d and the vocabulary (%s) %d: %w",
			t.Dims[1], t.Dims[0], arch, c.Dim, vocabSource, c.Vocab, engine.ErrInvalidInput)
	}
	// Without its own output matrix the head reuses the token embedding.
	// Decided here, from the file alone, so that Inspect and Load agree.
	_, hasOutput := f.Tensor("output.weight")
	c.TiedOutput = !hasOutput
	if a.Configure != nil {
		if err := a.Configure(m, &c); err != nil {
			return Config{}, err
		}
		if m.Err != nil {
			return Config{}, m.Err
		}
	}
	return c, nil
}

// readRopeScaling applies {arch}.rope.scaling.* (or the older
// rope.scale_linear), as llama.cpp c392e50 does for every architecture
// whose graph passes its scaling parameters to RoPE (llama, qwen2, qwen3
// among them): linear scaling divides positions by the factor; YaRN (type
// "yarn") does so in the slow dimensions only and corrects the magnitude
// (see Config.RopeYarnOrigCtx); rope.scaling.attn_factor multiplies the
// rotation. "longrope" is linear here (phi3's factors are tensors);
// other types are refused.
func readRopeScaling(f *gguf.File, arch string, c *Config) error {
	typ, hasType := f.String(arch + ".rope.scaling.type")
	factor, hasFactor := f.Float(arch + ".rope.scaling.factor")
	if !hasFactor {
		factor, hasFactor = f.Float(arch + ".rope.scale_linear")
	}
	// "longrope" scales like "linear" in llama.cpp c392e50 (ext_factor 0);
	// phi3's factor tensors and attn_factor do the rest.
	if hasType && typ != "none" && typ != "linear" && typ != "yarn" && typ != "longrope" {
		return fmt.Errorf("model: %s.rope.scaling.type %q is not supported (supported: none, linear, yarn, longrope): %w", arch, typ, engine.ErrUnsupported)
	}
	if v, ok := f.Get(arch + ".rope.scaling.attn_factor"); ok {
		af, ok := f.Float(arch + ".rope.scaling.attn_factor")
		if !ok || !(af > 0) || math.IsInf(af, 0) || af > 1e6 {
			return fmt.Errorf("model: %s.rope.scaling.attn_factor = %v, want a finite number > 0: %w", arch, v, engine.ErrInvalidInput)
		}
		if af != 1 {
			c.RopeAttnFactor = float32(af)
		}
	}
	if typ == "none" {
		return nil
	}
	if hasFactor && factor != 0 && factor != 1 {
		if !(factor > 0) || math.IsInf(factor, 0) || factor > 1e6 {
			return fmt.Errorf("model: rope scaling factor %v, want a finite number > 0: %w", factor, engine.ErrInvalidInput)
		}
		c.RopeScale = float32(1 / factor)
	}
	if typ == "yarn" {
		c.RopeYarnOrigCtx = c.TrainContextLength
		if v, ok := f.Get(arch + ".rope.scaling.original_context_length"); ok {
			n, ok := f.Uint(arch + ".rope.scaling.original_context_length")
			if !ok || n == 0 || n > MaxDim {
				return fmt.Errorf("model: %s.rope.scaling.original_context_length = %v, want [1, %d]: %w", arch, v, MaxDim, engine.ErrInvalidInput)
			}
			c.RopeYarnOrigCtx = int(n)
		}
	}
	return nil
}

// KV is one metadata entry of a written file.
type KV struct {
	Key   string
	Value any
}

// Keys returns the {arch}.* metadata entries that describe c to ReadConfig
// (and to llama.cpp): the common ones, then a's own (Arch.Keys).
func Keys(a *Arch, c Config) []KV {
	p := a.Name + "."
	kvs := []KV{
		{p + "context_length", uint32(c.TrainContextLength)},
		{p + "embedding_length", uint32(c.Dim)},
		{p + "feed_forward_length", uint32(c.Hidden)},
		{p + "block_count", uint32(c.Layers)},
		{p + "attention.head_count", uint32(c.Heads)},
		{p + "attention.head_count_kv", uint32(c.KVHeads)},
	}
	if c.Heads*c.HeadDim != c.Dim {
		kvs = append(kvs, KV{p + "attention.key_length", uint32(c.HeadDim)}, KV{p + "attention.value_length", uint32(c.HeadDim)})
	}
	kvs = append(kvs,
		KV{p + "attention.layer_norm_rms_epsilon", c.NormEps},
		KV{p + "rope.freq_base", c.RopeBase},
		KV{p + "rope.dimension_count", uint32(c.RopeDim)},
		KV{p + "vocab_size", uint32(c.Vocab)},
	)
	kvs = append(kvs, ropeScalingKeys(p, c)...)
	if a.Keys != nil {
		kvs = append(kvs, a.Keys(c)...)
	}
	return kvs
}

// ropeScalingKeys are the rope.scaling.* entries that describe c's RoPE
// scaling to ReadConfig; none for an unscaled model.
func ropeScalingKeys(p string, c Config) []KV {
	var kvs []KV
	orig := c.RopeOrigContext
	if c.RopeYarnOrigCtx > 0 {
		kvs = append(kvs, KV{p + "rope.scaling.type", "yarn"})
		orig = c.RopeYarnOrigCtx
	}
	if c.RopeScale != 0 && c.RopeScale != 1 {
		kvs = append(kvs, KV{p + "rope.scaling.factor", 1 / c.RopeScale})
	}
	if orig != 0 && orig != c.TrainContextLength {
		kvs = append(kvs, KV{p + "rope.scaling.original_context_length", uint32(orig)})
	}
	if c.RopeAttnFactor != 0 && c.RopeAttnFactor != 1 {
		kvs = append(kvs, KV{p + "rope.scaling.attn_factor", c.RopeAttnFactor})
	}
	return kvs
}
