// Package testmodel writes GGUF files of any architecture registered in
// engine/model/arch with deterministic pseudo-random weights, for tests and
// benchmarks that need a model of a given shape and tensor type without
// downloading one. The tensors written are those of the architecture's
// table (arch.Arch.Tensors: every required one, and output.weight unless
// the Spec is tied), and the metadata its arch.Keys, so what the writer
// writes and what engine/model binds come from one declaration.
//
// Every weight matrix and bias is drawn from N(0, std²) (Spec.Std, default
// 0.02) by a PCG generator seeded from the Spec's seed, the tensor's name
// and the row index, so a weight is the same whatever the tensor type it is
// stored in: a Q4_K file and an F32 file with the same seed hold the same
// model up to quantization error. Norm weights are 1. The vocabulary is a synthetic SentencePiece-style "llama"
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
	"math"
	"math/rand/v2"
	"strings"
	"unicode/utf8"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/model/arch"
	"github.com/baton-serving/baton/kernels/quant"
)

// Spec is the shape of a generated model.
type Spec struct {
	// Arch is the architecture (general.architecture); "" means "llama".
	Arch    string
	Dim     int // embedding length
	Hidden  int // feed-forward length
	Layers  int
	Heads   int
	KVHeads int
	// HeadDim is the width of one attention head; 0 means Dim/Heads. When
	// it differs, the file says so in attention.key_length (as Qwen3's do).
	HeadDim int
	Vocab   int // at least MinVocab
	Context int // context length written to the metadata
	// Type is the storage type of the 2-D tensors (1-D norms are F32).
	Type quant.Type
	// Tied leaves output.weight out, so the output head reuses the token
	// embedding.
	Tied bool
	Seed uint64
	// NormEps and RopeBase are the RMSNorm epsilon and RoPE base written
	// to the metadata; 0 means the package's NormEps and RopeBase.
	NormEps  float32
	RopeBase float32
	// Std is the standard deviation of the random weights; 0 means
	// WeightStd. Greedy comparisons against another engine need clear
	// top-2 margins at every step, which 0.02 does not give on tiny
	// shapes (the logits are nearly flat); see docs/models.md for the std
	// that does.
	Std float64
	// OutputStd, when > 0, is the standard deviation of output.weight (and
	// of token_embd.weight when Tied, as it is then the output head); 0
	// means Std. Large logits give clear margins, while large hidden
	// weights make a random model chaotic (near-argmax attention), so that
	// last-bit differences between engines flip greedy choices: golden
	// files use a small Std and a large OutputStd (docs/models.md).
	OutputStd float64
	// QKStd, when > 0, is the standard deviation of the query and key
	// weights and biases (attn_q, attn_k, their biases, and the query and
	// key rows of a fused attn_qkv); 0 means Std. The attention scores
	// grow with the square of it while the logits do not depend on it, so
	// a small QKStd under a large Std keeps the margins and takes attention
	// away from argmax, where last-bit differences in q·k between engines
	// are amplified (scripts/golden/README.md).
	QKStd float64

	// SlidingWindow is written as {arch}.attention.sliding_window by the
	// architectures that have one (gemma2, gemma3, phi3; others ignore
	// it); 0 means the architecture's default: Gemma 2's 4096 and
	// Gemma-3-1B's 512, clamped to Context, and for phi3 no window (0, as
	// Phi-4's files write). At most Context: a wider window masks nothing
	// more, and Gemma's readers refuse it, as llama.cpp's do.
	SlidingWindow int
	// Llama3Rope, when set, adds rope_freqs.weight with Llama 3.1's
	// "llama3" RoPE scaling factors (architectures with that tensor: llama).
	Llama3Rope Llama3Rope

	// Tokenizer, when not nil, is the vocabulary written instead of the
	// synthetic one (see ReadTokenizer); Vocab must then be its token
	// count, which WithTokenizer sets.
	Tokenizer *Tokenizer
	// ChatTemplate, when not "", is written as tokenizer.chat_template,
	// replacing the Tokenizer's.
	ChatTemplate string
	// RopeOrigContext, when > 0 and not Context, is written as
	// rope.scaling.original_context_length: the context before RoPE
	// scaling (YaRN's correction range; phi3's longrope choice).
	RopeOrigContext int
	// LongRope adds phi3's longrope factors (rope_factors_long.weight and
	// rope_factors_short.weight, positive values, see arch.Factors) and,
	// when Context exceeds RopeOrigContext, rope.scaling.attn_factor
	// √(1 + ln(Context/RopeOrigContext)/ln(RopeOrigContext)), as llama.cpp's
	// converter computes it for Phi-3's 128k models.
	LongRope bool
	// YarnFactor, when > 0, writes rope.scaling.type "yarn" with this
	// rope.scaling.factor.
	YarnFactor float64

	// RopeDim, when > 0, is rope.dimension_count: the leading dimensions
	// of each head RoPE rotates (a partial rotation, as Phi-4-mini's 96 of
	// 128, whose longrope factors then number RopeDim/2); 0 means the head
	// dimension. Architectures whose llama.cpp graph rotates whole heads
	// (arch.Arch.WholeHeadRope) refuse another value.
	RopeDim int
	// RopeBaseLocal, when > 0, is Gemma 3's rope.freq_base_swa, the RoPE
	// base of its local layers; 0 means llama.cpp's default, 10000, and
	// writes no key.
	RopeBaseLocal float32
	// SWAPattern, when > 0, is Gemma 3's attention.sliding_window_pattern
	// (every SWAPattern-th block global; 1: all of them); 0 means
	// llama.cpp's default, 6, and writes no key.
	SWAPattern int
	// FinalSoftCap, when > 0, is final_logit_softcapping: Gemma 2's
	// (default 30, always written) or Gemma 3's (default none, written only
	// when set).
	FinalSoftCap float32
}

