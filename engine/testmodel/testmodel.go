// Package testmodel writes Llama-architecture GGUF files with deterministic
// pseudo-random weights, for tests and benchmarks that need a model of a
// given shape and tensor type without downloading one.
//
// Every 2-D weight is drawn from N(0, 0.02²) by a PCG generator seeded from
// the Spec's seed, the tensor's name and the row index, so a weight is the
// same whatever the tensor type it is stored in: a Q4_K file and an F32 file
// with the same seed hold the same model up to quantization error. Norm
// weights are 1. The vocabulary is a synthetic SentencePiece-style "llama"
// vocabulary: <unk>, <s>, </s>, the 256 byte tokens <0x00>…<0xFF>, single
// characters, then pieces made by joining two earlier pieces, each scored
// so that earlier pieces merge first.
//
// Write streams the tensors to disk a block of rows at a time, so a
// 1.1-billion-parameter file is written in bounded memory.
package testmodel

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/kernels/quant"
)

// Spec is the shape of a generated model.
type Spec struct {
	Dim     int // embedding length
	Hidden  int // feed-forward length
	Layers  int
	Heads   int
	KVHeads int
	Vocab   int // at least MinVocab
	Context int // context length written to the metadata
	// Type is the storage type of the 2-D tensors (1-D norms are F32).
	Type quant.Type
	// Tied leaves output.weight out, so the output head reuses the token
	// embedding.
	Tied bool
	Seed uint64
}

// MinVocab is the smallest vocabulary Write accepts: 3 special tokens, 256
// byte tokens and at least one text piece.
const MinVocab = 260

// Generation constants, written into the metadata.
const (
	NormEps  = 1e-5
	RopeBase = 10000
	// WeightStd is the standard deviation of the 2-D weights.
	WeightStd = 0.02
)

// presets returns the named shapes. Their Type is the default for the
// preset; callers may override it.
func presets() map[string]Spec {
	return map[string]Spec{
		// Small enough for unit tests to write and run in milliseconds.
		"tiny": {Dim: 64, Hidden: 192, Layers: 2, Heads: 4, KVHeads: 2, Vocab: 512, Context: 256, Type: quant.F32, Seed: 1},
		// The llama2.c stories110M shape (Llama 2 vocabulary size).
		"llama-110m": {Dim: 768, Hidden: 2048, Layers: 12, Heads: 12, KVHeads: 12, Vocab: 32000, Context: 1024, Type: quant.Q8_0, Tied: true, Seed: 1},
		// TinyLlama 1.1B's shape.
		"tinyllama-1.1b": {Dim: 2048, Hidden: 5632, Layers: 22, Heads: 32, KVHeads: 4, Vocab: 32000, Context: 2048, Type: quant.Q8_0, Seed: 1},
	}
}

// Preset returns the named preset ("tiny", "llama-110m", "tinyllama-1.1b").
func Preset(name string) (Spec, bool) {
	s, ok := presets()[name]
	return s, ok
}

// Presets lists the preset names, sorted.
func Presets() []string {
	var names []string
	for n := range presets() {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// HeadDim is Dim/Heads.
func (s Spec) HeadDim() int { return s.Dim / s.Heads }

// Params returns the number of weights in the file (norms included).
func (s Spec) Params() int64 {
	kv := int64(s.KVHeads * s.HeadDim())
	d, h := int64(s.Dim), int64(s.Hidden)
	perLayer := 2*d + 2*d*d + 2*d*kv + 3*d*h
	n := int64(s.Layers)*perLayer + int64(s.Vocab)*d + d
	if !s.Tied {
		n += int64(s.Vocab) * d
	}
	return n
}

// Validate checks that the shape is consistent and storable in Type. Row
// lengths (Dim and Hidden) must be multiples of Type's block size: 32 for
// Q8_0 and Q4_0, 256 for Q4_K and Q6_K. Unlike llama.cpp's quantizer, which
// falls back to another type for tensors whose rows do not fit, Write
// reports the shape as an error, so a file's types are always the ones asked
// for. Errors wrap engine.ErrInvalidInput (engine.ErrUnsupported for a type
// the kernels do not implement).
func (s Spec) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("testmodel: "+format+": %w", append(args, engine.ErrInvalidInput)...)
	}
	const limit = 1 << 20
	for _, f := range []struct {
		name string
		v    int
	}{{"dim", s.Dim}, {"hidden", s.Hidden}, {"layers", s.Layers}, {"heads", s.Heads}, {"kv-heads", s.KVHeads}, {"vocab", s.Vocab}, {"context", s.Context}} {
		if f.v <= 0 || f.v > limit {
			return bad("%s = %d, want [1, %d]", f.name, f.v, limit)
		}
	}
	switch {
	case s.Dim%s.Heads != 0:
		return bad("dim %d is not a multiple of heads %d", s.Dim, s.Heads)
	case s.Heads%s.KVHeads != 0:
		return bad("heads %d is not a multiple of kv-heads %d", s.Heads, s.KVHeads)
	case s.HeadDim()%2 != 0:
		return bad("head dimension %d is odd; RoPE rotates pairs", s.HeadDim())
	case s.Vocab < MinVocab:
		return bad("vocab = %d, want at least %d (3 special and 256 byte tokens, and text pieces)", s.Vocab, MinVocab)
	}
	if !s.Type.Supported() {
		var names []string
		for _, t := range quant.SupportedTypes() {
			names = append(names, t.String())
		}
		return fmt.Errorf("testmodel: type %s is not supported (supported: %s): %w", s.Type, strings.Join(names, ", "), engine.ErrUnsupported)
	}
	if bs := s.Type.BlockSize(); s.Dim%bs != 0 || s.Hidden%bs != 0 {
		return bad("%s stores rows in blocks of %d, but dim %d and hidden %d must both be multiples of it", s.Type, bs, s.Dim, s.Hidden)
	}
	return nil
}

