package runcmd

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

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
default 0.02) by a generator seeded with --seed (same seed, same weights in
every type); norms are 1; the vocabulary is a synthetic SentencePiece one.
Flags given with --preset override the preset's values. 2-D tensors are
stored in --type, norms and biases in F32; rows must be whole blocks of the
type (multiples of 256 for Q4_K and Q6_K, 32 for Q4_0 and Q8_0), otherwise
it is an error (no fallback to another type).

Greedy comparisons with another engine want clear top-2 margins at every
step, which 0.02 does not give on tiny shapes (the logits are nearly flat):
use about 8/sqrt(dim), --std 1.0 at --dim 64 (measured in docs/models.md).

Presets: %s.

Flags:`

// GenModel is the `batonctl gen-model` command.
func GenModel(ctx context.Context, stdout, stderr io.Writer, args []string) int {
	var (
		preset, typ, out string
		s                testmodel.Spec
		ropeBase         float64
	)
	fs := flag.NewFlagSet("batonctl gen-model", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&preset, "preset", "", "start from this preset: "+strings.Join(testmodel.Presets(), ", "))
	fs.StringVar(&s.Arch, "arch", "llama", "architecture (general.architecture): "+strings.Join(arch.Names(), ", "))
	fs.IntVar(&s.HeadDim, "head-dim", 0, "width of one attention head (default: dim/heads; another value is written as attention.key_length, as Qwen3 files have)")
	fs.IntVar(&s.SlidingWindow, "window", 0, "sliding window of gemma2, gemma3 and phi3 files, attention.sliding_window, at most --context (default: the architecture's: gemma2 4096, gemma3 512, both clamped to --context; phi3 none)")
	fs.Float64Var(&ropeBase, "rope-base", testmodel.RopeBase, "rope.freq_base (Gemma 3: of its global layers; its local ones use 10000)")
	fs.Float64Var(&s.Std, "std", testmodel.WeightStd, "standard deviation of the random weights and biases")
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
	fs.Usage = func() {
		fmt.Fprintf(stderr, genModelHelp+"\n", strings.Join(arch.Names(), ", "), strings.Join(testmodel.Presets(), ", "))
		fs.PrintDefaults()
	}
	if err := svckit.ParseArgs(fs, args); err != nil {
		return flagErr(stderr, "gen-model", err)
	}
	s.RopeBase = float32(ropeBase)
	spec, err := genSpec(fs, preset, typ, s)
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
	if set["rope-base"] {
		s.RopeBase = flags.RopeBase
	}
	if set["std"] || s.Std == 0 {
		s.Std = flags.Std
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
