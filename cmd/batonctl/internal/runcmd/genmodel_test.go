package runcmd

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/baton-serving/baton/engine/gguf"
	"github.com/baton-serving/baton/engine/model/arch"
	"github.com/baton-serving/baton/engine/testmodel"
	"github.com/baton-serving/baton/engine/tokenizer"
	"github.com/baton-serving/baton/kernels/quant"
)

// TestGenModelArch writes a file of non-llama architectures with --arch,
// --head-dim, --window and --std, checks what the file declares (the
// architecture's keys and tensors, the std of its weights), and runs it.
func TestGenModelArch(t *testing.T) {
	for _, tc := range []struct {
		arch   string
		extra  []string
		tensor string // a tensor only this architecture has
		key    string
		val    uint64 // key's value, when not 0
	}{
		{"qwen2", nil, "blk.1.attn_k.bias", "qwen2.block_count", 0},
		{"qwen3", []string{"--head-dim", "32"}, "blk.0.attn_q_norm.weight", "qwen3.attention.key_length", 32},
		// --window, one flag for the sliding window of every architecture
		// that has one.
		{"gemma2", []string{"--window", "16"}, "blk.0.post_ffw_norm.weight", "gemma2.attention.sliding_window", 16},
		{"phi3", []string{"--window", "16"}, "blk.0.attn_qkv.weight", "phi3.attention.sliding_window", 16},
	} {
		t.Run(tc.arch, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), tc.arch+".gguf")
			args := append([]string{"--preset", "tiny", "--arch", tc.arch, "--std", "0.5", "--out", out}, tc.extra...)
			r := call(context.Background(), wrap(GenModel, args...))
			if r.code != 0 || !strings.Contains(r.stdout, "wrote "+out+": "+tc.arch) {
				t.Fatalf("gen-model: exit %d, %q %q", r.code, r.stdout, r.stderr)
			}
			f, err := gguf.Open(out)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if a, _ := f.String("general.architecture"); a != tc.arch {
				t.Errorf("general.architecture %q", a)
			}
			if _, ok := f.Tensor(tc.tensor); !ok {
				t.Errorf("no %s", tc.tensor)
			}
			if _, ok := f.Get(tc.key); !ok {
				t.Errorf("no %s", tc.key)
			}
			if v, _ := f.Uint(tc.key); tc.val != 0 && v != tc.val {
				t.Errorf("%s = %d, want %d", tc.key, v, tc.val)
			}
			info, _ := f.Tensor("blk.0.ffn_down.weight")
			w := make([]float32, info.NumElements())
			if err := quant.Dequantize(info.Type, f.TensorData(info), w); err != nil {
				t.Fatal(err)
			}
			var sq float64
			for _, v := range w {
				sq += float64(v) * float64(v)
			}
			if std := math.Sqrt(sq / float64(len(w))); math.Abs(std-0.5) > 0.02 {
				t.Errorf("weights std %.4f, want 0.5", std)
			}
			v := decodeRun(t, runCmd(t, "--model", out, "--prompt", "Hello world", "-n", "4", "--temperature", "0", "--json"))
			if len(v.GeneratedIDs) == 0 {
				t.Errorf("run on the generated %s model: %+v", tc.arch, v)
			}
		})
	}
	for _, tc := range []struct {
		args []string
		text string
	}{
		{[]string{"--arch", "gptj"}, `architecture "gptj" is not registered (registered: ` + strings.Join(arch.Names(), ", ") + ")"},
		{[]string{"--std", "-1"}, "std = -1"},
		{[]string{"--head-dim", "7"}, "head dimension 7 is odd"},
		{[]string{"--arch", "gemma2", "--window", "257"}, "window = 257, want [0, context 256]"},
		{[]string{"--arch", "gemma3", "--rope-base", "-5"}, "--rope-base -5: want a number > 0"},
	} {
		r := call(context.Background(), wrap(GenModel, append([]string{"--preset", "tiny", "--out", filepath.Join(t.TempDir(), "x.gguf")}, tc.args...)...))
		if r.code != 2 || !strings.Contains(r.stderr, tc.text) {
			t.Errorf("%v: exit %d, stderr %q; want 2 mentioning %q", tc.args, r.code, r.stderr, tc.text)
		}
	}
}