// MinVocab is the smallest vocabulary Write accepts: 3 special tokens, 256
// byte tokens and at least one text piece.
const MinVocab = 260

// Generation constants, written into the metadata.
const (
	NormEps  = 1e-5
	RopeBase = 10000
	// WeightStd is the default standard deviation of the random weights.
	WeightStd = 0.02
)

// headDim is HeadDim, or Dim/Heads without it.
func (s Spec) headDim() int {
	if s.HeadDim > 0 {
		return s.HeadDim
	}
	if s.Heads == 0 {
		return 0
	}
	return s.Dim / s.Heads
}

// ArchName is the architecture written: Arch, or "llama".
func (s Spec) ArchName() string {
	if s.Arch == "" {
		return "llama"
	}
	return s.Arch
}

// Architecture returns the description of s's architecture.
func (s Spec) Architecture() (*arch.Arch, error) {
	a, ok := arch.Lookup(s.ArchName())
	if !ok {
		return nil, fmt.Errorf("testmodel: architecture %q is not registered (registered: %s): %w",
			s.ArchName(), strings.Join(arch.Names(), ", "), engine.ErrUnsupported)
	}
	return a, nil
}

// Config returns the hyper-parameters the file written for s declares, as
// engine/model reads them back.
func (s Spec) Config(a *arch.Arch) arch.Config {
	hd := s.headDim()
	c := arch.Config{
		Architecture: a.Name, Dim: s.Dim, Hidden: s.Hidden, Layers: s.Layers, Heads: s.Heads, KVHeads: s.KVHeads,
		HeadDim: hd, Vocab: s.Vocab, ContextLength: s.Context, TrainContextLength: s.Context,
		NormEps: or(s.NormEps, NormEps), RopeBase: or(s.RopeBase, RopeBase), RopeScale: 1, RopeDim: hd, RopeLayout: a.RopeLayout, TiedOutput: s.Tied,
		SlidingWindow: s.SlidingWindow, RopeBaseLocal: s.RopeBaseLocal, SWAPattern: s.SWAPattern, FinalSoftCap: s.FinalSoftCap,
	}
	if s.RopeDim > 0 {
		c.RopeDim = s.RopeDim
	}
	orig := s.Context
	if s.RopeOrigContext > 0 {
		orig = s.RopeOrigContext
	}
	if a.Has(arch.RopeLong) {
		c.RopeOrigContext = orig // phi3 reads it whether or not the file has factors
	}
	if s.LongRope && s.Context > orig {
		o := float64(orig)
		c.RopeAttnFactor = float32(math.Sqrt(1 + math.Log(float64(s.Context)/o)/math.Log(o)))
	}
	if s.YarnFactor > 0 {
		c.RopeYarnOrigCtx, c.RopeScale = orig, float32(1/s.YarnFactor)
	}
	return c
}

func or(v, def float32) float32 {
	if v > 0 {
		return v
	}
	return def
}

// std is the weights' standard deviation.
func (s Spec) std() float64 {
	if s.Std > 0 {
		return s.Std
	}
	return WeightStd
}

