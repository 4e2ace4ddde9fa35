package model

import (
	"fmt"
	"math"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/gguf"
	"github.com/baton-serving/baton/kernels"
)

// maxDim bounds every size read from metadata, so that products of two of
// them (rows·cols, positions·width) cannot overflow an int.
const maxDim = 1 << 24

// meta reads {arch}.* hyper-parameters, remembering the first error.
type meta struct {
	f    *gguf.File
	arch string
	err  error
}

func (m *meta) fail(format string, args ...any) {
	if m.err == nil {
		m.err = fmt.Errorf("model: "+format, args...)
	}
}

// count reads a positive integer key. A missing key takes def when def > 0
// and is an error otherwise.
func (m *meta) count(suffix string, def int) int {
	key := m.arch + "." + suffix
	if _, present := m.f.Get(key); !present {
		if def > 0 {
			return def
		}
		m.fail("required key %s is missing: %w", key, engine.ErrInvalidInput)
		return 0
	}
	v, ok := m.f.Uint(key)
	if !ok || v == 0 || v > maxDim {
		val, _ := m.f.Get(key)
		m.fail("%s = %v, want an integer in [1, %d]: %w", key, val, maxDim, engine.ErrInvalidInput)
		return 0
	}
	return int(v)
}

// float reads a finite positive float key; a missing key takes def when
// def > 0 and is an error otherwise.
func (m *meta) float(suffix string, def float64) float32 {
	key := m.arch + "." + suffix
	if _, present := m.f.Get(key); !present {
		if def > 0 {
			return float32(def)
		}
		m.fail("required key %s is missing: %w", key, engine.ErrInvalidInput)
		return 0
	}
	v, ok := m.f.Float(key)
	if !ok || !(v > 0) || math.IsInf(v, 0) || v > math.MaxFloat32 {
		val, _ := m.f.Get(key)
		m.fail("%s = %v, want a finite number > 0: %w", key, val, engine.ErrInvalidInput)
		return 0
	}
	return float32(v)
}

// readConfig reads the hyper-parameters shared by the Llama family of
// architectures, with llama.cpp's defaults for absent keys: head_count_kv =
// head_count, key_length = embedding_length/head_count, rope.freq_base =
// 10000, rope.dimension_count = key_length, vocab_size = the tokenizer's
// token count (or the embedding's row count).
func readConfig(f *gguf.File, arch string) (Config, error) {
	m := &meta{f: f, arch: arch}
	c := Config{Architecture: arch, RopeLayout: kernels.RopeNormal, RopeScale: 1}
	c.Name, _ = f.String("general.name")
	c.Dim = m.count("embedding_length", 0)
	c.Hidden = m.count("feed_forward_length", 0)
	c.Layers = m.count("block_count", 0)
	c.Heads = m.count("attention.head_count", 0)
	c.TrainContextLength = m.count("context_length", 0)
	c.NormEps = m.float("attention.layer_norm_rms_epsilon", 0)
	if m.err != nil {
		return Config{}, m.err
	}
	c.KVHeads = m.count("attention.head_count_kv", c.Heads)
	if _, ok := f.Get(arch + ".attention.key_length"); !ok && c.Dim%c.Heads != 0 {
		return Config{}, fmt.Errorf("model: embedding_length %d is not a multiple of head_count %d and %s.attention.key_length is absent: %w", c.Dim, c.Heads, arch, engine.ErrInvalidInput)
	}
	c.HeadDim = m.count("attention.key_length", c.Dim/c.Heads)
	if vl := m.count("attention.value_length", c.HeadDim); vl != c.HeadDim && m.err == nil {
		m.fail("%s.attention.value_length %d differs from key_length %d, which is not supported: %w", arch, vl, c.HeadDim, engine.ErrUnsupported)
	}
	c.RopeBase = m.float("rope.freq_base", 10000)
	c.RopeDim = m.count("rope.dimension_count", c.HeadDim)
	c.ContextLength = c.TrainContextLength
	if m.err != nil {
		return Config{}, m.err
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
	case c.Heads*c.HeadDim > maxDim:
		return Config{}, fmt.Errorf("model: %d heads of %d elements are too wide: %w", c.Heads, c.HeadDim, engine.ErrInvalidInput)
	}

	if v, ok := f.Uint(arch + ".vocab_size"); ok {
		if v == 0 || v > maxDim {
			return Config{}, fmt.Errorf("model: %s.vocab_size = %d, want [1, %d]: %w", arch, v, maxDim, engine.ErrInvalidInput)
		}
		c.Vocab = int(v)
	} else if toks, ok := f.Strings("tokenizer.ggml.tokens"); ok && len(toks) > 0 {
		c.Vocab = len(toks)
	} else if t, ok := f.Tensor("token_embd.weight"); ok && len(t.Dims) == 2 && t.Dims[1] > 0 && t.Dims[1] <= maxDim {
		c.Vocab = int(t.Dims[1])
	} else {
		return Config{}, fmt.Errorf("model: no %s.vocab_size, tokenizer.ggml.tokens or token_embd.weight to size the vocabulary: %w", arch, engine.ErrInvalidInput)
	}
	// Without its own output matrix the head reuses the token embedding.
	// Decided here, from the file alone, so that Inspect and Load agree.
	_, hasOutput := f.Tensor("output.weight")
	c.TiedOutput = !hasOutput
	return c, nil
}

// readRopeScaling applies {arch}.rope.scaling.* (or the older
// rope.scale_linear): linear scaling divides positions by the factor; other
// scaling types are not implemented.
func readRopeScaling(f *gguf.File, arch string, c *Config) error {
	typ, hasType := f.String(arch + ".rope.scaling.type")
	factor, hasFactor := f.Float(arch + ".rope.scaling.factor")
	if !hasFactor {
		factor, hasFactor = f.Float(arch + ".rope.scale_linear")
	}
	if hasType && typ != "none" && typ != "linear" {
		return fmt.Errorf("model: %s.rope.scaling.type %q is not supported (supported: none, linear): %w", arch, typ, engine.ErrUnsupported)
	}
	if typ == "none" || !hasFactor || factor == 0 || factor == 1 {
		return nil
	}
	if !(factor > 0) || math.IsInf(factor, 0) {
		return fmt.Errorf("model: rope scaling factor %v, want a finite number > 0: %w", factor, engine.ErrInvalidInput)
	}
	c.RopeScale = float32(1 / factor)
	return nil
}
