package testmodel

import (
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/gguf"
	"github.com/baton-serving/baton/engine/model/arch"
	"github.com/baton-serving/baton/kernels/quant"
)

// layoutOnly writes s's header and tensor layout, its data left as holes
// (a sparse file, however big the model), and opens it.
func layoutOnly(t *testing.T, s Spec) *gguf.File {
	t.Helper()
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	a, err := s.Architecture()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "layout.gguf")
	out, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := writeLayout(out, s, a, s.tensors(a)); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// TestRealPresets: each real-model preset's file declares the published
// shape (config.json values, as llama.cpp's converter writes them), as
// engine/model reads it back; the parameter counts are the models'
// published ones where they are known exactly (Hugging Face's count, norms
// included; Llama 3.2's rope_freqs is a converter addition).
func TestRealPresets(t *testing.T) {
	type want struct {
		arch                                      string
		dim, hidden, layers, heads, kv, hd, vocab int
		ctx, window                               int
		ropeBase, eps                             float32
		tied                                      bool
		params                                    int64 // 0: not checked
		extraTensor                               string
	}
	for name, w := range map[string]want{
		"tinyllama-1.1b": {"llama", 2048, 5632, 22, 32, 4, 64, 32000, 2048, 0, 10000, 1e-5, false, 1_100_048_384, ""},
		"llama3.2-1b":    {"llama", 2048, 8192, 16, 32, 8, 64, 128256, 131072, 0, 500000, 1e-5, true, 1_235_814_400 + 32, "rope_freqs.weight"},
		"qwen2.5-0.5b":   {"qwen2", 896, 4864, 24, 14, 2, 64, 151936, 32768, 0, 1e6, 1e-6, true, 494_032_768, "blk.23.attn_q.bias"},
		"qwen3-0.6b":     {"qwen3", 1024, 3072, 28, 16, 8, 128, 151936, 40960, 0, 1e6, 1e-6, true, 0, "blk.27.attn_k_norm.weight"},
		"phi3-mini":      {"phi3", 3072, 8192, 32, 32, 32, 96, 32064, 4096, 2047, 10000, 1e-5, false, 0, "blk.31.attn_qkv.weight"},
		"gemma2-2b":      {"gemma2", 2304, 9216, 26, 8, 4, 256, 256000, 8192, 4096, 10000, 1e-6, true, 0, "blk.25.post_ffw_norm.weight"},
		"gemma3-1b":      {"gemma3", 1152, 6912, 26, 4, 1, 256, 262144, 32768, 512, 1e6, 1e-6, true, 0, "blk.25.attn_q_norm.weight"},
	} {
		t.Run(name, func(t *testing.T) {
			s, ok := Preset(name)
			if !ok {
				t.Fatalf("no preset %s", name)
			}
			// A plain token list of the preset's size: the synthetic
			// vocabulary of 262144 pieces takes seconds to make, and is
			// not what this test is about.
			s = s.WithTokenizer(plainTokenizer(t, s.Vocab))
			if s.Vocab != w.vocab {
				t.Fatalf("vocab %d", s.Vocab)
			}
			f := layoutOnly(t, s)
			a, _ := arch.Lookup(w.arch)
			if got, _ := f.String("general.architecture"); got != w.arch {
				t.Fatalf("architecture %q, want %q", got, w.arch)
			}
			c, err := arch.ReadConfig(f, a)
			if err != nil {
				t.Fatal(err)
			}
			got := want{c.Architecture, c.Dim, c.Hidden, c.Layers, c.Heads, c.KVHeads, c.HeadDim, c.Vocab,
				c.TrainContextLength, c.SlidingWindow, c.RopeBase, c.NormEps, c.TiedOutput, w.params, w.extraTensor}
			if got != w {
				t.Errorf("read back %+v\nwant        %+v", got, w)
			}
			if _, ok := f.Tensor(w.extraTensor); w.extraTensor != "" && !ok {
				t.Errorf("no %s", w.extraTensor)
			}
			if w.params != 0 && s.Params() != w.params {
				t.Errorf("%d parameters, want %d", s.Params(), w.params)
			}
			if info, _ := f.Tensor("token_embd.weight"); info == nil || info.Type != quant.Q8_0 || info.Dims[1] != uint64(w.vocab) {
				t.Errorf("token_embd.weight %+v, want Q8_0 with %d rows", info, w.vocab)
			}
		})
	}
}

