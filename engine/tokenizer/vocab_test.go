package tokenizer

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/gguf"
)

func TestNewValidates(t *testing.T) {
	base := func() Vocab {
		v := DefaultVocab(ModelLlama, "")
		v.Tokens = []string{"<unk>", "<s>", "</s>", "a"}
		v.Scores = []float32{0, 0, 0, -1}
		v.Types = []TokenType{TypeUnknown, TypeControl, TypeControl, TypeNormal}
		return v
	}
	tests := []struct {
		name    string
		edit    func(*Vocab)
		wantErr error
		wantMsg string
	}{
		{"empty", func(v *Vocab) { v.Tokens, v.Scores, v.Types = nil, nil, nil }, engine.ErrInvalidInput, "Vocab.Tokens is empty"},
		{"scores", func(v *Vocab) { v.Scores = v.Scores[:3] }, engine.ErrInvalidInput, "Vocab.Scores has 3 entries"},
		{"types", func(v *Vocab) { v.Types = append(v.Types, TypeNormal) }, engine.ErrInvalidInput, "Vocab.Types has 5 entries"},
		{"BOS", func(v *Vocab) { v.BOS = 4 }, engine.ErrInvalidInput, "Vocab.BOS = 4"},
		{"EOS", func(v *Vocab) { v.EOS = -2 }, engine.ErrInvalidInput, "Vocab.EOS = -2"},
		{"UNK", func(v *Vocab) { v.UNK = 99 }, engine.ErrInvalidInput, "Vocab.UNK = 99"},
		{"PAD", func(v *Vocab) { v.PAD = 4 }, engine.ErrInvalidInput, "Vocab.PAD = 4"},
		{"EOT", func(v *Vocab) { v.EOT = 4 }, engine.ErrInvalidInput, "Vocab.EOT = 4"},
		{"EOM", func(v *Vocab) { v.EOM = 4 }, engine.ErrInvalidInput, "Vocab.EOM = 4"},
		{"EOG", func(v *Vocab) { v.EOG = []int32{3, 7} }, engine.ErrInvalidInput, "Vocab.EOG[1] = 7"},
		{"add BOS without BOS", func(v *Vocab) { v.BOS = NoToken }, engine.ErrInvalidInput, "Vocab.AddBOS"},
		{"add EOS without EOS", func(v *Vocab) { v.AddEOS, v.EOS = true, NoToken }, engine.ErrInvalidInput, "Vocab.AddEOS"},
		{"duplicate", func(v *Vocab) { v.Tokens[3] = "</s>" }, engine.ErrInvalidInput, `Vocab.Tokens[3] "</s>" repeats Vocab.Tokens[2]`},
		{"model", func(v *Vocab) { v.Model = "t5" }, engine.ErrUnsupported, `unsupported: t5 (Vocab.Model "t5"`},
		{"pre", func(v *Vocab) { v.Model, v.Pre = ModelGPT2, "deepseek-v3" }, engine.ErrUnsupported, `unsupported: deepseek-v3 (Vocab.Pre "deepseek-v3"`},
	}
	for _, tt := range tests {
		v := base()
		tt.edit(&v)
		_, err := New(v)
		if !errors.Is(err, tt.wantErr) || err == nil || !strings.Contains(err.Error(), tt.wantMsg) {
			t.Errorf("%s: New error = %v, want %v mentioning %q", tt.name, err, tt.wantErr, tt.wantMsg)
		}
	}
	if _, err := New(base()); err != nil {
		t.Fatalf("valid vocabulary rejected: %v", err)
	}
}

