package runcmd

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/baton-serving/baton/engine/gguf"
	"github.com/baton-serving/baton/engine/modelfile"
	"github.com/baton-serving/baton/engine/refdata"
)

type result struct {
	code           int
	stdout, stderr string
}

func call(ctx context.Context, fn func(context.Context, *bytes.Buffer, *bytes.Buffer) int) result {
	var out, errb bytes.Buffer
	code := fn(ctx, &out, &errb)
	return result{code, out.String(), errb.String()}
}

func runCmd(t *testing.T, args ...string) result {
	t.Helper()
	return call(context.Background(), func(ctx context.Context, o, e *bytes.Buffer) int { return Run(ctx, o, e, args) })
}

// The golden greedy generation of llama.cpp for "Once upon a time" (see
// shared/golden/stories260K.json).
var (
	goldenPrompt    = []int32{1, 403, 407, 261, 378}
	goldenGenerated = []int32{432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338, 401, 396, 267, 337,
		410, 408, 419, 292, 411, 322, 265, 282, 295, 433, 426, 385, 328, 432, 358, 394, 261, 370, 432, 352,
		266, 268, 388, 426, 338, 391, 266, 267, 337, 335, 312, 432, 398, 312, 286, 267, 414, 270, 333, 415,
		426, 13, 438, 310, 439, 419, 357, 336}
	goldenText = ", there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big, red ball. She wanted to play with it, but it was too high.\nLily's mom said"
)

type runJSON struct {
	PromptIDs     []int32  `json:"prompt_ids"`
	GeneratedIDs  []int32  `json:"generated_ids"`
	Text          string   `json:"text"`
	PromptTPS     *float64 `json:"prompt_tokens_per_second"`
	GenerationTPS *float64 `json:"generation_tokens_per_second"`
	StopReason    string   `json:"stop_reason"`
	FinishReason  string   `json:"finish_reason"`
	Seed          uint64   `json:"seed"`
}

func decodeRun(t *testing.T, r result) runJSON {
	t.Helper()
	if r.code != 0 {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
	dec := json.NewDecoder(strings.NewReader(r.stdout))
	var v runJSON
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("stdout %q: %v", r.stdout, err)
	}
	if dec.More() {
		t.Fatalf("more than one JSON value on stdout: %q", r.stdout)
	}
	return v
}

