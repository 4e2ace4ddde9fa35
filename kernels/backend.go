package kernels

import (
	"errors"
	"fmt"
	"sync"

	"github.com/baton-serving/baton/kernels/quant"
)

// Backend is one implementation of the operations of a transformer forward
// pass: weight products for every weight type, RMSNorm, RoPE, softmax,
// SiLU·mul, residual adds, and attention over a paged KV cache with the
// copies into and out of it. [CPU] runs them on this machine's cores; the
// kernels/cuda module runs them on an NVIDIA GPU.
//
// Operands live in the backend's own memory: activations in [Buffer]s of
// float32, weights in [Matrix] values uploaded once, keys and values in a
// [KVCache]. A forward pass moves the token embeddings in and the logits
// out ([Backend.Write], [Backend.Read]); everything between stays where
// the backend keeps it, which for a GPU is what makes it fast.
//
// Every method checks its operands' shapes and ownership and returns an
// error wrapping [ErrShape] or [ErrForeign] instead of touching memory
// outside them; none panics on a bad shape. A backend may run operations
// asynchronously: an error from the execution of an operation (not from
// its arguments) may then be returned by a later call, at the latest by
// [Backend.Sync] or [Backend.Read]. Buffers written by an operation may be
// passed to the next one at once; the backend orders them.
//
// A Backend is safe for concurrent use by several goroutines as long as
// concurrent operations do not write memory that another of them reads or
// writes.
type Backend interface {
	// Name describes the backend and its device, e.g. "cpu (avx512, 2
	// threads)".
	Name() string

	// Alloc returns a zeroed buffer of n float32s.
	Alloc(n int) (Buffer, error)
	// Free releases a buffer returned by Alloc. Slices of it must not be
	// used afterwards; freeing a slice rather than the buffer is an error.
	Free(b Buffer) error
	// Write copies src into dst; len(src) must be dst.Len().
	Write(dst Buffer, src []float32) error
	// Read copies src into dst once every operation before it that writes
	// src is done; len(dst) must be src.Len().
	Read(dst []float32, src Buffer) error
	// Copy copies src into dst, which must have the same length; the two
	// may overlap.
	Copy(dst, src Buffer) error

	// LoadMatrix makes a weight matrix of rows×cols elements of type typ
	// from data, stored row-major in ggml's byte layout
	// (quant.RowBytes(typ, cols) bytes per row). The backend may keep
	// data (the CPU backend computes from it in place) or copy it (a GPU
	// uploads it): the caller must leave data unchanged while the matrix
	// is in use. Types the backend cannot compute with give an error
	// wrapping [ErrUnsupported].
	LoadMatrix(typ quant.Type, rows, cols int, data []byte) (Matrix, error)
	// FreeMatrix releases a matrix from LoadMatrix.
	FreeMatrix(m Matrix) error

	// MatMul multiplies w by the tokens = x.Len()/w.Cols() activation rows
	// of x: dst[t·w.Rows() + r] = Σ_k w[r][k]·x[t·w.Cols() + k]. dst has
	// tokens·w.Rows() elements. A token's result does not depend on how
	// many tokens are multiplied together.
	//
	// A backend may round x to the type the weights' products take, as
	// ggml does, instead of computing with float32 x: to F16 or BF16
	// (nearest even) for F16 or BF16 weights, to 8-bit blocks for
	// quantized weights (vec.ActivationType names the block type). The
	// CPU backend does both, so that its outputs follow llama.cpp's.
	MatMul(dst Buffer, w Matrix, x Buffer) error
	// Embed writes row ids[i] of w, converted to float32, to row i of dst
	// (len(ids) rows of w.Cols()): the token embedding lookup. An id
	// outside [0, w.Rows()) is an error.
	Embed(dst Buffer, w Matrix, ids []int32) error
	// RMSNorm normalizes each row of x (rows of weight.Len() elements) as
	// [RMSNorm] does, writing dst; dst may be x.
	RMSNorm(dst, x, weight Buffer, eps float32) error
	// Rope rotates rows rows of heads of headDim elements in x, in place,
	// as [Rope] does: row r uses the r-th row of cos and sin, each
	// cos.Len()/rows elements, from [RopeTable]; heads is
	// x.Len()/(rows·headDim).
	Rope(x, cos, sin Buffer, rows, headDim int, layout RopeLayout) error
	// Softmax replaces each of the rows rows of x by its softmax.
	Softmax(x Buffer, rows int) error
	// SiLUMul writes silu(gate[i])·up[i] to dst; dst may be gate or up.
	SiLUMul(dst, gate, up Buffer) error
	// Add writes a[i] + b[i mod b.Len()] to dst: a residual add when b is
	// as long as a, a bias added to every row when b is one row.
	// a.Len() must be a multiple of b.Len(); dst may be a or b.
	Add(dst, a, b Buffer) error

	// NewKVCache allocates a paged KV cache of pages pages of layout l,
	// zeroed.
	NewKVCache(l KVLayout, pages int) (KVCache, error)
	// FreeKVCache releases a cache from NewKVCache.
	FreeKVCache(kv KVCache) error
	// StoreKV writes len(slots) rows of keys and values (each
	// Layout().RowElems() elements of k and v, converted to the cache's
	// element type) into layer of kv: row i goes to position slot
	// slots[i] % PageSize of page slots[i] / PageSize.
	StoreKV(kv KVCache, layer int, slots []int32, k, v Buffer) error
	// Attention computes causal attention of len(rows) query rows. Row i
	// of q holds heads heads of HeadDim elements (heads =
	// q.Len()/(len(rows)·HeadDim), a multiple of KVHeads), and attends to
	// positions 0…rows[i].Len-1 of its sequence, whose pages in position
	// order are rows[i].Pages, in layer of kv; query head h reads KV head
	// h/(heads/KVHeads). Scores are scaled by 1/√HeadDim. out has q's
	// shape.
	Attention(out, q Buffer, kv KVCache, layer int, rows []AttnRow) error
	// ExportKV copies one layer of page page to dst: the page's keys then
	// its values in that layer, 2·Layout().BlockBytes() bytes laid out as
	// [KVLayout] describes.
	ExportKV(dst []byte, kv KVCache, page, layer int) error
	// ImportKV is the reverse of ExportKV: it overwrites one layer of a
	// page with src.
	ImportKV(kv KVCache, page, layer int, src []byte) error
	// CopyKVPage copies every layer of page src to page dst.
	CopyKVPage(kv KVCache, dst, src int) error

	// Sync waits for every operation issued so far and returns the first
	// error of their execution, if any.
	Sync() error
	// Close releases everything the backend allocated. Nothing may be
	// used afterwards.
	Close() error
}