// plainTokenizer is a vocabulary of n tokens "t0", "t1", ….
func plainTokenizer(t *testing.T, n int) *Tokenizer {
	t.Helper()
	tokens := make([]string, n)
	for i := range tokens {
		tokens[i] = "t" + strconv.Itoa(i)
	}
	w := gguf.NewWriter()
	if err := errors.Join(w.AddKV("tokenizer.ggml.model", "gpt2"), w.AddKV("tokenizer.ggml.tokens", tokens)); err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if _, err := w.WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Parse(b.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	tok, err := TokenizerFromGGUF(f, "plain")
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestLlama3RopeFactors checks rope_freqs.weight for Llama 3.2's scaling
// (factor 32, low 1, high 4, original context 8192) at base 500000 and
// head width 64, worked out by hand: pair i's wavelength is
// 2π·500000^(i/32), below 8192/4 = 2048 up to pair 14 (factor 1), above
// 8192 from pair 18 (factor 32); pair 16's 4441.6 gives
// t = (8192/4441.6 − 1)/3 = 0.2815 and 1/((1−t)/32 + t) = 3.290.
func TestLlama3RopeFactors(t *testing.T) {
	f := llama3Rope.Factors(64, 500000)
	if len(f) != 32 {
		t.Fatalf("%d factors", len(f))
	}
	for i, v := range f {
		switch {
		case i <= 14 && v != 1, i >= 18 && v != 32:
			t.Errorf("factor %d = %v", i, v)
		case i > 0 && v < f[i-1]:
			t.Errorf("factor %d = %v is below factor %d = %v", i, v, i-1, f[i-1])
		}
	}
	if math.Abs(float64(f[16])-3.290) > 0.005 {
		t.Errorf("factor 16 = %v, want 3.290", f[16])
	}
	// The file carries exactly these values.
	s, _ := Preset("tiny-llama3")
	path := filepath.Join(t.TempDir(), "l3.gguf")
	if err := Write(path, s); err != nil {
		t.Fatal(err)
	}
	g, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	info, ok := g.Tensor("rope_freqs.weight")
	if !ok || info.Type != quant.F32 {
		t.Fatalf("rope_freqs.weight: %+v", info)
	}
	vals := make([]float32, info.NumElements())
	if err := quant.Dequantize(info.Type, g.TensorData(info), vals); err != nil {
		t.Fatal(err)
	}
	want := llama3Rope.Factors(64, 500000)
	for i := range want {
		if vals[i] != want[i] {
			t.Fatalf("rope_freqs.weight[%d] = %v, want %v", i, vals[i], want[i])
		}
	}
	s.Arch = "qwen2"
	if err := s.Validate(); !errors.Is(err, engine.ErrInvalidInput) || !strings.Contains(err.Error(), "qwen2 has no rope_freqs.weight") {
		t.Errorf("llama3 rope on qwen2: %v", err)
	}
	s.Arch, s.Llama3Rope.HighFreqFactor = "llama", 0.5
	if err := s.Validate(); !errors.Is(err, engine.ErrInvalidInput) || !strings.Contains(err.Error(), "low < high") {
		t.Errorf("bad llama3 rope: %v", err)
	}
}

// vocabFile decompresses one of llama.cpp's vocabulary files from
// engine/tokenizer's testdata.
func vocabFile(t testing.TB, name string) string {
	t.Helper()
	in, err := os.Open(filepath.Join("..", "tokenizer", "testdata", "llamacpp", "ggml-vocab-"+name+".gguf.gz"))
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	zr, err := gzip.NewReader(in)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "ggml-vocab-"+name+".gguf")
	out, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, zr); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestTokenizerCopy: a file written with a copied vocabulary holds every
// tokenizer.* entry of the source unchanged (llama.cpp's qwen2, llama-bpe,
// phi-3 and llama-spm vocabularies), its vocabulary size and embedding rows
// are the source's token count, and a ChatTemplate replaces the copied
// template.
func TestTokenizerCopy(t *testing.T) {
	for _, tc := range []struct {
		vocab, preset, model, pre string
		tokens                    int
	}{
		{"qwen2", "tiny-qwen2", "gpt2", "qwen2", 151936},
		{"llama-bpe", "tiny-llama3", "gpt2", "llama-bpe", 128256},
		{"phi-3", "tiny-phi3", "llama", "default", 32064},
		{"llama-spm", "tiny-llama", "llama", "default", 32000},
	} {
		t.Run(tc.vocab, func(t *testing.T) {
			src := vocabFile(t, tc.vocab)
			tok, err := ReadTokenizer(src)
			if err != nil {
				t.Fatal(err)
			}
			if tok.Len() != tc.tokens || tok.Model() != tc.model || tok.Pre() != tc.pre {
				t.Fatalf("%d tokens, model %q, pre %q", tok.Len(), tok.Model(), tok.Pre())
			}
			s, _ := Preset(tc.preset)
			s = s.WithTokenizer(tok)
			if tc.vocab == "phi-3" {
				s.ChatTemplate = "{{ messages[0]['content'] }}"
			}
			f := layoutOnly(t, s)
			g, err := gguf.Open(src)
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			n := 0
			for _, kv := range g.KVs {
				if !strings.HasPrefix(kv.Key, "tokenizer.") {
					continue
				}
				n++
				got, ok := f.Get(kv.Key)
				switch {
				case kv.Key == "tokenizer.chat_template" && s.ChatTemplate != "":
					if v, _ := got.AsString(); v != s.ChatTemplate {
						t.Errorf("chat template %q, want the ChatTemplate", v)
					}
				case !ok || !got.Equal(kv.Value):
					t.Errorf("%s differs from the source's (present: %v)", kv.Key, ok)
				}
			}
			if n < 4 {
				t.Errorf("only %d tokenizer entries in the source", n)
			}
			if tc.vocab == "phi-3" {
				if _, ok := g.Get("tokenizer.chat_template"); !ok {
					t.Error("the phi-3 vocabulary has no chat template to replace")
				}
			}
			a, _ := s.Architecture()
			c, err := arch.ReadConfig(f, a)
			if err != nil {
				t.Fatal(err)
			}
			info, _ := f.Tensor("token_embd.weight")
			if c.Vocab != tc.tokens || info.Dims[1] != uint64(tc.tokens) {
				t.Errorf("vocabulary %d, embedding rows %d; want %d", c.Vocab, info.Dims[1], tc.tokens)
			}
			s.Vocab++
			if err := s.Validate(); !errors.Is(err, engine.ErrInvalidInput) || !strings.Contains(err.Error(), "has 32064 tokens") && tc.vocab == "phi-3" {
				t.Errorf("vocab beside the tokenizer's: %v", err)
			}
		})
	}
}

// TestTokenizerCopyErrors: a file that is not a GGUF, and a GGUF without a
// vocabulary, are refused clearly.
func TestTokenizerCopyErrors(t *testing.T) {
	dir := t.TempDir()
	text := filepath.Join(dir, "notes.txt")
	os.WriteFile(text, []byte("not a model\n"), 0o644)
	_, err := ReadTokenizer(text)
	if !errors.Is(err, engine.ErrInvalidInput) || !strings.Contains(err.Error(), "reading the vocabulary of "+text) {
		t.Errorf("text file: %v", err)
	}
	_, err = ReadTokenizer(filepath.Join(dir, "absent.gguf"))
	if !errors.Is(err, engine.ErrInvalidInput) || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
	for _, tc := range []struct {
		name string
		kvs  map[string]any
		text string
	}{
		{"no tokenizer", map[string]any{"general.architecture": "llama"}, "tokenizer.ggml.model is missing"},
		{"no tokens", map[string]any{"tokenizer.ggml.model": "gpt2"}, "tokenizer.ggml.tokens is missing"},
		{"number tokens", map[string]any{"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": []int32{1, 2}}, "not an array of strings"},
	} {
		w := gguf.NewWriter()
		for k, v := range tc.kvs {
			if err := w.AddKV(k, v); err != nil {
				t.Fatal(err)
			}
		}
		path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-")+".gguf")
		if err := w.WriteFile(path); err != nil {
			t.Fatal(err)
		}
		_, err := ReadTokenizer(path)
		if !errors.Is(err, errNoTokenizer) || !errors.Is(err, engine.ErrInvalidInput) || !strings.Contains(err.Error(), tc.text) || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}

// TestTinyPresets: every tiny-ARCH preset writes and has rows of 256, so
// that every type stores it, and a std that is not gen-model's 0.02.
func TestTinyPresets(t *testing.T) {
	seen := map[string]bool{}
	for _, p := range PresetInfos() {
		if !strings.HasPrefix(p.Name, "tiny-") {
			continue
		}
		seen[p.Spec.ArchName()] = true
		if p.Spec.Dim%256 != 0 || p.Spec.Hidden%256 != 0 || p.Spec.Std < 0.1 || p.Doc == "" || strings.Contains(p.Doc, "\n") {
			t.Errorf("%s: %+v %q", p.Name, p.Spec, p.Doc)
		}
		if err := Write(filepath.Join(t.TempDir(), p.Name+".gguf"), p.Spec); err != nil {
			t.Errorf("%s: %v", p.Name, err)
		}
	}
	for _, name := range arch.Names() {
		if !seen[name] {
			t.Errorf("no tiny preset of architecture %s", name)
		}
	}
}
