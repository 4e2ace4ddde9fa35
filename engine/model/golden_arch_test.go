package model

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/baton-serving/baton/engine/gguf"
	"github.com/baton-serving/baton/engine/sample"
	"github.com/baton-serving/baton/engine/testmodel"
	"github.com/baton-serving/baton/engine/tokenizer"
	"github.com/baton-serving/baton/kernels/quant"
	"github.com/baton-serving/baton/kernels/vec"
)

// archGolden mirrors the parts of a testdata/golden/<arch>_<type>.json file
// (written by scripts/golden/record.sh; format in scripts/golden/README.md)
// that TestGoldenArch reads.
type archGolden struct {
	SchemaVersion int `json:"schema_version"`
	Producer      struct {
		Engine       string `json:"engine"`
		EngineCommit string `json:"engine_commit"`
	} `json:"producer"`
	Command      []string `json:"command"`
	Case         string   `json:"case"`
	GenModelArgs []string `json:"gen_model_args"`
	Model        struct {
		SHA256       string `json:"sha256"`
		Bytes        int64  `json:"bytes"`
		Architecture string `json:"architecture"`
	} `json:"model"`
	Settings struct {
		TypeK     string  `json:"type_k"`
		LowMargin float64 `json:"low_margin"`
	} `json:"settings"`
	Prompts []struct {
		Text         string  `json:"text"`
		PromptIDs    []int32 `json:"prompt_ids"`
		GeneratedIDs []int32 `json:"generated_ids"`
		Error        string  `json:"error"`
		Steps        []struct {
			ID     int32        `json:"id"`
			Margin float64      `json:"margin"`
			Top    [][2]float64 `json:"top"` // [rank] = {id, logprob}
		} `json:"steps"`
	} `json:"prompts"`
}

// goldenLowMargin is the acceptance's threshold: steps are compared up to
// the first one where llama.cpp's top-2 probability margin is below it.
const goldenLowMargin = 1e-3

// knownGoldenDivergence lists the cases whose greedy ids are known to leave
// llama.cpp's at a step with a clear margin: why, and exactly where (prompt
// index → first different step). Such a case still runs in full
// (regeneration, sha256, tokenizer, every comparison) and then skips,
// naming the reason — but only if it parts exactly where its line says: a
// prompt that parts earlier, later or not at all, or one that parts and is
// not listed, fails, so that a regression cannot hide behind a listed case
// and an improvement updates its line. Set BATON_GOLDEN_ARCH_STRICT=1 to
// make the listed divergences failures too. The places differ between the
// vec implementations (their float32 sums add in different orders), so each
// is listed per implementation; measured on AMD EPYC (Zen 5) for avx512,
// avx2 and purego, 2026-12-02; scripts/golden/README.md has the figures.
var knownGoldenDivergence = map[string]knownDivergence{
	// llama, qwen2 and phi3 F16 left this list when the CPU backend took
	// ggml's F16 rounding of the activations; qwen3 F16 (recorded with the
	// newer llama.cpp) still parts at one step of one prompt.
	"qwen3_f16": {f16Divergence, map[string]map[int]int{"avx512": {1: 24}}},
	// Quantized weights: a last-bit difference in a float32 value that is
	// then quantized to Q8_0/Q8_K (the activations of every quantized
	// product) moves that value by a whole quantum when it sits on a
	// rounding boundary, and the logits by ~0.01–0.5 from that step on.
	// Baton's exp (SiLU, softmax), attention sums and block dots add in
	// other orders than ggml's x86 build, so a few such flips happen in
	// every prompt (scripts/golden/README.md, "Why quantized cases part").
	// llama Q4_K and the llama, qwen2 and phi3 Q6_K cases left this list
	// when kernels.RMSNorm took ggml's rounding.
	"llama_q8_0":  {quantDivergence, map[string]map[int]int{"avx512": {1: 31}, "avx2": {1: 31}, "purego": {1: 31}}},
	"qwen2_q8_0":  {quantDivergence, map[string]map[int]int{"avx512": {3: 17}, "avx2": {3: 17, 6: 18}, "purego": {3: 37}}},
	"qwen3_q8_0":  {quantDivergence, map[string]map[int]int{"avx512": {4: 0}, "purego": {6: 12}}},
	"qwen3_q6_k":  {quantDivergence, map[string]map[int]int{"avx512": {5: 44}, "avx2": {5: 44}, "purego": {0: 3, 5: 44}}},
	"phi3_q8_0":   {quantDivergence, map[string]map[int]int{"avx512": {4: 35}, "avx2": {4: 35}}},
	"phi3_q4_k":   {quantDivergence, map[string]map[int]int{"avx512": {1: 28, 3: 32}, "avx2": {1: 28, 3: 32}, "purego": {1: 28, 3: 32}}},
	"gemma3_q6_k": {quantDivergence, map[string]map[int]int{"purego": {4: 25}}},
	"qwen2_q4_k":  {quantDivergence, map[string]map[int]int{"purego": {6: 31}}},
}