// roleStd is the standard deviation of the weights of role r: OutputStd
// for the output head (the embedding too when tied), QKStd for the query
// and key weights and biases, else Std.
func (s Spec) roleStd(r arch.Role) float64 {
	if s.OutputStd > 0 && (r == arch.Output || (r == arch.TokEmbd && s.Tied)) {
		return s.OutputStd
	}
	if s.QKStd > 0 && (r == arch.Wq || r == arch.Wk || r == arch.Bq || r == arch.Bk) {
		return s.QKStd
	}
	return s.std()
}

// partStd is the std of a share of a fused tensor's rows.
type partStd struct {
	rows int
	std  float64
}

// tensorStds returns the std of t's rows: one value for a tensor whose
// parts all have the same std (every unfused tensor), else the per-part
// stds of a fused one (phi3's attn_qkv under QKStd).
func (s Spec) tensorStds(t arch.Tensor, c arch.Config) (float64, []partStd) {
	std := s.roleStd(t.Parts[0].Role)
	if t.Vector || len(t.Parts) == 1 {
		return std, nil
	}
	parts := make([]partStd, len(t.Parts))
	mixed := false
	for i, p := range t.Parts {
		parts[i] = partStd{rows: p.Rows(c), std: s.roleStd(p.Role)}
		mixed = mixed || parts[i].std != std
	}
	if !mixed {
		return std, nil
	}
	return std, parts
}

// stdAt is the std of row r of a tensor with the given std and parts (as
// tensorStds returns them).
func stdAt(std float64, parts []partStd, r int) float64 {
	for _, p := range parts {
		if r < p.rows {
			return p.std
		}
		r -= p.rows
	}
	return std
}

