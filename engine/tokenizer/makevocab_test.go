package tokenizer

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/baton-serving/baton/engine/gguf"
)

// The llama-bpe and qwen2 vocabulary files of llama.cpp's test set are not
// in its repository snapshots (only their .inp / .out cases are), so they
// are rebuilt here from the original tokenizers, the way llama.cpp's
// convert_hf_to_gguf.py does (get_vocab_base: one token per id, added
// tokens that are special become control tokens, ids the tokenizer leaves
// unused become "[PAD<id>]" tokens of type unused; merges in rank order).
// The helpers run only when asked, and write testdata/llamacpp:
//
//	BATON_MAKE_VOCAB_LLAMA3=DIR  DIR/tokenizer.model (Meta's tiktoken ranks)
//	BATON_MAKE_VOCAB_QWEN2=DIR   DIR/vocab.json, merges.txt, added_tokens.json, config.json
//
//	go test ./tokenizer -run TestMakeVocab -v
//
// testdata/llamacpp/README.md names the sources used.

// TestMakeVocabLlama3 builds ggml-vocab-llama-bpe.gguf from Meta's tiktoken
// file. Ranks are ids; the merges are what Hugging Face's TikTokenConverter
// derives from them (every split of a token into two tokens, ordered by the
// merged token's rank, then by the ranks of the two halves), which is how
// Meta-Llama-3's tokenizer.json was made.
func TestMakeVocabLlama3(t *testing.T) {
	dir := os.Getenv("BATON_MAKE_VOCAB_LLAMA3")
	if dir == "" {
		t.Skip("BATON_MAKE_VOCAB_LLAMA3 not set")
	}
	f, err := os.Open(filepath.Join(dir, "tokenizer.model"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var ranked [][]byte
	rank := map[string]int{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		b64, r, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			t.Fatalf("tokenizer.model line %q", sc.Text())
		}
		tok, err := base64.StdEncoding.DecodeString(b64)
		if err != nil {
			t.Fatal(err)
		}
		n, err := strconv.Atoi(r)
		if err != nil || n != len(ranked) {
			t.Fatalf("tokenizer.model: rank %q out of order at line %d", r, len(ranked)+1)
		}
		ranked = append(ranked, tok)
		rank[string(tok)] = n
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}

	enc := func(b []byte) string { return string(byteEncode(nil, string(b))) }
	tokens := make([]string, 0, len(ranked)+256)
	types := make([]int32, 0, len(ranked)+256)
	var merges []string
	for _, tok := range ranked {
		tokens = append(tokens, enc(tok))
		types = append(types, int32(TypeNormal))
		var local [][2][]byte
		for i := 1; i < len(tok); i++ {
			l, r := tok[:i], tok[i:]
			_, okL := rank[string(l)]
			_, okR := rank[string(r)]
			if okL && okR {
				local = append(local, [2][]byte{l, r})
			}
		}
		slices.SortStableFunc(local, func(a, b [2][]byte) int {
			if d := rank[string(a[0])] - rank[string(b[0])]; d != 0 {
				return d
			}
			return rank[string(a[1])] - rank[string(b[1])]
		})
		for _, m := range local {
			merges = append(merges, enc(m[0])+" "+enc(m[1]))
		}
	}
	// Llama 3's 256 special tokens (the names of Llama 3.2's tokenizer.py,
	// which the jcolano/llama31_synthetic_data copy carries).
	specials := []string{
		"<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
		"<|finetune_right_pad_id|>", "<|step_id|>", "<|start_header_id|>", "<|end_header_id|>",
		"<|eom_id|>", "<|eot_id|>", "<|python_tag|>",
	}
	for i := 0; len(specials) < 256; i++ {
		specials = append(specials, fmt.Sprintf("<|reserved_special_token_%d|>", 2+i))
	}
	for _, s := range specials {
		tokens = append(tokens, s)
		types = append(types, int32(TypeControl))
	}
	writeVocab(t, "ggml-vocab-llama-bpe", []any{
		"general.architecture", "llama",
		"general.name", "Llama 3 tokenizer (Meta tiktoken ranks)",
		keyModel, ModelGPT2,
		keyPre, "llama-bpe",
		keyTokens, tokens,
		keyTokenType, types,
		keyMerges, merges,
		keyBOS, uint32(128000),
		keyEOS, uint32(128001),
	})
}

// TestMakeVocabQwen2 builds ggml-vocab-qwen2.gguf from a Qwen2 tokenizer's
// vocab.json, merges.txt and added_tokens.json, padded to config.json's
// vocab_size as convert_hf_to_gguf.py pads it.
func TestMakeVocabQwen2(t *testing.T) {
	dir := os.Getenv("BATON_MAKE_VOCAB_QWEN2")
	if dir == "" {
		t.Skip("BATON_MAKE_VOCAB_QWEN2 not set")
	}
	readJSON := func(name string, v any) {
		raw, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(raw, v); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	var vocab, added map[string]int
	var config struct {
		VocabSize  int `json:"vocab_size"`
		BOSTokenID int `json:"bos_token_id"`
		EOSTokenID int `json:"eos_token_id"`
	}
	readJSON("vocab.json", &vocab)
	readJSON("added_tokens.json", &added)
	readJSON("config.json", &config)

	tokens := make([]string, config.VocabSize)
	types := make([]int32, config.VocabSize)
	for text, id := range vocab {
		tokens[id], types[id] = text, int32(TypeNormal)
	}
	for text, id := range added {
		// All of Qwen2's added tokens are marked special in its
		// tokenizer_config.json, so they are control tokens.
		tokens[id], types[id] = text, int32(TypeControl)
	}
	for id := range tokens {
		if tokens[id] == "" {
			tokens[id], types[id] = fmt.Sprintf("[PAD%d]", id), int32(TypeUnused)
		}
	}

	raw, err := os.ReadFile(filepath.Join(dir, "merges.txt"))
	if err != nil {
		t.Fatal(err)
	}
	var merges []string
	// The copy used has CRLF line ends; like gguf-py's merges.txt reader,
	// strip each line and skip the "#version" header and blank lines.
	for i, line := range strings.Split(string(raw), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || (i == 0 && strings.HasPrefix(line, "#version")) {
			continue
		}
		merges = append(merges, line)
	}
	writeVocab(t, "ggml-vocab-qwen2", []any{
		"general.architecture", "qwen2",
		"general.name", "Qwen2 tokenizer",
		keyModel, ModelGPT2,
		keyPre, "qwen2",
		keyTokens, tokens,
		keyTokenType, types,
		keyMerges, merges,
		keyBOS, uint32(config.BOSTokenID),
		keyEOS, uint32(config.EOSTokenID),
		keyPAD, uint32(added["<|endoftext|>"]),
		keyAddBOS, false,
	})
}

// writeVocab writes the metadata kvs as testdata/llamacpp/NAME.gguf.gz.
func writeVocab(t *testing.T, name string, kvs []any) {
	t.Helper()
	w := gguf.NewWriter()
	for i := 0; i < len(kvs); i += 2 {
		if err := w.AddKV(kvs[i].(string), kvs[i+1]); err != nil {
			t.Fatal(err)
		}
	}
	var raw, gz bytes.Buffer
	if _, err := w.WriteTo(&raw); err != nil {
		t.Fatal(err)
	}
	zw, err := gzip.NewWriterLevel(&gz, gzip.BestCompression)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := zw.Write(raw.Bytes()); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(llamaCppDir, name+".gguf.gz")
	if err := os.WriteFile(path, gz.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s: %d bytes (%d uncompressed)", path, gz.Len(), raw.Len())
}

// relabelPres are the pre-tokenizers checked on another vocabulary (with
// tokenizer.ggml.pre rewritten) because llama.cpp's test set has no
// vocabulary of their own: every name this package implements that llama.cpp
// c392e50 accepts. gpt-2's byte-level vocabulary tokenizes any text, so the
// ids show where each pre-tokenizer cuts.
var relabelPres = []relabel{
	{base: "ggml-vocab-gpt-2", pre: "default"}, {base: "ggml-vocab-gpt-2", pre: "gpt-2"}, {base: "ggml-vocab-gpt-2", pre: "phi-2"},
	{base: "ggml-vocab-gpt-2", pre: "olmo"}, {base: "ggml-vocab-gpt-2", pre: "jais"}, {base: "ggml-vocab-gpt-2", pre: "jina-es"},
	{base: "ggml-vocab-gpt-2", pre: "jina-de"}, {base: "ggml-vocab-gpt-2", pre: "jina-v1-en"}, {base: "ggml-vocab-gpt-2", pre: "gigachat"},
	{base: "ggml-vocab-gpt-2", pre: "roberta-bpe"}, {base: "ggml-vocab-gpt-2", pre: "dbrx"}, {base: "ggml-vocab-gpt-2", pre: "smaug-bpe"},
	{base: "ggml-vocab-gpt-2", pre: "chatglm-bpe"}, {base: "ggml-vocab-gpt-2", pre: "stablelm2"}, {base: "ggml-vocab-gpt-2", pre: "megrez"},
	{base: "ggml-vocab-gpt-2", pre: "smollm"}, {base: "ggml-vocab-gpt-2", pre: "command-r"}, {base: "ggml-vocab-gpt-2", pre: "codeshell"},
	{base: "ggml-vocab-gpt-2", pre: "exaone"}, {base: "ggml-vocab-gpt-2", pre: "minerva-7b"}, {base: "ggml-vocab-gpt-2", pre: "bloom"},
	{base: "ggml-vocab-gpt-2", pre: "gpt3-finnish"}, {base: "ggml-vocab-gpt-2", pre: "poro-chat"}, {base: "ggml-vocab-gpt-2", pre: "viking"},
	{base: "ggml-vocab-gpt-2", pre: "chameleon"}, {base: "ggml-vocab-gpt-2", pre: "tekken"}, {base: "ggml-vocab-gpt-2", pre: "falcon"},
	{base: "ggml-vocab-gpt-2", pre: "deepseek-llm"}, {base: "ggml-vocab-gpt-2", pre: "deepseek-coder"}, {base: "ggml-vocab-gpt-2", pre: "qwen2"},
	{base: "ggml-vocab-gpt-2", pre: "llama-bpe"},
	{base: "ggml-vocab-llama-bpe", pre: "llama3"}, {base: "ggml-vocab-llama-bpe", pre: "llama-v3"}, {base: "ggml-vocab-llama-bpe", pre: "falcon3"},
	{base: "ggml-vocab-qwen2", pre: "deepseek-r1-qwen"},
	// Gemma's SentencePiece vocabularies are "llama" ones with
	// add_space_prefix false: the flag on llama.cpp's two SPM vocabularies.
	{base: "ggml-vocab-llama-spm", name: "no-space-prefix", noSpacePrefix: true},
	{base: "ggml-vocab-phi-3", name: "no-space-prefix", noSpacePrefix: true},
}

// relabel is a test vocabulary with tokenizer.ggml.pre set to pre (when not
// ""), or with tokenizer.ggml.add_space_prefix false (noSpacePrefix).
type relabel struct {
	base, pre     string
	name          string // names the variant when pre does not
	noSpacePrefix bool
}

// stem is the variant's file name stem under relabel/.
func (r relabel) stem() string {
	n := r.name
	if n == "" {
		n = r.pre
	}
	return strings.TrimPrefix(r.base, "ggml-vocab-") + "@" + n
}

// TestMakeOracleOutputs records llama.cpp's ids for extra.inp (and, with
// parse_special on, special.inp) on every vocabulary, and for both case
// files on the relabelled vocabularies, with
// the oracle in testdata/llamacpp/oracle (tok.cpp, built against llama.cpp
// c392e50; see the README):
//
//	BATON_LLAMACPP_TOK=/path/to/tok go test ./tokenizer -run TestMakeOracleOutputs -v
func TestMakeOracleOutputs(t *testing.T) {
	tool := os.Getenv("BATON_LLAMACPP_TOK")
	if tool == "" {
		t.Skip("BATON_LLAMACPP_TOK not set")
	}
	tmp := t.TempDir()
	run := func(vocab, inp, out string, args ...string) {
		cmd := exec.Command(tool, append([]string{vocab, inp}, args...)...)
		cmd.Stderr = os.Stderr
		ids, err := cmd.Output()
		if err != nil {
			t.Fatalf("%s %s %s: %v", tool, vocab, inp, err)
		}
		if err := os.WriteFile(out, ids, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	extra := filepath.Join(llamaCppDir, "extra.inp")
	cases := filepath.Join(llamaCppDir, "ggml-vocab-gpt-2.gguf.inp")
	files, _ := filepath.Glob(filepath.Join(llamaCppDir, "ggml-vocab-*.gguf.gz"))
	for _, gz := range files {
		name := strings.TrimSuffix(filepath.Base(gz), ".gguf.gz")
		if llamaCppVocabs[name].unsupported != "" {
			continue
		}
		path := filepath.Join(tmp, name+".gguf")
		writeRelabelled(t, relabel{base: name}, path)
		run(path, extra, filepath.Join(llamaCppDir, name+".gguf.extra.out"))
		run(path, filepath.Join(llamaCppDir, "special.inp"), filepath.Join(llamaCppDir, name+".gguf.special.out"), "special")
	}
	if err := os.MkdirAll(filepath.Join(llamaCppDir, "relabel"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, r := range relabelPres {
		path := filepath.Join(tmp, r.stem()+".gguf")
		writeRelabelled(t, r, path)
		stem := filepath.Join(llamaCppDir, "relabel", r.stem())
		run(path, cases, stem+".out")
		run(path, extra, stem+".extra.out")
	}
}

// writeRelabelled writes testdata/llamacpp/BASE.gguf.gz uncompressed to
// path, changed as r says.
func writeRelabelled(t *testing.T, r relabel, path string) {
	t.Helper()
	f := openLlamaCppVocab(t, r.base)
	set := map[string]any{}
	if r.pre != "" {
		set[keyPre] = r.pre
	}
	if r.noSpacePrefix {
		set[keyAddSpacePrefix] = false
	}
	w := gguf.NewWriter()
	for _, kv := range f.KVs {
		v := any(kv.Value)
		if nv, ok := set[kv.Key]; ok {
			v = nv
			delete(set, kv.Key)
		}
		if err := w.AddKV(kv.Key, v); err != nil {
			t.Fatal(err)
		}
	}
	for k, v := range set {
		if err := w.AddKV(k, v); err != nil {
			t.Fatal(err)
		}
	}
	for i := range f.Tensors {
		ti := &f.Tensors[i]
		if err := w.AddTensor(ti.Name, ti.Type, ti.Dims, f.TensorData(ti)); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.WriteFile(path); err != nil {
		t.Fatal(err)
	}
}
