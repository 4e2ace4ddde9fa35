package tokenizer

import (
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/gguf"
)

// llamaCppDir holds llama.cpp's tokenizer test set (see its README).
const llamaCppDir = "testdata/llamacpp"

// llamaCppCase is one tokenizer test case: the text and the ids llama.cpp
// (and the Hugging Face tokenizer it was checked against) gives for it with
// add_special and parse_special both off.
type llamaCppCase struct {
	text string
	want []int32
}

// readLlamaCppCases reads a case file and its outputs (NAME.gguf.inp and
// NAME.gguf.out, paths relative to llamaCppDir) the way llama.cpp's
// tests/test-tokenizer-0.cpp does: the inputs are separated by
// "\n__ggml_vocab_test__\n" (the file ends with one), and each output line,
// stripped of surrounding white space, holds the ids separated by spaces.
func readLlamaCppCases(t testing.TB, inpPath, outPath string) []llamaCppCase {
	t.Helper()
	name := outPath
	inp, err := os.ReadFile(filepath.Join(llamaCppDir, inpPath))
	if err != nil {
		t.Fatal(err)
	}
	out, err := os.ReadFile(filepath.Join(llamaCppDir, outPath))
	if err != nil {
		t.Fatal(err)
	}
	const sep = "\n__ggml_vocab_test__\n"
	var texts []string
	for rest := string(inp); rest != ""; {
		k := strings.Index(rest, sep)
		if k < 0 {
			texts = append(texts, rest)
			break
		}
		texts = append(texts, rest[:k])
		rest = rest[k+len(sep):]
	}
	lines := strings.Split(string(out), "\n")
	if n := len(lines); n > 0 && lines[n-1] == "" {
		lines = lines[:n-1] // std::getline gives no line after the final newline
	}
	if len(lines) != len(texts) {
		t.Fatalf("%s: %d inputs but %d output lines", name, len(texts), len(lines))
	}
	cases := make([]llamaCppCase, len(texts))
	for i, text := range texts {
		cases[i].text = text
		for _, f := range strings.Fields(lines[i]) {
			id, err := strconv.ParseInt(f, 10, 32)
			if err != nil {
				t.Fatalf("%s.out line %d: %v", name, i+1, err)
			}
			cases[i].want = append(cases[i].want, int32(id))
		}
	}
	return cases
}

// openLlamaCppVocab decompresses and parses testdata/llamacpp/NAME.gguf.gz.
func openLlamaCppVocab(t testing.TB, name string) *gguf.File {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(llamaCppDir, name+".gguf.gz"))
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	data, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	f, err := gguf.Parse(data)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return f
}

// llamaCppVocabs says, for every vocabulary file in llamaCppDir, what this
// package does with it: tokenizes every case exactly as llama.cpp does, or
// refuses it with "unsupported: NAME" (the model or pre-tokenizer it names).
// A vocabulary file that appears in the directory but not here fails the test.
var llamaCppVocabs = map[string]struct {
	model, pre  string // tokenizer.ggml.model and .pre the file carries
	unsupported string // "" when supported
}{
	"ggml-vocab-baichuan":       {model: "llama"},
	"ggml-vocab-bert-bge":       {model: "bert", pre: "bert-bge"},
	"ggml-vocab-deepseek-coder": {model: "gpt2", pre: "deepseek-coder"},
	"ggml-vocab-deepseek-llm":   {model: "gpt2", pre: "deepseek-llm"},
	"ggml-vocab-falcon":         {model: "gpt2", pre: "falcon"},
	"ggml-vocab-gpt-2":          {model: "gpt2", pre: "gpt-2"},
	"ggml-vocab-gpt-neox":       {model: "gpt2"},
	"ggml-vocab-llama-bpe":      {model: "gpt2", pre: "llama-bpe"},
	"ggml-vocab-qwen2":          {model: "gpt2", pre: "qwen2"},
	"ggml-vocab-llama-spm":      {model: "llama", pre: "default"},
	"ggml-vocab-mpt":            {model: "gpt2", pre: "mpt"},
	"ggml-vocab-phi-3":          {model: "llama", pre: "default"},
	"ggml-vocab-refact":         {model: "gpt2", pre: "refact"},
	"ggml-vocab-starcoder":      {model: "gpt2", pre: "starcoder"},
}

