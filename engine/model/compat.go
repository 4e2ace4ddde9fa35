package model

import (
	"fmt"
	"strings"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/gguf"
)

// Numerics selects the arithmetic a model computes with.
//
// The engine's own kernels (NumericsDefault) compute in float32 with a
// float32 KV cache, except that products with F16 or BF16 weights take the
// activations rounded to the weights' type (to nearest even), as
// llama.cpp's CPU backend does: ggml converts the activations of a product
// to its weights' vec_dot_type, F16 for F16 weights and BF16 for BF16.
// With float32 activations instead, greedy generations of F16 and BF16
// files (common among published GGUFs) parted from llama.cpp's within a
// few tokens on random-weight models; with the rounding they agree. Each
// such product is then exact in float32, so only the summation order
// differs. llama.cpp stores keys and values in F16 by default and sums in
// orders set by its vector code, so the two agree on greedy tokens but
// differ in the fourth decimal of probabilities (2e-3 on the stories260K
// golden generations). NumericsLlamaCpp is for operators who migrate from
// llama.cpp and need its outputs exactly: it redoes llama.cpp's arithmetic
// operation by operation, at the cost of speed and generality.
type Numerics int

const (
	// NumericsDefault is the engine's own arithmetic: float32 throughout
	// save the activations of F16 and BF16 weight products, rounded to the
	// weights' type as llama.cpp rounds them; every supported tensor type,
	// batched and paged execution, and the fast kernels.
	NumericsDefault Numerics = iota

	// NumericsLlamaCpp reproduces the logits of llama.cpp's CPU backend as
	// built for x86-64 with AVX-512 (llama.cpp c392e509, February 2025, with
	// its default llamafile matrix kernels and without flash attention), to
	// the last bit save where libm rounding differs (see libmExpf in
	// compat_ggml.go). On the stories260K golden generations, with
	// llama.cpp's float32 softmax on top, every top-5 probability is within
	// 2.6e-7 of llama.cpp's and 1582 of the 1600 log-probabilities are the
	// same float32.
	//
	// It reproduces, in float32 unless stated: the KV cache stored as F16,
	// and queries and attention weights rounded to F16 before their
	// products with it; ggml's summation orders for every product — for a
	// single token the 4×16-lane fused multiply-add order of ggml_vec_dot
	// (leftovers in float32 for F32 weights, in float64 for F16 attention),
	// for a Forward of two or more tokens the 16-lane order of llamafile's
	// tinyBLAS where its shape conditions hold; RMSNorm's float64 sum;
	// RoPE angles by repeated float32 multiplication, with one product of
	// each rotation fused; softmax and SiLU with ggml's polynomial
	// exponential; and the last layer's feed-forward and the output head
	// run for the logits row alone, as llama.cpp selects its output rows.
	// A Forward call is one llama.cpp batch: calls of more than 512 tokens
	// (llama.cpp's default micro-batch) are split as llama.cpp splits them.
	//
	// Scope: F32 models of the llama architecture with the normal RoPE
	// layout, run with Forward over a KVCache (which then holds F16 values
	// as float32). Load fails with engine.ErrUnsupported for other tensor
	// types, and ForwardBatch always fails so. It computes on one goroutine
	// (Options.Threads is ignored), emulates every fused multiply-add in
	// software and keeps a float32 copy of the weights: it is a reference,
	// not a serving mode (on stories260K, 4 to 16 times slower than the
	// default on one thread). Probabilities
	// derived from the logits in float64 (as package sample does) differ
	// from llama.cpp's float32 softmax by up to about 2e-6.
	NumericsLlamaCpp
)

var numericsNames = []string{NumericsDefault: "default", NumericsLlamaCpp: "llamacpp"}

// String returns the name ParseNumerics accepts.
func (n Numerics) String() string {
	if n >= 0 && int(n) < len(numericsNames) {
		return numericsNames[n]
	}
	return fmt.Sprintf("Numerics(%d)", int(n))
}

// ParseNumerics parses a name as String writes it: "default" or "llamacpp".
func ParseNumerics(s string) (Numerics, error) {
	for i, name := range numericsNames {
		if s == name {
			return Numerics(i), nil
		}
	}
	return 0, fmt.Errorf("model: numerics %q, want one of %s: %w", s, strings.Join(numericsNames, ", "), engine.ErrInvalidInput)
}

// MarshalText implements encoding.TextMarshaler.
func (n Numerics) MarshalText() ([]byte, error) {
	if n < 0 || int(n) >= len(numericsNames) {
		return nil, fmt.Errorf("model: unknown numerics %d: %w", int(n), engine.ErrInvalidInput)
	}
	return []byte(n.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler, so that a Numerics
// can be a flag (flag.TextVar) or a configuration field.
func (n *Numerics) UnmarshalText(text []byte) error {
	v, err := ParseNumerics(string(text))
	if err != nil {
		return err
	}
	*n = v
	return nil
}

// withNumerics wraps a loaded llama model for a numerics mode other than
// the default. m's worker pool must not have been started: the modes run
// on the calling goroutine.
func withNumerics(f *gguf.File, m *decoder, n Numerics) (Model, error) {
	switch n {
	case NumericsLlamaCpp:
		return newLlamaCpp(f, m)
	default:
		return nil, fmt.Errorf("model: unknown numerics %d (supported: %s): %w", int(n), strings.Join(numericsNames, ", "), engine.ErrInvalidInput)
	}
}