// Buffer is a run of float32 values in a backend's memory: an allocation
// or a slice of one.
type Buffer interface {
	// Len is the number of elements.
	Len() int
	// Slice returns elements lo…hi-1, sharing memory with the buffer.
	// Like a slice expression, it panics unless 0 ≤ lo ≤ hi ≤ Len(): the
	// bounds come from the model's shapes, never from input.
	Slice(lo, hi int) Buffer
}

// Matrix is a weight matrix in a backend's memory.
type Matrix interface {
	Type() quant.Type
	Rows() int
	Cols() int
}

// KVCache is a paged KV cache in a backend's memory.
type KVCache interface {
	Layout() KVLayout
	Pages() int
}

// AttnRow is what one query row attends to in [Backend.Attention].
type AttnRow struct {
	// Pages is the row's sequence's block table: the ids of its pages in
	// position order. Rows of one sequence share it.
	Pages []int32
	// Len is the number of positions attended to, 0…Len-1; the pages must
	// cover them.
	Len int
}

// ExtendedOps is implemented by backends that run the operations of architectures beyond Llama's
// (the Gemma family's GELU, soft-capping, sliding-window attention with its own score scale).
// A model that needs them fails to load on a backend without them, with an error wrapping ErrUnsupported.
type ExtendedOps interface {
	// GELUMul writes gelu(gate[i])·up[i] to dst, gelu in ggml's tanh approximation
	// (ggml_gelu: 0.5·x·(1+tanh(√(2/π)·x·(1+0.044715·x²)))); dst may be gate or up.
	GELUMul(dst, gate, up Buffer) error
	// Scale writes s·x[i] to dst; dst may be x.
	Scale(dst, x Buffer, s float32) error
	// SoftCap replaces x[i] by c·tanh(x[i]/c), in place (c > 0).
	SoftCap(x Buffer, c float32) error
	// AttentionWith is Backend.Attention with options; AttnOptions{} gives exactly Attention's result.
	AttentionWith(out, q Buffer, kv KVCache, layer int, rows []AttnRow, o AttnOptions) error
}