// knownDivergence is one line of knownGoldenDivergence.
type knownDivergence struct {
	why string
	// at maps a vec implementation to the prompts that part from llama.cpp
	// under it and their first different steps; an implementation it does
	// not name must match llama.cpp on every compared step.
	at map[string]map[int]int
}

const (
	f16Divergence   = "qwen3 F16 against llama.cpp d32676d: F16 activations rounded the same, float32 sums in other orders"
	quantDivergence = "quantized weights: last-bit differences flip Q8 activation roundings (exp, attention and dot sums in other orders than ggml's x86 build)"
)

// specFromGenModelArgs turns the gen-model arguments a golden file records
// into the Spec `batonctl gen-model` builds from them: the same flags with
// the same defaults, without --preset (a golden case spells out its shape).
// The test checks the written file's sha256 against the recorded one, so a
// parse that differs from gen-model's shows up there, not as a wrong model.
func specFromGenModelArgs(args []string) (testmodel.Spec, error) {
	var (
		s                                              testmodel.Spec
		typ                                            string
		ropeBase, ropeBaseLocal, finalSoftCap, normEps float64
	)
	fs := flag.NewFlagSet("gen-model", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&s.Arch, "arch", "llama", "")
	fs.IntVar(&s.HeadDim, "head-dim", 0, "")
	fs.Float64Var(&s.Std, "std", testmodel.WeightStd, "")
	fs.Float64Var(&s.OutputStd, "output-std", 0, "")
	fs.Float64Var(&s.QKStd, "qk-std", 0, "")
	fs.IntVar(&s.Dim, "dim", 0, "")
	fs.IntVar(&s.Hidden, "hidden", 0, "")
	fs.IntVar(&s.Layers, "layers", 0, "")
	fs.IntVar(&s.Heads, "heads", 0, "")
	fs.IntVar(&s.KVHeads, "kv-heads", 0, "")
	fs.IntVar(&s.Vocab, "vocab", 0, "")
	fs.IntVar(&s.Context, "context", 2048, "")
	fs.StringVar(&typ, "type", "F32", "")
	fs.BoolVar(&s.Tied, "tied", false, "")
	fs.Uint64Var(&s.Seed, "seed", 1, "")
	// The settings of the shape variants (record.sh VARIANTS); 0: unset,
	// the architecture's default, as gen-model leaves them.
	fs.IntVar(&s.SlidingWindow, "window", 0, "")
	fs.IntVar(&s.RopeDim, "rope-dim", 0, "")
	fs.IntVar(&s.SWAPattern, "swa-pattern", 0, "")
	fs.Float64Var(&ropeBase, "rope-base", 0, "")
	fs.Float64Var(&ropeBaseLocal, "rope-base-local", 0, "")
	fs.Float64Var(&finalSoftCap, "final-softcap", 0, "")
	fs.Float64Var(&normEps, "norm-eps", 0, "")
	if err := fs.Parse(args); err != nil {
		return s, fmt.Errorf("gen_model_args %q: %v (the test reads only gen-model's shape flags)", args, err)
	}
	if fs.NArg() > 0 {
		return s, fmt.Errorf("gen_model_args %q: unexpected %q", args, fs.Args())
	}
	s.RopeBase, s.RopeBaseLocal = float32(ropeBase), float32(ropeBaseLocal)
	s.FinalSoftCap, s.NormEps = float32(finalSoftCap), float32(normEps)
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if !set["kv-heads"] {
		s.KVHeads = s.Heads
	}
	i := slices.IndexFunc(quant.SupportedTypes(), func(t quant.Type) bool { return strings.EqualFold(t.String(), typ) })
	if i < 0 {
		return s, fmt.Errorf("gen_model_args: --type %q is not a supported type", typ)
	}
	s.Type = quant.SupportedTypes()[i]
	return s, s.Validate()
}

