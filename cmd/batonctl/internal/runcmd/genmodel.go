package runcmd

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/baton-serving/baton/engine/model/arch"
	"github.com/baton-serving/baton/engine/modelfile"
	"github.com/baton-serving/baton/engine/testmodel"
	"github.com/baton-serving/baton/kernels/quant"
	"github.com/baton-serving/baton/svckit"
)

// GenModelSummary is the one-line description of `batonctl gen-model`.
const GenModelSummary = "write a GGUF of any supported architecture with deterministic random weights (for tests and benchmarks)"

const genModelHelp = `Usage: batonctl gen-model (--preset NAME | --dim N --hidden N --layers N --heads N --vocab N) --out FILE [flags]

Writes a GGUF of architecture --arch (%s; default llama) whose
tensors are those engine/model binds for it, with the metadata keys
llama.cpp reads for it. Weights and biases are drawn from N(0, std²) (--std,
default 0.02; the tiny-ARCH presets 1, tiny-gemma2 0.15 and tiny-gemma3 0.35)
by a generator seeded with --seed
(same seed, same weights in every type); norms are 1. Flags given with
--preset override the preset's values.

The vocabulary is a synthetic SentencePiece one of --vocab tokens, or, with
--vocab-from FILE, a copy of another GGUF's tokenizer (every tokenizer.*
entry: model, pre, tokens, scores, token types, merges, special token ids,
add_bos/add_eos, chat template); the vocabulary size is then that file's
token count, replacing the preset's (a model's embedding has a row per
token), and --vocab is refused. --chat-template FILE sets
tokenizer.chat_template from a Jinja file.

2-D tensors are stored in --type, norms and biases in F32. Every row must be
a whole number of the type's blocks, otherwise it is an error (no fallback
to another type, as llama.cpp's quantizer would): %s.

Greedy comparisons with another engine want clear top-2 margins at every
step, which 0.02 does not give on tiny shapes (the logits are nearly flat):
use about 8/sqrt(dim), --std 1.0 at --dim 64 (measured in docs/models.md);
the tiny-ARCH presets set theirs. --output-std sets the std of output.weight
(and of the embedding with --tied), --std that of the rest: the logits' scale
comes from the output head. --qk-std sets the std of the query and key
weights: attention scores scale with its square, the logits do not, so a
small --qk-std keeps attention away from argmax (scripts/golden/README.md).

Presets (big ones are written in bounded memory, with progress on stderr):
%s
Flags:`

// presetHelp lists the presets one a line, with their default type.
func presetHelp() string {
	var b strings.Builder
	for _, p := range testmodel.PresetInfos() {
		fmt.Fprintf(&b, "  %-15s [%s] %s\n", p.Name, p.Spec.Type, p.Doc)
	}
	return b.String()
}

// typeHelp names each supported type with its block size.
func typeHelp() string {
	var parts []string
	for _, t := range quant.SupportedTypes() {
		parts = append(parts, fmt.Sprintf("%s %d", t, t.BlockSize()))
	}
	return "block sizes " + strings.Join(parts, ", ")
}