func TestNewDefaults(t *testing.T) {
	v := DefaultVocab(ModelLlama, "")
	v.Tokens = []string{"", "x", "y"} // no scores or types: all normal, score 0
	v.BOS, v.EOS, v.UNK = NoToken, NoToken, NoToken
	v.AddBOS = false
	tok := mustNew(t, v)
	if got := tok.Token(0); got != "[EMPTY_0]" {
		t.Errorf("empty token text became %q, want [EMPTY_0]", got)
	}
	if tok.Type(1) != TypeNormal || tok.Special(1) {
		t.Errorf("token 1 type %v special %v, want normal", tok.Type(1), tok.Special(1))
	}
	if got := tok.EOGs(); len(got) != 0 {
		t.Errorf("EOGs = %v, want none", got)
	}
	if id, ok := tok.TokenID("y"); !ok || id != 2 {
		t.Errorf("TokenID(y) = %d, %v", id, ok)
	}

	bert := DefaultVocab(ModelBERT, "")
	if bert.BOS != 101 || bert.UNK != 100 || bert.SEP != 102 || bert.PAD != 0 || bert.EOS != NoToken || !bert.AddBOS || bert.AddSpacePrefix {
		t.Errorf("DefaultVocab(bert) = %+v, want llama.cpp's WPM defaults (BOS 101, UNK 100, SEP 102, PAD 0)", bert)
	}
	for _, c := range []struct {
		model, pre      string
		bos, eos, unk   int32
		addBOS, addSpPr bool
	}{
		{ModelLlama, "", 1, 2, 0, true, true},
		{ModelGPT2, "llama-bpe", 11, 11, NoToken, true, false},
		{ModelGPT2, "qwen2", 11, 11, NoToken, false, false},
		{"t5", "", NoToken, NoToken, NoToken, false, false},
	} {
		d := DefaultVocab(c.model, c.pre)
		if d.BOS != c.bos || d.EOS != c.eos || d.UNK != c.unk || d.PAD != NoToken || d.EOT != NoToken || d.EOM != NoToken ||
			d.AddBOS != c.addBOS || d.AddSpacePrefix != c.addSpPr || d.AddEOS {
			t.Errorf("DefaultVocab(%q, %q) = %+v", c.model, c.pre, d)
		}
	}
}

func TestEOGDetection(t *testing.T) {
	v := DefaultVocab(ModelGPT2, "llama-bpe")
	v.Tokens = []string{"a", "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|eom_id|>", "<|im_end|>", "b"}
	v.Types = []TokenType{TypeNormal, TypeControl, TypeControl, TypeNormal, TypeControl, TypeUserDefined, TypeNormal}
	v.BOS, v.EOS = 1, 2
	v.EOG = []int32{6}
	tok := mustNew(t, v)
	if tok.EOT() != 3 {
		t.Errorf("EOT = %d, want 3 found by text", tok.EOT())
	}
	if got := tok.EOGs(); !slices.Equal(got, []int32{2, 3, 4, 5, 6}) {
		t.Errorf("EOGs = %v, want [2 3 4 5 6]", got)
	}
	// <|eot_id|> was stored as normal; like llama.cpp, New makes it control,
	// so it is parsed as special and hidden by Decode.
	if tok.Type(3) != TypeControl || tok.Type(5) != TypeUserDefined {
		t.Errorf("types after New: %v, %v; want control, user-defined", tok.Type(3), tok.Type(5))
	}
	if got := tok.Encode("a<|eot_id|>", EncodeOptions{ParseSpecial: true}); !slices.Equal(got, []int32{0, 3}) {
		t.Errorf("Encode = %v, want [0 3]", got)
	}
	if got := tok.Decode([]int32{0, 3, 5}); got != "a<|im_end|>" {
		t.Errorf("Decode = %q", got)
	}
	if tok.IsEOG(0) || tok.IsEOG(-1) || tok.IsEOG(1) {
		t.Error("IsEOG true for a non-EOG id")
	}
}