func fileSHA256(t *testing.T, path string) (string, int64) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil)), n
}

// TestGoldenArch is the issue-19 acceptance test: for every golden file in
// testdata/golden (one per architecture and tensor type), it regenerates the
// model from the recorded gen-model arguments, checks that the file is
// byte-identical to the one llama.cpp ran (sha256), checks that Baton's
// tokenizer gives llama.cpp's prompt ids, and runs Baton's greedy decoding
// from those ids, comparing every generated id with llama.cpp's up to the
// first step where llama.cpp's top-2 probability margin is below 1e-3 (a
// step that close is decided by rounding, not by the model). After the
// first different id a prompt stops: later steps see different inputs.
func TestGoldenArch(t *testing.T) {
	dir := filepath.Join("testdata", "golden")
	if d := os.Getenv("BATON_GOLDEN_ARCH_DIR"); d != "" {
		dir = d // other recordings, for experiments (scripts/golden/README.md)
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no testdata/golden/*.json: record them with scripts/golden/record.sh")
	}
	// The vec implementations add float32 sums in different orders, and
	// last-bit differences move Q8 activation roundings (see
	// knownGoldenDivergence), so every implementation this CPU has is
	// checked, one after the other (SetImplementation is package state).
	impls := vec.Implementations()
	if raceEnabled {
		// The race detector slows purego's forward passes ~20×; a -race
		// run checks the preferred implementation, and scripts/test.sh
		// runs this test without -race for all of them.
		impls = impls[:1]
	}
	for _, impl := range impls {
		t.Run(impl, func(t *testing.T) {
			restore, err := vec.SetImplementation(impl)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(restore) // after the parallel cases below
			for _, path := range files {
				name := strings.TrimSuffix(filepath.Base(path), ".json")
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					runGoldenArchCase(t, path, impl)
				})
			}
		})
	}
}

func runGoldenArchCase(t *testing.T, path, impl string) {
	strict := os.Getenv("BATON_GOLDEN_ARCH_STRICT") == "1"
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var g archGolden
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if g.SchemaVersion != 1 || len(g.Prompts) == 0 || g.Model.SHA256 == "" {
		t.Fatalf("%s: schema_version %d, %d prompts, sha256 %q: not a golden recording", path, g.SchemaVersion, len(g.Prompts), g.Model.SHA256)
	}
	spec, err := specFromGenModelArgs(g.GenModelArgs)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if spec.ArchName() != g.Model.Architecture {
		t.Fatalf("%s: gen_model_args make %s, the recorded file is %s", path, spec.ArchName(), g.Model.Architecture)
	}
	label := fmt.Sprintf("%s %s", spec.ArchName(), spec.Type)

	file := filepath.Join(t.TempDir(), g.Case+".gguf")
	if err := testmodel.Write(file, spec); err != nil {
		t.Fatalf("%s: writing the model: %v", label, err)
	}
	if sum, n := fileSHA256(t, file); sum != g.Model.SHA256 || n != g.Model.Bytes {
		t.Fatalf("%s: the regenerated model (%d bytes, sha256 %s) is not the file llama.cpp ran (%d bytes, sha256 %s): "+
			"engine/testmodel's output changed for %q; rerun scripts/golden/record.sh %s (its commands: %q)",
			label, n, sum, g.Model.Bytes, g.Model.SHA256, g.GenModelArgs, g.Case, g.Command)
	}
	f, err := gguf.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tok, err := tokenizer.FromGGUF(f)
	if err != nil {
		t.Fatalf("%s: tokenizer: %v", label, err)
	}
	m, err := Load(f, Options{Threads: 1})
	if err != nil {
		t.Fatalf("%s: load: %v", label, err)
	}
	defer m.Close()
	cfg := m.Config()

	var compared, total, prompts int
	var diverged []string
	parted := map[int]int{} // prompt → first different step
	for pi, p := range g.Prompts {
		what := fmt.Sprintf("%s, prompt %d %q", label, pi, p.Text)
		report := t.Errorf
		if !strict {
			report = t.Logf // checked against knownGoldenDivergence below
		}
		ids := tok.Encode(p.Text, tokenizer.EncodeOptions{AddSpecial: true, ParseSpecial: true})
		if !slices.Equal(ids, p.PromptIDs) {
			t.Errorf("%s: Baton's tokenizer gives %v, llama.cpp %v", what, ids, p.PromptIDs)
		}
		if p.Error != "" {
			continue
		}
		if len(p.Steps) != len(p.GeneratedIDs) || len(p.PromptIDs) == 0 {
			t.Fatalf("%s: %d steps for %d generated ids, %d prompt ids", what, len(p.Steps), len(p.GeneratedIDs), len(p.PromptIDs))
		}
		prompts++
		total += len(p.Steps)
		cache, err := NewContiguousCache(cfg, len(p.PromptIDs)+len(p.Steps))
		if err != nil {
			t.Fatal(err)
		}
		logits := make([]float32, cfg.Vocab)
		if err := m.Forward(p.PromptIDs, 0, cache, logits); err != nil {
			t.Fatalf("%s: prompt: %v", what, err)
		}
		pos := len(p.PromptIDs)
		for step, st := range p.Steps {
			if st.Margin < goldenLowMargin {
				break
			}
			got := sample.Greedy(logits)
			if got != st.ID {
				_, top := sample.Logprobs(logits, -1, 2)
				ours := math.Exp(float64(top[0].Logprob)) - math.Exp(float64(top[1].Logprob))
				msg := fmt.Sprintf("%s, step %d: Baton picks %d, llama.cpp %d (llama.cpp's margin %.4g, top-2 %v; Baton's margin %.4g, top-2 %d %d)",
					what, step, got, st.ID, st.Margin, st.Top, ours, top[0].ID, top[1].ID)
				report("%s", msg)
				diverged = append(diverged, fmt.Sprintf("prompt %d at step %d (margin %.3g)", pi, step, st.Margin))
				parted[pi] = step
				break
			}
			compared++
			if step+1 == len(p.Steps) {
				break
			}
			if err := m.Forward([]int32{got}, pos, cache, logits); err != nil {
				t.Fatalf("%s, step %d: %v", what, step, err)
			}
			pos++
		}
	}
	result := "all equal"
	if len(diverged) > 0 {
		result = "diverges: " + strings.Join(diverged, "; ")
	}
	summary := fmt.Sprintf("%s [%s] (%s %.7s, KV %s): %d prompts, %d of %d steps equal before the first margin < %g, %s",
		label, impl, g.Producer.Engine, g.Producer.EngineCommit, g.Settings.TypeK, prompts, compared, total, goldenLowMargin, result)
	t.Log(summary)
	known := knownGoldenDivergence[g.Case]
	want := known.at[impl]
	if strict || (len(want) == 0 && len(parted) == 0) {
		return // strict: every divergence was reported as an error above
	}
	if !maps.Equal(parted, want) {
		t.Errorf("%s [%s]: parts from llama.cpp at %v (prompt: step), knownGoldenDivergence lists %v: a regression if earlier or new, else update the line (%s)",
			g.Case, impl, parted, want, summary)
		return
	}
	if !t.Failed() {
		t.Skipf("known divergence (%s; BATON_GOLDEN_ARCH_STRICT=1 fails on it): %s", known.why, summary)
	}
}
