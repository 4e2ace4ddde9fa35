// Package arch declares the transformer architectures Baton runs: for each
// GGUF general.architecture name, the hyper-parameters it reads from the
// metadata (Config), the tensors it binds (one table, Arch.Tensors) and the
// switches of the decoder that runs it (rope layout, activation, …).
//
// It is the one place an architecture is described. engine/model binds,
// uploads and releases weights by walking Arch.Tensors and runs its one
// decoder with the switches; engine/testmodel writes random-weight files by
// walking the same table and writing Keys. It sits apart from engine/model
// so that engine/testmodel, which engine/model's own tests use, can read it
// without an import cycle.
//
// Each architecture lives in its own file (llama.go, qwen2.go, …) and is
// registered by name in registry (this file). docs/models.md says how to
// add one.
package arch

import (
	"fmt"
	"slices"
	"strings"

	"github.com/baton-serving/baton/kernels"
)

// Role is the place a weight takes in the decoder. Global roles hold one
// tensor for the model; layer roles one per block. A role left unbound
// (an optional tensor the file lacks) switches its operation off: no bias,
// no q/k norm, an output head tied to the embedding.
type Role int

// The decoder's weight roles.
const (
	// Global.
	TokEmbd    Role = iota // token embedding, Vocab×Dim
	Output                 // output head, Vocab×Dim; unbound: TokEmbd (tied)
	OutputNorm             // final RMSNorm, Dim
	RopeFreqs              // per-pair RoPE frequency divisors (Llama 3.1), RopeDim/2
	RopeLong               // phi3 longrope frequency divisors for a context above the original, RopeDim/2
	RopeShort              // phi3 longrope frequency divisors otherwise, RopeDim/2

	// Per layer.
	AttnNorm     // RMSNorm before attention, Dim
	Wq           // QDim×Dim
	Wk           // KVDim×Dim
	Wv           // KVDim×Dim
	Wo           // Dim×QDim
	Bq           // QDim
	Bk           // KVDim
	Bv           // KVDim
	Bo           // Dim
	QNorm        // RMSNorm of each query head before RoPE, HeadDim
	KNorm        // RMSNorm of each key head before RoPE, HeadDim
	PostAttnNorm // RMSNorm of the attention output before the residual add, Dim
	FFNNorm      // RMSNorm before the feed-forward network, Dim
	Gate         // Hidden×Dim
	Up           // Hidden×Dim
	Down         // Dim×Hidden
	BGate        // Hidden
	BUp          // Hidden
	BDown        // Dim
	PostFFNNorm  // RMSNorm of the feed-forward output before the residual add, Dim

	NumRoles
)

var roleNames = [NumRoles]string{
	"tok_embd", "output", "output_norm", "rope_freqs", "rope_long", "rope_short",
	"attn_norm", "wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo", "q_norm", "k_norm", "post_attn_norm",
	"ffn_norm", "gate", "up", "down", "b_gate", "b_up", "b_down", "post_ffn_norm",
}

func (r Role) String() string {
	if r >= 0 && r < NumRoles {
		return roleNames[r]
	}
	return fmt.Sprintf("Role(%d)", int(r))
}

// Layer reports whether the role has one tensor per block.
func (r Role) Layer() bool { return r >= AttnNorm }

// Size is a tensor dimension as a function of the hyper-parameters.
type Size func(Config) int

// The sizes tensors are declared in.
func Dim(c Config) int       { return c.Dim }
func Hidden(c Config) int    { return c.Hidden }
func QDim(c Config) int      { return c.QDim() }
func KVDim(c Config) int     { return c.KVDim() }
func HeadDim(c Config) int   { return c.HeadDim }
func Vocab(c Config) int     { return c.Vocab }
func RopePairs(c Config) int { return c.RopeDim / 2 } // the pairs RoPE rotates

// Init is what the random-weight writer (engine/testmodel) stores in a
// tensor.
type Init int

const (
	// Noise: values drawn from N(0, std²).
	Noise Init = iota
	// Ones: every value 1 (norm weights, rope frequency factors).
	Ones
	// Factors: positive values exp(|N(0, 1)|), in [1, ~20] (phi3's
	// longrope frequency factors, which must be > 0 and which a file of
	// ones would not tell apart).
	Factors
)

// Part is the share of a tensor's rows that one role takes. A tensor of one
// part is an ordinary weight; several parts make a fused tensor (phi3's
// attn_qkv, its gate+up ffn_up), whose consecutive row ranges the binder
// hands to the roles in order, so the decoder never sees the fusion.
type Part struct {
	Role Role
	Rows Size
}