func TestRunGolden(t *testing.T) {
	path := refdata.Model(t)
	v := decodeRun(t, runCmd(t, "--model", path, "--prompt", "Once upon a time", "-n", "64", "--temperature", "0", "--json"))
	if !slices.Equal(v.PromptIDs, goldenPrompt) {
		t.Errorf("prompt_ids %v, want %v", v.PromptIDs, goldenPrompt)
	}
	if !slices.Equal(v.GeneratedIDs, goldenGenerated) {
		t.Errorf("generated_ids %v, want %v", v.GeneratedIDs, goldenGenerated)
	}
	if v.Text != goldenText {
		t.Errorf("text %q, want %q", v.Text, goldenText)
	}
	if v.PromptTPS == nil || *v.PromptTPS <= 0 || v.GenerationTPS == nil || *v.GenerationTPS <= 0 || v.StopReason != "length" || v.FinishReason != "length" {
		t.Errorf("speeds %v %v, stop %q, finish %q", v.PromptTPS, v.GenerationTPS, v.StopReason, v.FinishReason)
	}

	// Streaming prints the same text (plus a final newline), stats on stderr.
	r := runCmd(t, "--model", path, "--prompt", "Once upon a time", "-n", "64", "--temperature", "0", "--threads", "2")
	if r.code != 0 || r.stdout != goldenText+"\n" || !strings.Contains(r.stderr, "generated: 64 tokens") {
		t.Errorf("streaming: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}

	// BATON_MODEL stands in for --model.
	t.Setenv(modelfile.EnvModel, path)
	v = decodeRun(t, runCmd(t, "--prompt", "Once upon a time", "-n", "5", "--temperature", "0", "--json"))
	if !slices.Equal(v.GeneratedIDs, goldenGenerated[:5]) {
		t.Errorf("via %s: %v", modelfile.EnvModel, v.GeneratedIDs)
	}
}

func TestRunStopsAndSampling(t *testing.T) {
	path := refdata.Model(t)
	base := []string{"--model", path, "--prompt", "Once upon a time", "--json"}

	// A stop string ends generation; neither it nor anything after is printed.
	v := decodeRun(t, runCmd(t, append(base, "--temperature", "0", "--stop", "Lily", "--stop", "zzz")...))
	if v.Text != ", there was a little girl named " || v.StopReason != "stop" || v.FinishReason != "stop" {
		t.Errorf("stop: text %q, reason %q, finish %q", v.Text, v.StopReason, v.FinishReason)
	}
	// "little girl" spans two tokens (" little" and " girl").
	v = decodeRun(t, runCmd(t, append(base, "--temperature", "0", "--stop", "le gi")...))
	if v.Text != ", there was a litt" || v.StopReason != "stop" {
		t.Errorf("split stop: text %q, reason %q", v.Text, v.StopReason)
	}

	// Sampling with a seed is reproducible, and different seeds differ.
	a := decodeRun(t, runCmd(t, append(base, "--seed", "7", "-n", "40")...))
	b := decodeRun(t, runCmd(t, append(base, "--seed", "7", "-n", "40")...))
	c := decodeRun(t, runCmd(t, append(base, "--seed", "8", "-n", "40")...))
	if !slices.Equal(a.GeneratedIDs, b.GeneratedIDs) || a.Seed != 7 {
		t.Errorf("seed 7 twice: %v vs %v", a.GeneratedIDs, b.GeneratedIDs)
	}
	if slices.Equal(a.GeneratedIDs, c.GeneratedIDs) {
		t.Error("seeds 7 and 8 gave the same 40 tokens")
	}

	// The context window bounds generation: 128 positions, 5 in the prompt.
	v = decodeRun(t, runCmd(t, append(base, "--temperature", "0", "-n", "500")...))
	if len(v.GeneratedIDs) != 123 || v.StopReason != "context" || v.FinishReason != "length" {
		t.Errorf("context: %d tokens, reason %q, finish %q", len(v.GeneratedIDs), v.StopReason, v.FinishReason)
	}
	// -n 0 generates nothing.
	v = decodeRun(t, runCmd(t, append(base, "-n", "0")...))
	if len(v.GeneratedIDs) != 0 || v.Text != "" {
		t.Errorf("-n 0: %v %q", v.GeneratedIDs, v.Text)
	}
}

func TestRunCancelled(t *testing.T) {
	path := refdata.Model(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r := call(ctx, func(ctx context.Context, o, e *bytes.Buffer) int {
		return Run(ctx, o, e, []string{"--model", path, "--prompt", "Hi", "--json"})
	})
	if r.code != exitInterrupted {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
	var v runJSON
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil || v.StopReason != "cancelled" || v.FinishReason != "abort" || len(v.GeneratedIDs) != 0 {
		t.Errorf("stdout %q (%v)", r.stdout, err)
	}
}

// TestFinishReason pins the mapping for every stop reason, eog included,
// which the stories model does not reach within its window under greedy
// decoding.
func TestFinishReason(t *testing.T) {
	for stop, want := range map[string]string{
		"eog": "stop", "stop": "stop", "length": "length", "context": "length", "cancelled": "abort",
	} {
		if got := finishReason(stop); got != want {
			t.Errorf("finishReason(%q) = %q, want %q", stop, got, want)
		}
	}
}

func TestErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.gguf")
	os.WriteFile(bad, []byte("not a gguf file"), 0o644)
	tests := []struct {
		name string
		fn   func(context.Context, *bytes.Buffer, *bytes.Buffer) int
		code int
		text string
	}{
		{"unknown flag", wrap(Run, "--bogus"), 2, "flag provided but not defined: -bogus"},
		{"bad temperature", wrap(Run, "--temperature", "-1", "--model", bad), 2, "temperature = -1"},
		{"bad top-p", wrap(Run, "--top-p", "x"), 2, "not a number"},
		{"bad seed", wrap(Run, "--seed", "-3"), 2, "--seed"},
		{"negative n", wrap(Run, "-n", "-1"), 2, "-n -1"},
		{"positional", wrap(Run, "hello"), 2, "unexpected argument"},
		{"missing model", wrap(Run, "--model", filepath.Join(dir, "nope.gguf"), "--prompt", "x"), 1, "nope.gguf"},
		{"not a gguf", wrap(Run, "--model", bad, "--prompt", "x"), 1, `not "GGUF"`},
		{"tokenize missing model", wrap(Tokenize, "--model", filepath.Join(dir, "nope.gguf")), 1, "nope.gguf"},
		{"gen-model no out", wrap(GenModel, "--preset", "tiny"), 2, "--out FILE is required"},
		{"gen-model preset", wrap(GenModel, "--preset", "huge", "--out", "x"), 2, `--preset "huge": unknown`},
		{"gen-model shape", wrap(GenModel, "--dim", "64", "--out", "x"), 2, "--hidden is required"},
		{"gen-model type", wrap(GenModel, "--preset", "tiny", "--type", "iq2_xxs", "--out", "x"), 2, `--type "iq2_xxs": unknown`},
		{"gen-model k-quant rows", wrap(GenModel, "--preset", "tiny", "--type", "q4_k", "--out", "x"), 2, "multiples of it"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := call(context.Background(), tc.fn)
			if r.code != tc.code || !strings.Contains(r.stderr, tc.text) {
				t.Fatalf("exit %d, stderr %q; want exit %d mentioning %q", r.code, r.stderr, tc.code, tc.text)
			}
			if strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 || strings.Contains(r.stderr, "goroutine") {
				t.Errorf("error is not one line: %q", r.stderr)
			}
		})
	}
	// --help prints the usage and succeeds; the run help documents BOS.
	r := call(context.Background(), wrap(Run, "--help"))
	if r.code != 0 || !strings.Contains(r.stderr, "does not\nstop on BOS") || !strings.Contains(r.stderr, "-temperature") {
		t.Errorf("--help: exit %d, %q", r.code, r.stderr)
	}
}

func wrap(fn func(context.Context, io.Writer, io.Writer, []string) int, args ...string) func(context.Context, *bytes.Buffer, *bytes.Buffer) int {
	return func(ctx context.Context, o, e *bytes.Buffer) int { return fn(ctx, o, e, args) }
}

func TestTokenize(t *testing.T) {
	path := refdata.Model(t)
	tok := func(args ...string) result {
		return call(context.Background(), wrap(Tokenize, append([]string{"--model", path}, args...)...))
	}
	r := tok("--text", "Once upon a time", "--json")
	var v struct {
		IDs    []int32  `json:"ids"`
		Pieces []string `json:"pieces"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil || r.code != 0 {
		t.Fatalf("exit %d, %q: %v", r.code, r.stdout, err)
	}
	if !slices.Equal(v.IDs, goldenPrompt) || !slices.Equal(v.Pieces, []string{"<s>", " Once", " upon", " a", " time"}) {
		t.Errorf("got %v %q", v.IDs, v.Pieces)
	}
	r = tok("--text", "<s>hi", "--no-bos")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "     1 \"<s>\"\n") {
		t.Errorf("parse special: %q", r.stdout)
	}
	r = tok("--text", "<s>hi", "--no-bos", "--no-parse-special")
	if r.code != 0 || strings.Contains(r.stdout, "     1 \"<s>\"") {
		t.Errorf("no parse special: %q", r.stdout)
	}
	r = tok("--text", "", "--no-bos", "--json")
	if r.code != 0 || strings.TrimSpace(r.stdout) != `{"ids":[],"pieces":[]}` {
		t.Errorf("empty: %q", r.stdout)
	}
}

func TestGenModelThenRun(t *testing.T) {
	out := filepath.Join(t.TempDir(), "q8.gguf")
	r := call(context.Background(), wrap(GenModel, "--dim", "64", "--hidden", "128", "--layers", "2", "--heads", "4",
		"--kv-heads", "2", "--vocab", "300", "--type", "q8_0", "--tied", "--seed", "4", "--out", out))
	if r.code != 0 || !strings.Contains(r.stdout, "wrote "+out) {
		t.Fatalf("gen-model: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
	f, err := gguf.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	q, _ := f.Tensor("blk.1.attn_q.weight")
	_, hasOutput := f.Tensor("output.weight")
	kv, _ := f.Uint("llama.attention.head_count_kv")
	f.Close()
	if q == nil || q.Type.String() != "Q8_0" || hasOutput || kv != 2 {
		t.Fatalf("file: attn_q %v, output.weight %v, kv heads %d", q, hasOutput, kv)
	}
	v := decodeRun(t, runCmd(t, "--model", out, "--prompt", "Hello world", "-n", "8", "--temperature", "0", "--json"))
	if len(v.GeneratedIDs) == 0 || v.PromptIDs[0] != 1 {
		t.Errorf("run on the generated model: %+v", v)
	}

	// A preset with overrides.
	out2 := filepath.Join(t.TempDir(), "tiny.gguf")
	r = call(context.Background(), wrap(GenModel, "--preset", "tiny", "--layers", "1", "--type", "bf16", "--out", out2))
	if r.code != 0 || !strings.Contains(r.stdout, "1x64") || !strings.Contains(r.stdout, "BF16") {
		t.Fatalf("preset: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
}