// GenModel is the `batonctl gen-model` command.
func GenModel(ctx context.Context, stdout, stderr io.Writer, args []string) int {
	var (
		preset, typ, out        string
		vocabFrom, chatTemplate string
		ropeBase, normEps       float64
		ropeBaseLocal           float64
		finalSoftCap            float64
		s                       testmodel.Spec
	)
	fs := flag.NewFlagSet("batonctl gen-model", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&preset, "preset", "", "start from this preset: "+strings.Join(testmodel.Presets(), ", "))
	fs.StringVar(&s.Arch, "arch", "llama", "architecture (general.architecture): "+strings.Join(arch.Names(), ", "))
	fs.IntVar(&s.HeadDim, "head-dim", 0, "width of one attention head (default: dim/heads; another value is written as attention.key_length, as Qwen3 files have; qwen2 and phi3, whose heads fill the embedding, refuse another value)")
	fs.IntVar(&s.SlidingWindow, "window", 0, "sliding window of gemma2, gemma3 and phi3 files, attention.sliding_window, at most --context (default: the preset's, else the architecture's: gemma2 4096, gemma3 512, both clamped to --context; phi3 none); other architectures refuse it")
	fs.Float64Var(&s.Std, "std", 0, "standard deviation of the random weights and biases (default: the preset's, else 0.02)")
	fs.Float64Var(&s.OutputStd, "output-std", 0, "standard deviation of output.weight (and of token_embd.weight with --tied) (default: --std)")
	fs.Float64Var(&s.QKStd, "qk-std", 0, "standard deviation of the query and key weights and biases (attn_q, attn_k, their biases, the query and key rows of attn_qkv) (default: --std)")
	fs.IntVar(&s.Dim, "dim", 0, "embedding length")
	fs.IntVar(&s.Hidden, "hidden", 0, "feed-forward length")
	fs.IntVar(&s.Layers, "layers", 0, "number of blocks")
	fs.IntVar(&s.Heads, "heads", 0, "attention heads")
	fs.IntVar(&s.KVHeads, "kv-heads", 0, "key/value heads (default: --heads)")
	fs.IntVar(&s.Vocab, "vocab", 0, fmt.Sprintf("vocabulary size, at least %d", testmodel.MinVocab))
	fs.IntVar(&s.Context, "context", 0, "context length written to the metadata (default 2048)")
	fs.StringVar(&typ, "type", "", "storage type of the 2-D tensors: "+typeNames()+" (default: the preset's, else F32)")
	fs.BoolVar(&s.Tied, "tied", false, "leave out output.weight (the output head reuses the token embedding)")
	fs.Uint64Var(&s.Seed, "seed", 1, "weight generator seed")
	fs.StringVar(&out, "out", "", "file to write (required)")
	fs.StringVar(&vocabFrom, "vocab-from", "", "copy the tokenizer (every tokenizer.* key) of this GGUF; the vocabulary size becomes its token count")
	fs.StringVar(&chatTemplate, "chat-template", "", "Jinja file written as tokenizer.chat_template (replacing a copied one)")
	fs.Float64Var(&ropeBase, "rope-base", 0, fmt.Sprintf("rope.freq_base (default: the preset's, else %d; Gemma 3: of its global layers)", testmodel.RopeBase))
	fs.IntVar(&s.RopeDim, "rope-dim", 0, "rope.dimension_count, the head dimensions RoPE rotates (partial rotary, as Phi-4-mini's 96 of 128; phi3 and gemma3) (default: the head dimension)")
	fs.Float64Var(&ropeBaseLocal, "rope-base-local", 0, "gemma3's rope.freq_base_swa, the RoPE base of its local layers (default 10000, no key written)")
	fs.IntVar(&s.SWAPattern, "swa-pattern", 0, "gemma3's attention.sliding_window_pattern: every Nth block global, 1 all of them (default 6, no key written)")
	fs.Float64Var(&finalSoftCap, "final-softcap", 0, "final_logit_softcapping of gemma2 (default 30) and gemma3 (default none)")
	fs.Float64Var(&normEps, "norm-eps", 0, fmt.Sprintf("attention.layer_norm_rms_epsilon (default: the preset's, else %g)", testmodel.NormEps))
	fs.Usage = func() {
		fmt.Fprintf(stderr, genModelHelp+"\n", strings.Join(arch.Names(), ", "), typeHelp(), presetHelp())
		fs.PrintDefaults()
	}
	if err := svckit.ParseArgs(fs, args); err != nil {
		return flagErr(stderr, "gen-model", err)
	}
	s.RopeBase, s.NormEps = float32(ropeBase), float32(normEps)
	s.RopeBaseLocal, s.FinalSoftCap = float32(ropeBaseLocal), float32(finalSoftCap)
	spec, err := genSpec(fs, preset, typ, s)
	if err == nil {
		spec, err = genVocab(fs, spec, vocabFrom, chatTemplate)
	}
	if err == nil && out == "" {
		err = fmt.Errorf("--out FILE is required")
	}
	if err == nil {
		err = spec.Validate()
	}
	if err != nil {
		return flagErr(stderr, "gen-model", err)
	}

	progress := func(done, total int64) {}
	var bytes int64
	if est := estimateBytes(spec); est > 64<<20 {
		switch {
		case modelfile.IsTerminal(stderr):
			progress = modelfile.TerminalProgress(stderr)
		default:
			// Not a terminal: a line per tenth.
			next := int64(0)
			progress = func(done, total int64) {
				if done >= next {
					fmt.Fprintf(stderr, "gen-model: %d%% (%d of %d bytes)\n", done*100/total, done, total)
					next += total / 10
				}
			}
		}
	}
	start := time.Now()
	err = testmodel.WriteProgress(ctx, out, spec, func(done, total int64) {
		bytes = total
		progress(done, total)
	})
	if err != nil && ctx.Err() != nil {
		fmt.Fprintln(stderr, "batonctl gen-model: interrupted; nothing written")
		return exitInterrupted
	}
	if err != nil {
		fmt.Fprintf(stderr, "batonctl gen-model: %s\n", oneLine(err))
		return exitFailed
	}
	size := bytes
	if st, err := os.Stat(out); err == nil {
		size = st.Size()
	}
	fmt.Fprintf(stdout, "wrote %s: %s, %d parameters, %dx%d (hidden %d, %d/%d heads, vocab %d), %s, %d bytes in %s\n",
		out, spec.ArchName(), spec.Params(), spec.Layers, spec.Dim, spec.Hidden, spec.Heads, spec.KVHeads, spec.Vocab, spec.Type, size,
		time.Since(start).Round(time.Millisecond))
	return exitOK
}