// llamacppVocab decompresses one of llama.cpp's vocabulary files from
// engine/tokenizer's testdata into a temporary directory.
func llamacppVocab(t *testing.T, name string) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "..", "..", "engine", "tokenizer", "testdata", "llamacpp", "ggml-vocab-"+name+".gguf.gz"))
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	data, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "ggml-vocab-"+name+".gguf")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestGenModelVocabFrom writes tiny presets with llama.cpp's vocabularies
// (SentencePiece and BPE), and a family chat template, and runs them in
// Baton: the file's vocabulary is the source's (size, tokens: the prompt
// tokenizes as the source vocabulary does), and it generates.
func TestGenModelVocabFrom(t *testing.T) {
	for _, tc := range []struct {
		vocab, preset, typ, template string
		tokens                       int
	}{
		{"llama-spm", "tiny-llama", "f32", "", 32000},
		{"phi-3", "tiny-phi3", "q8_0", "phi3.jinja", 32064},
		{"qwen2", "tiny-qwen2", "q8_0", "qwen25.jinja", 151936},
	} {
		t.Run(tc.vocab, func(t *testing.T) {
			src := llamacppVocab(t, tc.vocab)
			out := filepath.Join(t.TempDir(), tc.preset+".gguf")
			args := []string{"--preset", tc.preset, "--vocab-from", src, "--type", tc.typ, "--out", out}
			var tmpl []byte
			if tc.template != "" {
				p := filepath.Join("..", "..", "..", "..", "router-svc", "internal", "openai", "testdata", "templates", tc.template)
				var err error
				if tmpl, err = os.ReadFile(p); err != nil {
					t.Fatal(err)
				}
				args = append(args, "--chat-template", p)
			}
			r := call(context.Background(), wrap(GenModel, args...))
			if r.code != 0 || !strings.Contains(r.stdout, fmt.Sprintf("vocab %d)", tc.tokens)) {
				t.Fatalf("gen-model: exit %d, %q %q", r.code, r.stdout, r.stderr)
			}
			f, err := gguf.Open(out)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			g, err := gguf.Open(src)
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			if ct, _ := f.String("tokenizer.chat_template"); tc.template != "" && ct != string(tmpl) {
				t.Errorf("tokenizer.chat_template is not %s", tc.template)
			}
			want, err := tokenizer.FromGGUF(g)
			if err != nil {
				t.Fatal(err)
			}
			const prompt = "Hello world, 3.14 ünïcode!"
			v := decodeRun(t, runCmd(t, "--model", out, "--prompt", prompt, "-n", "4", "--temperature", "0", "--json"))
			if ids := want.Encode(prompt, tokenizer.EncodeOptions{AddSpecial: true}); !slices.Equal(v.PromptIDs, ids) || len(v.GeneratedIDs) == 0 {
				t.Errorf("run: prompt ids %v, want the source vocabulary's %v; generated %v", v.PromptIDs, ids, v.GeneratedIDs)
			}
		})
	}
}

// TestGenModelBadVocab: each bad --vocab-from / --chat-template input is
// refused before anything is written, naming the flag.
func TestGenModelBadVocab(t *testing.T) {
	dir := t.TempDir()
	text := filepath.Join(dir, "notes.txt")
	os.WriteFile(text, []byte("not a GGUF\n"), 0o644)
	empty := filepath.Join(dir, "empty.jinja")
	os.WriteFile(empty, []byte(" \n"), 0o644)
	noTok := filepath.Join(dir, "weights-only.gguf")
	w := gguf.NewWriter()
	w.AddKV("general.architecture", "llama")
	if err := w.WriteFile(noTok); err != nil {
		t.Fatal(err)
	}
	spm := llamacppVocab(t, "llama-spm")
	for _, tc := range []struct {
		args []string
		text string
	}{
		{[]string{"--vocab-from", text}, "--vocab-from " + text + ": testmodel: reading the vocabulary of " + text},
		{[]string{"--vocab-from", filepath.Join(dir, "absent.gguf")}, "no such file"},
		{[]string{"--vocab-from", noTok}, "--vocab-from " + noTok + ": testmodel: " + noTok + " has no tokenizer (tokenizer.ggml.model is missing"},
		{[]string{"--vocab-from", spm, "--vocab", "1000"}, "--vocab and --vocab-from conflict"},
		{[]string{"--vocab-from", ""}, "--vocab-from: empty file name"},
		{[]string{"--chat-template", filepath.Join(dir, "absent.jinja")}, "--chat-template: open"},
		{[]string{"--chat-template", empty}, "--chat-template " + empty + ": the file is empty"},
		{[]string{"--norm-eps", "-1"}, "--norm-eps -1: want a number > 0"},
		{[]string{"--preset", "tiny-qwen2", "--type", "q4_k", "--dim", "96"}, "Q4_K stores rows in blocks of 256"},
		{[]string{"--preset", "gpt5"}, `--preset "gpt5": unknown`},
		{[]string{"--type", "q9_9"}, `--type "q9_9": unknown (supported: ` + typeNames() + ")"},
	} {
		out := filepath.Join(dir, "x.gguf")
		args := append([]string{"--preset", "tiny", "--out", out}, tc.args...)
		r := call(context.Background(), wrap(GenModel, args...))
		if r.code != 2 || !strings.Contains(r.stderr, tc.text) {
			t.Errorf("%v: exit %d, stderr %q; want 2 mentioning %q", tc.args, r.code, r.stderr, tc.text)
		}
		if _, err := os.Stat(out); err == nil {
			t.Errorf("%v: wrote %s", tc.args, out)
		}
	}
}

// TestGenModelHelp: --help lists every preset on a line of its own with its
// description, and every supported type with its block size.
func TestGenModelHelp(t *testing.T) {
	r := call(context.Background(), wrap(GenModel, "--help"))
	if r.code != 0 {
		t.Fatalf("exit %d", r.code)
	}
	for _, p := range testmodel.PresetInfos() {
		if !strings.Contains(r.stderr, fmt.Sprintf("\n  %-15s [%s] %s\n", p.Name, p.Spec.Type, p.Doc)) {
			t.Errorf("help has no line for preset %s", p.Name)
		}
	}
	for _, typ := range quant.SupportedTypes() {
		if !strings.Contains(r.stderr, fmt.Sprintf("%s %d", typ, typ.BlockSize())) {
			t.Errorf("help does not give %s's block size", typ)
		}
	}
	for _, flag := range []string{"-vocab-from", "-chat-template", "-rope-base", "-norm-eps"} {
		if !strings.Contains(r.stderr, "\n  "+flag+" ") {
			t.Errorf("help lists no %s", flag)
		}
	}
}