// Token types of the GGUF tokenizer.ggml.token_type array.
const (
	typeNormal  = 1
	typeUnknown = 2
	typeControl = 3
	typeByte    = 6
)

// alphabet holds the single-character pieces every vocabulary starts with;
// "▁" is SentencePiece's space.
const alphabet = "▁abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'\"-:;()"

// Vocabulary returns the synthetic vocabulary of a Spec: tokens, scores and
// token types, as Write stores them.
func Vocabulary(size int, seed uint64) (tokens []string, scores []float32, types []int32) {
	tokens = []string{"<unk>", "<s>", "</s>"}
	types = []int32{typeUnknown, typeControl, typeControl}
	for b := range 256 {
		tokens = append(tokens, fmt.Sprintf("<0x%02X>", b))
		types = append(types, typeByte)
	}
	seen := make(map[string]bool)
	var pieces []string
	add := func(p string) {
		if len(tokens) < size && !seen[p] {
			seen[p] = true
			pieces = append(pieces, p)
			tokens = append(tokens, p)
			types = append(types, typeNormal)
		}
	}
	for _, r := range alphabet {
		add(string(r))
	}
	rng := rand.New(rand.NewPCG(seed, 0x5eed_70c3))
	for tries := 0; len(tokens) < size; tries++ {
		// Favour pieces that start with a space, as real vocabularies do,
		// and keep pieces short enough to be plausible words.
		a := pieces[rng.IntN(len(pieces))]
		if tries%3 == 0 {
			a = "▁"
		}
		p := a + pieces[rng.IntN(len(pieces))]
		if len([]rune(p)) <= 12 {
			add(p)
		}
		if tries > 100*size {
			// Unreachable for the sizes Validate allows; keeps a bad seed
			// from looping forever.
			add(fmt.Sprintf("▁tok%d", len(tokens)))
		}
	}
	// Pieces made earlier score higher, so SentencePiece merges build later
	// pieces out of earlier ones; special and byte tokens score 0.
	scores = make([]float32, len(tokens))
	for i := 259; i < len(tokens); i++ {
		scores[i] = -float32(i - 259)
	}
	return tokens, scores, types
}

// tensorSeed derives the generator stream of one tensor from the model seed
// and the tensor's name.
func tensorSeed(name string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return h.Sum64()
}

// weightRow fills dst with row r of the named tensor.
func weightRow(pcg *rand.PCG, rng *rand.Rand, seed uint64, name string, r int, dst []float32) {
	pcg.Seed(seed, tensorSeed(name)^(uint64(r)*0x9e3779b97f4a7c15))
	for i := range dst {
		dst[i] = float32(rng.NormFloat64() * WeightStd)
	}
}

// Weights returns the float32 values of the named 2-D tensor (rows of cols),
// as Write generates them before converting to the Spec's type. Meant for
// tests on small shapes.
func Weights(seed uint64, name string, rows, cols int) []float32 {
	pcg := rand.NewPCG(0, 0)
	rng := rand.New(pcg)
	out := make([]float32, rows*cols)
	for r := range rows {
		weightRow(pcg, rng, seed, name, r, out[r*cols:(r+1)*cols])
	}
	return out
}