// genSpec combines the preset (if any) with the flags that were set.
func genSpec(fs *flag.FlagSet, preset, typ string, flags testmodel.Spec) (testmodel.Spec, error) {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var s testmodel.Spec
	if preset != "" {
		p, ok := testmodel.Preset(preset)
		if !ok {
			return s, fmt.Errorf("--preset %q: unknown (presets: %s)", preset, strings.Join(testmodel.Presets(), ", "))
		}
		s = p
	} else {
		for _, name := range []string{"dim", "hidden", "layers", "heads", "vocab"} {
			if !set[name] {
				return s, fmt.Errorf("--%s is required without --preset", name)
			}
		}
		s = testmodel.Spec{Type: quant.F32, Context: 2048}
	}
	pick := func(name string, dst *int, v int) {
		if set[name] {
			*dst = v
		}
	}
	pick("dim", &s.Dim, flags.Dim)
	pick("hidden", &s.Hidden, flags.Hidden)
	pick("layers", &s.Layers, flags.Layers)
	pick("heads", &s.Heads, flags.Heads)
	pick("kv-heads", &s.KVHeads, flags.KVHeads)
	pick("vocab", &s.Vocab, flags.Vocab)
	pick("context", &s.Context, flags.Context)
	if preset == "" && !set["kv-heads"] {
		s.KVHeads = s.Heads
	}
	if set["tied"] {
		s.Tied = flags.Tied
	}
	if set["seed"] || preset == "" {
		s.Seed = flags.Seed
	}
	if set["arch"] || s.Arch == "" {
		s.Arch = flags.Arch
	}
	pick("head-dim", &s.HeadDim, flags.HeadDim)
	pick("window", &s.SlidingWindow, flags.SlidingWindow)
	pick("rope-dim", &s.RopeDim, flags.RopeDim)
	pick("swa-pattern", &s.SWAPattern, flags.SWAPattern)
	for _, f := range []struct {
		name string
		dst  *float32
		v    float32
	}{{"rope-base-local", &s.RopeBaseLocal, flags.RopeBaseLocal}, {"final-softcap", &s.FinalSoftCap, flags.FinalSoftCap}} {
		if set[f.name] {
			if !(f.v > 0) {
				return s, fmt.Errorf("--%s %v: want a number > 0", f.name, f.v)
			}
			*f.dst = f.v
		}
	}
	// A flag the architecture ignores would leave the file as if it were
	// not given: refused, naming both, rather than silently dropped, even
	// at its default value. (--head-dim and --rope-dim at the value the
	// architecture derives change nothing, and Spec.Validate refuses
	// any other.)
	if a, ok := arch.Lookup(s.ArchName()); ok {
		for _, name := range testmodel.Settings {
			if set[name] && name != "head-dim" && name != "rope-dim" {
				if err := testmodel.Uses(a, name); err != nil {
					return s, fmt.Errorf("--%s: %w", name, err)
				}
			}
		}
	}
	if set["rope-base"] {
		if !(flags.RopeBase > 0) {
			return s, fmt.Errorf("--rope-base %v: want a number > 0", flags.RopeBase)
		}
		s.RopeBase = flags.RopeBase
	}
	if set["norm-eps"] {
		if !(flags.NormEps > 0) {
			return s, fmt.Errorf("--norm-eps %v: want a number > 0", flags.NormEps)
		}
		s.NormEps = flags.NormEps
	}
	if set["std"] || s.Std == 0 {
		s.Std = flags.Std
	}
	if set["output-std"] {
		s.OutputStd = flags.OutputStd
	}
	if set["qk-std"] {
		s.QKStd = flags.QKStd
	}
	if typ != "" {
		t, err := parseType(typ)
		if err != nil {
			return s, err
		}
		s.Type = t
	}
	return s, nil
}