// ggufFile writes a GGUF file with the given metadata, in order.
func ggufFile(t *testing.T, kvs ...any) *gguf.File {
	t.Helper()
	w := gguf.NewWriter()
	for i := 0; i < len(kvs); i += 2 {
		if err := w.AddKV(kvs[i].(string), kvs[i+1]); err != nil {
			t.Fatalf("AddKV(%v): %v", kvs[i], err)
		}
	}
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestFromGGUF(t *testing.T) {
	tokens := []string{"<unk>", "<s>", "</s>", "▁a", "b"}
	f := ggufFile(t,
		keyModel, "llama",
		keyTokens, tokens,
		keyScores, []int32{0, 0, 0, -1, -2, 99}, // int scores, one too many
		keyTokenType, []int32{2, 3, 3, 1, 1},
		keyBOS, uint32(0xFFFFFFFF), // "none": llama.cpp keeps the default
		keyEOS, uint32(2),
		keyPAD, uint32(4),
		keyEOT, int32(-1),
		keyAddEOS, true,
		keyAddSpacePrefix, false,
		keyChatTemplate, "{{ messages }}",
	)
	v, err := VocabFromGGUF(f)
	if err != nil {
		t.Fatal(err)
	}
	if v.BOS != 1 || v.EOS != 2 || v.UNK != 0 || v.PAD != 4 || v.EOT != NoToken || v.EOM != NoToken {
		t.Errorf("ids BOS %d EOS %d UNK %d PAD %d EOT %d EOM %d", v.BOS, v.EOS, v.UNK, v.PAD, v.EOT, v.EOM)
	}
	if !v.AddBOS || !v.AddEOS || v.AddSpacePrefix {
		t.Errorf("flags AddBOS %v AddEOS %v AddSpacePrefix %v, want true true false", v.AddBOS, v.AddEOS, v.AddSpacePrefix)
	}
	if !slices.Equal(v.Scores, []float32{0, 0, 0, -1, -2}) || len(v.Types) != 5 || v.Types[0] != TypeUnknown {
		t.Errorf("scores %v types %v", v.Scores, v.Types)
	}
	tok, err := FromGGUF(f)
	if err != nil {
		t.Fatal(err)
	}
	if tok.ChatTemplate() != "{{ messages }}" {
		t.Errorf("ChatTemplate = %q", tok.ChatTemplate())
	}
	// No space prefix, no "a" piece and no byte tokens: 'a' becomes <unk>.
	if got := tok.Encode("ab", EncodeOptions{AddSpecial: true}); !slices.Equal(got, []int32{1, 0, 4, 2}) {
		t.Errorf("Encode = %v, want [1 0 4 2]", got)
	}

	// A vocabulary too small for a default id drops it.
	f = ggufFile(t, keyModel, "llama", keyTokens, []string{"<unk>", "<s>"})
	if v, err = VocabFromGGUF(f); err != nil || v.EOS != NoToken || v.BOS != 1 {
		t.Errorf("small vocabulary: EOS %d BOS %d err %v, want none, 1", v.EOS, v.BOS, err)
	}

	f = ggufFile(t, keyModel, "gpt2", keyPre, "qwen2", keyTokens, []string{"a", "b", "ab"}, keyMerges, []string{"a b"},
		keyBOS, uint32(0), keyEOS, uint32(2))
	tok, err = FromGGUF(f)
	if err != nil {
		t.Fatal(err)
	}
	if got := tok.Encode("ab", EncodeOptions{AddSpecial: true}); !slices.Equal(got, []int32{2}) {
		t.Errorf("gpt2 Encode = %v, want [2] (qwen2 adds no BOS)", got)
	}
}

func TestFromGGUFErrors(t *testing.T) {
	tests := []struct {
		name string
		kvs  []any
		want string
	}{
		{"no model", []any{keyTokens, []string{"a"}}, "no " + keyModel},
		{"model type", []any{keyModel, uint32(1), keyTokens, []string{"a"}}, keyModel + " is uint32, want a string"},
		{"no tokens", []any{keyModel, "llama"}, "no " + keyTokens},
		{"token type", []any{keyModel, "llama", keyTokens, []int32{1}}, keyTokens + " is array of int32"},
		{"scores type", []any{keyModel, "llama", keyTokens, []string{"a"}, keyScores, []string{"x"}}, keyScores},
		{"short scores", []any{keyModel, "llama", keyTokens, []string{"a", "b"}, keyScores, []float32{1}}, "has 1 entries for 2 tokens"},
		{"short types", []any{keyModel, "llama", keyTokens, []string{"a", "b"}, keyTokenType, []int32{1}}, "has 1 entries for 2 tokens"},
		{"types type", []any{keyModel, "llama", keyTokens, []string{"a"}, keyTokenType, []float32{1}}, keyTokenType},
		{"no merges", []any{keyModel, "gpt2", keyTokens, []string{"a"}}, "no " + keyMerges},
		{"bos type", []any{keyModel, "llama", keyTokens, []string{"a", "b"}, keyBOS, "1"}, keyBOS + " is string"},
		{"flag type", []any{keyModel, "llama", keyTokens, []string{"a", "b"}, keyAddBOS, uint8(1)}, keyAddBOS + " is uint8, want a bool"},
		{"template type", []any{keyModel, "llama", keyTokens, []string{"a", "b"}, keyChatTemplate, 3.5}, keyChatTemplate},
		{"unknown model", []any{keyModel, "t5", keyTokens, []string{"a"}}, `Vocab.Model "t5"`},
	}
	for _, tt := range tests {
		_, err := FromGGUF(ggufFile(t, tt.kvs...))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: error %v, want one mentioning %q", tt.name, err, tt.want)
		}
		if err != nil && !errors.Is(err, engine.ErrInvalidInput) && !errors.Is(err, engine.ErrUnsupported) {
			t.Errorf("%s: error %v wraps neither ErrInvalidInput nor ErrUnsupported", tt.name, err)
		}
	}
}