// AttnOptions changes how Attention scores.
type AttnOptions struct {
	// Scale multiplies q·k; 0 means 1/√HeadDim.
	Scale float32
	// SoftCap, when > 0, replaces each scaled score s by SoftCap·tanh(s/SoftCap) before the softmax.
	SoftCap float32
	// Window, when > 0, is a sliding window: a row attends only to the last Window positions,
	// max(0, Len-Window) … Len-1 (llama.cpp masks key position pk for query position pq when
	// pq - pk >= n_swa, which is the same thing). Pages wholly before the window are not read.
	Window int
}

// Errors that backends wrap.
var (
	// ErrShape reports operands whose sizes do not fit together, or
	// indices (token ids, pages, slots, layers) outside their range.
	ErrShape = errors.New("kernels: shape mismatch")
	// ErrForeign reports an operand that another backend (or another
	// instance) allocated, or one already freed.
	ErrForeign = errors.New("kernels: operand not owned by this backend")
	// ErrUnsupported reports a type or layout the backend cannot compute
	// with.
	ErrUnsupported = errors.New("kernels: unsupported by this backend")
	// ErrClosed reports use of a closed backend.
	ErrClosed = errors.New("kernels: backend closed")
)

// Upload allocates a buffer on b holding a copy of src.
func Upload(b Backend, src []float32) (Buffer, error) {
	buf, err := b.Alloc(len(src))
	if err != nil {
		return nil, err
	}
	if err := b.Write(buf, src); err != nil {
		return nil, errors.Join(err, b.Free(buf))
	}
	return buf, nil
}

// Product is one weight product of [MatMuls]: Dst = W·x.
type Product struct {
	Dst Buffer
	W   Matrix
}

// ProductGrouper is implemented by backends that run several products of
// the same activations together, faster than one by one.
type ProductGrouper interface {
	// MatMuls computes each product as [Backend.MatMul] does, with the
	// same results.
	MatMuls(x Buffer, ps ...Product) error
}

// MatMuls computes Dst = W·x for each product on b: together where b is
// a [ProductGrouper], else one [Backend.MatMul] at a time. The results
// are the same either way.
func MatMuls(b Backend, x Buffer, ps ...Product) error {
	if g, ok := b.(ProductGrouper); ok {
		return g.MatMuls(x, ps...)
	}
	for _, p := range ps {
		if err := b.MatMul(p.Dst, p.W, x); err != nil {
			return err
		}
	}
	return nil
}

// HostKV is implemented by backends that compute on host memory, and so
// can work on a KV cache's pages where they already are (an engine page
// pool, a contiguous cache) instead of a copy.
type HostKV interface {
	// WrapKV returns a KV cache over data itself, whole pages of layout
	// l: operations on it read and write data.
	WrapKV(l KVLayout, data []byte) (KVCache, error)
}

// HostView keeps one backend's handle on KV pages in host memory, so
// that asking again costs a comparison: the engine's page pool and its
// contiguous cache each hold one. It is safe for concurrent use.
type HostView struct {
	mu sync.Mutex
	b  Backend
	kv KVCache
}

// On returns b's handle on data, whole pages of layout l, wrapping it on
// first use and again when another backend asks. A backend that is not a
// [HostKV] gives an error wrapping ErrUnsupported.
func (v *HostView) On(b Backend, l KVLayout, data []byte) (KVCache, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.b == b && v.kv != nil {
		return v.kv, nil
	}
	h, ok := b.(HostKV)
	if !ok {
		return nil, fmt.Errorf("%w: backend %s cannot compute on KV pages in host memory", ErrUnsupported, b.Name())
	}
	kv, err := h.WrapKV(l, data)
	if err != nil {
		return nil, err
	}
	v.b, v.kv = b, kv
	return kv, nil
}

// Memory is what a backend's allocations hold, in bytes, by use.
type Memory struct {
	// Weights is the weight matrices' memory (LoadMatrix).
	Weights int64
	// KV is the KV caches' (NewKVCache; not caches over host memory
	// through HostKV, which the backend does not own).
	KV int64
	// Buffers is the activation buffers' (Alloc) and the backend's own
	// working memory.
	Buffers int64
	// Free and Total are the device's free and total memory as its
	// driver reports them, or 0 where there is no such report.
	Free, Total int64
}

// MemoryReporter is implemented by backends with memory of their own (a
// GPU's) to report what they hold, for gauges and for start-up checks
// that a KV budget fits.
type MemoryReporter interface {
	Memory() (Memory, error)
}