// genVocab applies --vocab-from and --chat-template to s.
func genVocab(fs *flag.FlagSet, s testmodel.Spec, vocabFrom, chatTemplate string) (testmodel.Spec, error) {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if set["vocab-from"] {
		if set["vocab"] {
			return s, fmt.Errorf("--vocab and --vocab-from conflict: with --vocab-from the vocabulary size is the file's token count")
		}
		if vocabFrom == "" {
			return s, fmt.Errorf("--vocab-from: empty file name")
		}
		tok, err := testmodel.ReadTokenizer(vocabFrom)
		if err != nil {
			return s, fmt.Errorf("--vocab-from %s: %w", vocabFrom, err)
		}
		s = s.WithTokenizer(tok)
	}
	if set["chat-template"] {
		b, err := os.ReadFile(chatTemplate)
		if err != nil {
			return s, fmt.Errorf("--chat-template: %w", err)
		}
		if len(strings.TrimSpace(string(b))) == 0 {
			return s, fmt.Errorf("--chat-template %s: the file is empty", chatTemplate)
		}
		if !utf8.Valid(b) {
			return s, fmt.Errorf("--chat-template %s: not UTF-8 text", chatTemplate)
		}
		s.ChatTemplate = string(b)
	}
	return s, nil
}

func parseType(name string) (quant.Type, error) {
	for _, t := range quant.SupportedTypes() {
		if strings.EqualFold(t.String(), name) {
			return t, nil
		}
	}
	return 0, fmt.Errorf("--type %q: unknown (supported: %s)", name, typeNames())
}

func typeNames() string {
	var names []string
	for _, t := range quant.SupportedTypes() {
		names = append(names, t.String())
	}
	return strings.Join(names, ", ")
}

// estimateBytes is the approximate size of the tensor data.
func estimateBytes(s testmodel.Spec) int64 {
	bs, bb := s.Type.BlockSize(), s.Type.BlockBytes()
	if bs == 0 {
		return 0
	}
	return s.Params() / int64(bs) * int64(bb)
}