// TestLlamaCppVocabs runs llama.cpp's tokenizer test set (its models/
// ggml-vocab-*.gguf with their .inp / .out cases) over every vocabulary:
// a supported one must give llama.cpp's ids for every case, an unsupported
// one must be refused with an error wrapping engine.ErrUnsupported that says
// "unsupported: NAME".
func TestLlamaCppVocabs(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(llamaCppDir, "ggml-vocab-*.gguf.gz"))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, path := range files {
		name := strings.TrimSuffix(filepath.Base(path), ".gguf.gz")
		seen[name] = true
		t.Run(strings.TrimPrefix(name, "ggml-vocab-"), func(t *testing.T) {
			want, listed := llamaCppVocabs[name]
			if !listed {
				t.Fatalf("%s is not in llamaCppVocabs: say whether it is supported", name)
			}
			f := openLlamaCppVocab(t, name)
			if got, _ := f.String(keyModel); got != want.model {
				t.Errorf("%s = %q, want %q", keyModel, got, want.model)
			}
			if got, _ := f.String(keyPre); got != want.pre {
				t.Errorf("%s = %q, want %q", keyPre, got, want.pre)
			}
			tok, err := FromGGUF(f)
			if want.unsupported != "" {
				if err == nil || !errors.Is(err, engine.ErrUnsupported) || !strings.Contains(err.Error(), "unsupported: "+want.unsupported) {
					t.Fatalf("FromGGUF = %v, want an engine.ErrUnsupported error saying %q", err, "unsupported: "+want.unsupported)
				}
				return
			}
			if err != nil {
				t.Fatalf("FromGGUF: %v", err)
			}
			// llama.cpp's own cases (none for baichuan and gpt-neox), and
			// extra.inp with the ids llama.cpp c392e50 gives on this file.
			if _, err := os.Stat(filepath.Join(llamaCppDir, name+".gguf.inp")); err == nil {
				checkLlamaCppCases(t, tok, readLlamaCppCases(t, name+".gguf.inp", name+".gguf.out"))
			}
			checkLlamaCppCases(t, tok, readLlamaCppCases(t, "extra.inp", name+".gguf.extra.out"))
			// Chat markup with parse_special on: control tokens are
			// recognised, and Phi-3's strip the white space after them.
			checkLlamaCppCasesWith(t, tok, readLlamaCppCases(t, "special.inp", name+".gguf.special.out"), EncodeOptions{ParseSpecial: true})
		})
	}
	for name := range llamaCppVocabs {
		if !seen[name] {
			t.Errorf("%s is listed but %s has no %s.gguf.gz", name, llamaCppDir, name)
		}
	}
}

// checkLlamaCppCases encodes every case with add_special and parse_special
// off, as llama.cpp's test does, and reports each mismatch.
func checkLlamaCppCases(t *testing.T, tok *Tokenizer, cases []llamaCppCase) {
	t.Helper()
	checkLlamaCppCasesWith(t, tok, cases, EncodeOptions{})
}

// checkLlamaCppCasesWith is checkLlamaCppCases with other options.
func checkLlamaCppCasesWith(t *testing.T, tok *Tokenizer, cases []llamaCppCase, opts EncodeOptions) {
	t.Helper()
	failed := 0
	for i, c := range cases {
		got := tok.Encode(c.text, opts)
		if !slices.Equal(got, c.want) {
			failed++
			t.Errorf("case %d %q:\n got %v\nwant %v", i, c.text, got, c.want)
		}
	}
	t.Logf("%d/%d cases match llama.cpp", len(cases)-failed, len(cases))
}

// TestLlamaCppRelabelled checks the pre-tokenizers that have no vocabulary
// of their own in llama.cpp's test set: a vocabulary from the set with its
// tokenizer.ggml.pre rewritten, against the ids llama.cpp c392e50 gives for
// the same rewritten file (relabel/BASE@PRE.out for the standard cases,
// .extra.out for extra.inp; recorded by TestMakeOracleOutputs).
func TestLlamaCppRelabelled(t *testing.T) {
	if len(relabelPres) == 0 {
		t.Fatal("no relabelled vocabularies")
	}
	for _, r := range relabelPres {
		t.Run(r.stem(), func(t *testing.T) {
			v, err := VocabFromGGUF(openLlamaCppVocab(t, r.base))
			if err != nil {
				t.Fatal(err)
			}
			if r.pre != "" {
				v.Pre = r.pre
			}
			if r.noSpacePrefix {
				v.AddSpacePrefix = false
			}
			tok, err := New(v)
			if err != nil {
				t.Fatalf("New with pre %q: %v", r.pre, err)
			}
			if r.pre != "" && tok.Pre() != r.pre {
				t.Fatalf("Pre() = %q, want %q", tok.Pre(), r.pre)
			}
			stem := filepath.Join("relabel", r.stem())
			checkLlamaCppCases(t, tok, readLlamaCppCases(t, r.base+".gguf.inp", stem+".out"))
			checkLlamaCppCases(t, tok, readLlamaCppCases(t, "extra.inp", stem+".extra.out"))
		})
	}
}

// TestBERTAddSpecial checks llama.cpp's WPM add_special: [CLS] text [SEP],
// whatever add_bos / add_eos say, and the "▁" word prefix rendered as a
// space by Piece.
func TestBERTAddSpecial(t *testing.T) {
	tok, err := FromGGUF(openLlamaCppVocab(t, "ggml-vocab-bert-bge"))
	if err != nil {
		t.Fatal(err)
	}
	plain := tok.Encode("Hello, world!", EncodeOptions{})
	got := tok.Encode("Hello, world!", EncodeOptions{AddSpecial: true})
	want := append(append([]int32{101}, plain...), 102)
	if !slices.Equal(got, want) {
		t.Fatalf("Encode with AddSpecial = %v, want %v", got, want)
	}
	if tok.SEP() != 102 || tok.BOS() != 101 || tok.UNK() != 100 {
		t.Errorf("BOS/SEP/UNK = %d/%d/%d, want 101/102/100", tok.BOS(), tok.SEP(), tok.UNK())
	}
	var b strings.Builder
	for _, id := range plain {
		b.WriteString(tok.Piece(id))
	}
	if b.String() != " hello , world !" {
		t.Errorf("pieces join to %q, want %q", b.String(), " hello , world !")
	}
}