// Params returns the number of weights in the file (norms included).
func (s Spec) Params() int64 {
	a, err := s.Architecture()
	if err != nil {
		return 0
	}
	var n int64
	for _, t := range s.tensors(a) {
		n += int64(t.rows) * int64(t.cols)
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
	case s.HeadDim < 0 || s.HeadDim > limit:
		return bad("head-dim = %d, want [0, %d]", s.HeadDim, limit)
	case s.HeadDim == 0 && s.Dim%s.Heads != 0:
		return bad("dim %d is not a multiple of heads %d", s.Dim, s.Heads)
	case s.Heads%s.KVHeads != 0:
		return bad("heads %d is not a multiple of kv-heads %d", s.Heads, s.KVHeads)
	case s.headDim()%2 != 0:
		return bad("head dimension %d is odd; RoPE rotates pairs", s.headDim())
	case !(s.NormEps >= 0) || s.NormEps > 1 || !(s.RopeBase >= 0) || s.RopeBase > 1e9:
		return bad("norm eps %v or rope base %v out of range", s.NormEps, s.RopeBase)
	case !(s.Std >= 0) || s.Std > 100:
		return bad("std = %v, want (0, 100] (or 0 for the default %g)", s.Std, WeightStd)
	case !(s.OutputStd >= 0) || s.OutputStd > 100:
		return bad("output std = %v, want (0, 100] (or 0 for std)", s.OutputStd)
	case !(s.QKStd >= 0) || s.QKStd > 100:
		return bad("query/key std = %v, want (0, 100] (or 0 for std)", s.QKStd)
	case s.SlidingWindow < 0 || s.SlidingWindow > s.Context:
		return bad("sliding window = %d, want [0, context %d]", s.SlidingWindow, s.Context)
	case s.RopeOrigContext < 0 || s.RopeOrigContext > limit:
		return bad("rope original context = %d, want [0, %d]", s.RopeOrigContext, limit)
	case s.LongRope && s.RopeOrigContext == 1:
		return bad("longrope needs an original context > 1")
	case s.RopeDim < 0 || s.RopeDim > s.headDim() || s.RopeDim%2 != 0:
		return bad("rope-dim = %d, want an even number in [0, head dimension %d]", s.RopeDim, s.headDim())
	case !(s.RopeBaseLocal >= 0) || s.RopeBaseLocal > 1e9:
		return bad("rope-base-local = %v, want (0, 1e9] (or 0 for the default)", s.RopeBaseLocal)
	case s.SWAPattern < 0 || s.SWAPattern > limit:
		return bad("swa-pattern = %d, want [0, %d]", s.SWAPattern, limit)
	case !(s.FinalSoftCap >= 0) || s.FinalSoftCap > 1e6:
		return bad("final-softcap = %v, want (0, 1e6] (or 0 for the default)", s.FinalSoftCap)
	case !(s.YarnFactor >= 0) || s.YarnFactor > 1e6:
		return bad("yarn factor = %v, want (0, 1e6] (or 0 for none)", s.YarnFactor)
	case s.Tokenizer == nil && s.Vocab < MinVocab:
		return bad("vocab = %d, want at least %d (3 special and 256 byte tokens, and text pieces)", s.Vocab, MinVocab)
	case s.Tokenizer != nil && s.Vocab != s.Tokenizer.Len():
		return bad("vocab = %d, but the vocabulary of %s has %d tokens (the embedding has a row per token)", s.Vocab, s.Tokenizer.Source, s.Tokenizer.Len())
	}
	if s.Llama3Rope.enabled() {
		if err := s.Llama3Rope.validate(); err != nil {
			return bad("%v", err)
		}
	}
	if !s.Type.Supported() {
		var names []string
		for _, t := range quant.SupportedTypes() {
			names = append(names, t.String())
		}
		return fmt.Errorf("testmodel: type %s is not supported (supported: %s): %w", s.Type, strings.Join(names, ", "), engine.ErrUnsupported)
	}
	a, err := s.Architecture()
	if err != nil {
		return err
	}
	if s.Llama3Rope.enabled() && !a.Has(arch.RopeFreqs) {
		return bad("architecture %s has no rope_freqs.weight for llama3 rope scaling", a.Name)
	}
	if s.Tied && a.Has(arch.Output) && !optional(a, arch.Output) {
		return bad("architecture %s requires output.weight: it cannot be tied", a.Name)
	}
	if s.LongRope && !a.Has(arch.RopeLong) {
		return bad("architecture %s has no longrope factors", a.Name)
	}
	for _, u := range []struct {
		setting string
		set     bool
	}{
		{"window", s.SlidingWindow != 0}, {"swa-pattern", s.SWAPattern != 0}, {"rope-base-local", s.RopeBaseLocal != 0},
		{"final-softcap", s.FinalSoftCap != 0}, {"rope-dim", s.RopeDim != 0 && s.RopeDim != s.headDim()},
		{"head-dim", s.HeadDim != 0 && s.HeadDim*s.Heads != s.Dim},
	} {
		if u.set {
			if err := Uses(a, u.setting); err != nil {
				return bad("%v", err)
			}
		}
	}
	bs := s.Type.BlockSize()
	for _, t := range s.tensors(a) {
		if t.typ == s.Type && t.cols%bs != 0 {
			return bad("%s stores rows in blocks of %d, but the rows of %s are %d long: dim %d, hidden %d and heads×head-dim %d must all be multiples of it",
				s.Type, bs, t.name, t.cols, s.Dim, s.Hidden, s.Heads*s.headDim())
		}
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
	seen := make(map[string]bool, size)
	var pieces []string
	var runes []int // runes[i] is pieces[i]'s length in runes
	add := func(p string, n int) {
		if len(tokens) < size && !seen[p] {
			seen[p] = true
			pieces = append(pieces, p)
			runes = append(runes, n)
			tokens = append(tokens, p)
			types = append(types, typeNormal)
		}
	}
	for _, r := range alphabet {
		add(string(r), 1)
	}
	rng := rand.New(rand.NewPCG(seed, 0x5eed_70c3))
	var buf []byte
	for tries := 0; len(tokens) < size; tries++ {
		// Favour pieces that start with a space, as real vocabularies do,
		// and keep pieces short enough to be plausible words. The rune
		// counts kept beside the pieces reject a long join without
		// building it: most tries are rejected once the vocabulary is
		// large (a 262144-token one took 45 s before).
		ai := rng.IntN(len(pieces))
		a, na := pieces[ai], runes[ai]
		if tries%3 == 0 {
			a, na = "▁", 1
		}
		bi := rng.IntN(len(pieces))
		if n := na + runes[bi]; n <= 12 {
			// Joined in a reused buffer: the map lookup of string(buf)
			// does not allocate, and most joins are already taken.
			buf = append(append(buf[:0], a...), pieces[bi]...)
			if !seen[string(buf)] {
				add(string(buf), n)
			}
		}
		if tries > 100*size {
			// Unreachable for the sizes Validate allows; keeps a bad seed
			// from looping forever.
			p := fmt.Sprintf("▁tok%d", len(tokens))
			add(p, utf8.RuneCountInString(p))
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
func weightRow(pcg *rand.PCG, rng *rand.Rand, seed uint64, std float64, name string, r int, dst []float32) {
	pcg.Seed(seed, tensorSeed(name)^(uint64(r)*0x9e3779b97f4a7c15))
	for i := range dst {
		dst[i] = float32(rng.NormFloat64() * std)
	}
}

// Weights returns the float32 values of the named 2-D tensor (rows of cols),
// as Write generates them with the default std before converting to the
// Spec's type. Meant for tests on small shapes.
func Weights(seed uint64, name string, rows, cols int) []float32 {
	return Spec{Seed: seed}.Weights(name, rows, cols)
}

// Weights returns the float32 values of s's named tensor (rows of cols;
// a vector is one row), as Write generates them before converting to the
// Spec's type.
func (s Spec) Weights(name string, rows, cols int) []float32 {
	pcg := rand.NewPCG(0, 0)
	rng := rand.New(pcg)
	std := s.std()
	var parts []partStd
	if a, err := s.Architecture(); err == nil {
		c := s.Config(a)
		for _, t := range a.Tensors {
			if t.Name == name || (t.PerLayer() && perLayerName(t, name, s.Layers)) {
				std, parts = s.tensorStds(t, c)
			}
		}
	}
	out := make([]float32, rows*cols)
	for r := range rows {
		weightRow(pcg, rng, s.Seed, stdAt(std, parts, r), name, r, out[r*cols:(r+1)*cols])
	}
	return out
}

// perLayerName reports whether name is t's name in one of the first layers
// blocks.
func perLayerName(t arch.Tensor, name string, layers int) bool {
	for l := range layers {
		if t.NameAt(l) == name {
			return true
		}
	}
	return false
}

// optional reports whether a declares role r's tensor optional.
func optional(a *arch.Arch, r arch.Role) bool {
	for _, t := range a.Tensors {
		if t.Parts[0].Role == r {
			return t.Optional
		}
	}
	return false
}

// Settings names the Spec settings that only some architectures use, as
// Uses and batonctl gen-model's flags name them.
var Settings = []string{"window", "swa-pattern", "rope-base-local", "final-softcap", "rope-dim", "head-dim"}

// Uses returns nil when architecture a uses the named setting (one of
// Settings), else an error saying why it does not: the window, pattern,
// local rope base and final soft-cap are used where a's writer writes their
// metadata key (arch.Arch.Keys), so the answer comes from the same table
// the reader's keys do; rope-dim where llama.cpp rotates partial heads
// (not arch.Arch.WholeHeadRope), head-dim where the heads need not fill the
// embedding (not arch.Arch.SquareAttn). An unknown setting is an error.
func Uses(a *arch.Arch, setting string) error {
	// A config with every optional setting on, to see which keys a's
	// writer writes for them.
	probe := arch.Config{Dim: 64, Heads: 4, KVHeads: 4, HeadDim: 16, RopeDim: 16, TrainContextLength: 64, ContextLength: 64,
		SlidingWindow: 8, SWAPattern: 2, RopeBaseLocal: 1, FinalSoftCap: 1}
	written := func(suffix string) bool {
		for _, kv := range arch.Keys(a, probe) {
			if kv.Key == a.Name+"."+suffix {
				return true
			}
		}
		return false
	}
	var key string
	switch setting {
	case "window":
		key = "attention.sliding_window"
	case "swa-pattern":
		key = "attention.sliding_window_pattern"
	case "rope-base-local":
		key = "rope.freq_base_swa"
	case "final-softcap":
		key = "final_logit_softcapping"
	case "rope-dim":
		if a.WholeHeadRope {
			return fmt.Errorf("architecture %s ignores rope-dim: llama.cpp rotates its whole heads (rope.dimension_count = the head dimension)", a.Name)
		}
		return nil
	case "head-dim":
		if a.SquareAttn {
			return fmt.Errorf("architecture %s ignores head-dim: llama.cpp derives it, embedding_length/head_count (its attention output is embedding_length square)", a.Name)
		}
		return nil
	default:
		return fmt.Errorf("unknown setting %q (settings: %s)", setting, strings.Join(Settings, ", "))
	}
	if !written(key) {
		return fmt.Errorf("architecture %s ignores %s: it has no %s.%s", a.Name, setting, a.Name, key)
	}
	return nil
}