// Tensor declares one GGUF tensor: its name ("blk.%d." prefixed for a
// per-layer tensor), the roles it fills, its shape and whether a file may
// lack it.
type Tensor struct {
	Name string
	// Parts lists the roles the tensor's rows go to, in row order. A vector
	// has one part, whose Rows is nil.
	Parts []Part
	// Cols is the row length of a matrix, the length of a vector.
	Cols Size
	// Vector marks a 1-D tensor (norms, biases, frequency factors): bound
	// as float32 on the host and uploaded as a buffer.
	Vector bool
	// Optional tensors may be absent from a file: the role stays unbound.
	// The writer writes an optional tensor only for the Output role (when
	// the Spec is not tied).
	Optional bool
	Init     Init
}

// Mat declares a rows×cols weight matrix.
func Mat(name string, r Role, rows, cols Size) Tensor {
	return Tensor{Name: name, Parts: []Part{{r, rows}}, Cols: cols}
}

// Fused declares a matrix whose row ranges go to several roles.
func Fused(name string, cols Size, parts ...Part) Tensor {
	return Tensor{Name: name, Parts: parts, Cols: cols}
}

// Vec declares a vector of n noise values (a bias).
func Vec(name string, r Role, n Size) Tensor {
	return Tensor{Name: name, Parts: []Part{{Role: r}}, Cols: n, Vector: true}
}

// Norm declares a norm weight of n values, written as ones.
func Norm(name string, r Role, n Size) Tensor {
	return Tensor{Name: name, Parts: []Part{{Role: r}}, Cols: n, Vector: true, Init: Ones}
}

// Opt returns t marked optional.
func (t Tensor) Opt() Tensor { t.Optional = true; return t }

// PerLayer reports whether the tensor has one instance per block.
func (t Tensor) PerLayer() bool { return strings.Contains(t.Name, "%d") }

// NameAt is the tensor's GGUF name in block layer (ignored for global
// tensors).
func (t Tensor) NameAt(layer int) string {
	if t.PerLayer() {
		return fmt.Sprintf(t.Name, layer)
	}
	return t.Name
}

// Rows is the total row count of a matrix (1 for a vector).
func (t Tensor) Rows(c Config) int {
	if t.Vector {
		return 1
	}
	n := 0
	for _, p := range t.Parts {
		n += p.Rows(c)
	}
	return n
}

// Activation is the gate activation of the feed-forward network.
type Activation int

const (
	SiLU Activation = iota // silu(gate)·up (SwiGLU)
	GELU                   // gelu_tanh(gate)·up (GeGLU); needs kernels' ExtendedOps
)

func (a Activation) String() string {
	if a == GELU {
		return "gelu"
	}
	return "silu"
}

// Arch describes one architecture.
type Arch struct {
	// Name is the GGUF general.architecture value, and the prefix of its
	// metadata keys.
	Name string
	// Tensors is the weight table, in the order files list them.
	Tensors []Tensor
	// RopeLayout is the pairing of head elements RoPE rotates.
	RopeLayout kernels.RopeLayout
	// Act is the feed-forward activation.
	Act Activation
	// Configure, when not nil, reads the architecture's own metadata keys
	// into c after the common ones, and checks them. Errors wrap
	// engine.ErrInvalidInput or engine.ErrUnsupported.
	Configure func(m *Meta, c *Config) error
	// Keys, when not nil, returns the architecture's own metadata keys for
	// c, which the writer adds to the common ones (CommonKeys).
	Keys func(c Config) []KV
	// LlamaCppNumerics reports whether model.NumericsLlamaCpp supports
	// the architecture.
	LlamaCppNumerics bool
	// SquareAttn: llama.cpp shapes the attention output embedding_length
	// square, so the heads must fill the embedding exactly
	// (head_count × key_length = embedding_length): qwen2 and phi3.
	// Baton's phi3 reader refuses other files; the writer refuses to make
	// them for either.
	SquareAttn bool
	// WholeHeadRope: llama.cpp rotates whole heads (it asserts
	// rope.dimension_count = key_length): llama, qwen2, qwen3, gemma2.
	// The writer refuses a partial rotation for them.
	WholeHeadRope bool
}

// registry maps architecture names to their descriptions. A new
// architecture adds one line here and one file beside llama.go.
func registry() map[string]func() *Arch {
	return map[string]func() *Arch{
		"gemma2": gemma2,
		"gemma3": gemma3,
		"llama":  llama,
		"phi3":   phi3,
		"qwen2":  qwen2,
		"qwen3":  qwen3,
	}
}

// Lookup returns the named architecture's description (a fresh copy).
func Lookup(name string) (*Arch, bool) {
	a, ok := registry()[name]
	if !ok {
		return nil, false
	}
	return a(), true
}

// Names lists the registered architecture names, sorted.
func Names() []string {
	var names []string
	for n := range registry() {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Has reports whether the architecture declares a tensor for role r.
func (a *Arch) Has(r Role) bool {
	for _, t := range a.Tensors {
		for _, p := range t.Parts {
			if p.Role == r {
				return true
			}
		}
	}
	return false
}
