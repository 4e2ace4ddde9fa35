// Package model runs the forward pass of transformer language models stored
// in GGUF files.
//
// Each architecture is described in package arch (engine/model/arch), one
// file each, registered by its GGUF name (general.architecture): its
// hyper-parameters, its tensor table and the switches of the one decoder
// (decoder.go) that runs every architecture. Weights are bound once at load
// time by walking the table, with every shape checked, and handed to the model's
// kernels.Backend, on which every operation of the forward pass runs: the
// model calls nothing else to compute. The architectures are gemma2,
// gemma3, llama (Llama 2 and 3.x, Mistral), phi3, qwen2 and qwen3
// (Architectures lists them). The CPU backend reads every supported type
// (quant.SupportedTypes: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
// Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS) in place in the file
// mapping, so loading copies nothing but the small vectors (norms, biases,
// rope factors).
//
// A sequence runs either alone over a ContiguousCache (Forward) or, for
// continuous batching, together with others over a paged KV cache
// (ForwardBatch, with the pages of an engine/kvcache pool). Both are pages
// of the same layout to the backend, and share the same layer code.
// NumericsLlamaCpp is the one exception to the backend: a reference
// emulation of another engine's arithmetic, on the host (compat.go).
//
// A Model is safe for concurrent use: several sequences, each with its own
// KVCache, can run Forward at the same time.
package model

import (
	"errors"
	"fmt"
	"runtime"
	"strings"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/gguf"
	"github.com/baton-serving/baton/engine/kvcache"
	"github.com/baton-serving/baton/engine/model/arch"
	"github.com/baton-serving/baton/kernels"
)

// Model is a loaded model.
type Model interface {
	// Config returns the model's hyper-parameters.
	Config() Config
	// Fingerprint identifies the model's weights and shape; see Fingerprint
	// in fingerprint.go for what it covers.
	Fingerprint() string
	// Forward runs tokens, consecutive tokens of one sequence starting at
	// position pos, through the model. It stores their keys and values in
	// cache at positions pos… (pos may rewind below cache.Len() but not skip
	// past it), leaves cache.Len() == pos+len(tokens), and, when logits is
	// not nil, writes the next-token logits of the last token to it
	// (len(logits) must be Config().Vocab). A prompt is prefilled with many
	// tokens in one call; decoding passes one.
	Forward(tokens []int32, pos int, cache KVCache, logits []float32) error
	// ForwardBatch runs one step of many sequences over the paged KV cache
	// kv: every chunk's tokens go through each block together, so each
	// weight matrix is read once per step. It stores each chunk's keys and
	// values in its pages and, where a chunk asks, writes its next-token
	// logits. The chunks must belong to different sequences (no page
	// written twice); kv's layout must be Config().KVLayout's. A chunk's
	// results are bit-identical whatever else the batch holds: they depend
	// only on its own tokens, positions and cache contents.
	ForwardBatch(kv *kvcache.Pool, batch []Chunk) error
	// Close stops the model's worker goroutines. It waits for running
	// Forward calls; later calls fail. It does not close the GGUF file, which
	// the caller owns and must keep open until Close returns.
	Close() error
}

// Options tune how a model runs; the zero value is valid.
type Options struct {
	// Backend runs the forward pass: every weight product, norm, RoPE,
	// attention and KV store. nil means a kernels.CPU of Threads threads,
	// which the model owns and closes. A backend passed here stays the
	// caller's: the model frees what it put there and leaves it open.
	Backend kernels.Backend
	// Threads is the number of goroutines the default CPU backend splits
	// its matrix products and attention heads over; 0 means
	// runtime.GOMAXPROCS(0). It is ignored when Backend is set.
	Threads int
	// ContextLength overrides the context window the GGUF declares
	// ({arch}.context_length), as llama.cpp's -c does; 0 keeps the file's.
	ContextLength int
	// Numerics selects the arithmetic: NumericsDefault (the zero value), or
	// NumericsLlamaCpp to reproduce llama.cpp's outputs exactly, for F32
	// models and single-sequence Forward only (see Numerics).
	Numerics Numerics
}

// Architectures lists the supported architecture names, sorted.
func Architectures() []string { return arch.Names() }

// lookupArch finds f's architecture.
func lookupArch(f *gguf.File) (*arch.Arch, error) {
	name, ok := f.String("general.architecture")
	if !ok {
		return nil, fmt.Errorf("model: no general.architecture in the file: %w", engine.ErrInvalidInput)
	}
	a, ok := arch.Lookup(name)
	if !ok {
		return nil, fmt.Errorf("model: architecture %q is not supported (supported: %s): %w",
			name, strings.Join(Architectures(), ", "), engine.ErrUnsupported)
	}
	return a, nil
}

// Load builds the model described by f's general.architecture. The model
// reads its weights from f's mapping, so f must stay open until the model is
// closed. An unknown architecture or an unsupported tensor type is an error
// wrapping engine.ErrUnsupported; missing keys or tensors and wrong shapes
// wrap engine.ErrInvalidInput.
func Load(f *gguf.File, opts Options) (Model, error) {
	if f == nil {
		return nil, fmt.Errorf("model: nil GGUF file: %w", engine.ErrInvalidInput)
	}
	if opts.Threads < 0 {
		return nil, fmt.Errorf("model: threads = %d, want ≥ 0: %w", opts.Threads, engine.ErrInvalidInput)
	}
	if opts.ContextLength < 0 {
		return nil, fmt.Errorf("model: context length = %d, want ≥ 0: %w", opts.ContextLength, engine.ErrInvalidInput)
	}
	if opts.Threads == 0 {
		opts.Threads = runtime.GOMAXPROCS(0)
	}
	a, err := lookupArch(f)
	if err != nil {
		return nil, err
	}
	cfg, err := arch.ReadConfig(f, a)
	if err != nil {
		return nil, err
	}
	if opts.ContextLength > 0 {
		cfg.ContextLength = opts.ContextLength
	}
	return loadDecoder(f, a, cfg, opts)
}

// ErrClosed is returned by Forward after Close.
var ErrClosed = errors.New("model: closed")
