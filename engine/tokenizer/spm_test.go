package tokenizer

import (
	"fmt"
	"slices"
	"testing"
)

// spmVocab is a small SentencePiece vocabulary: <unk>, <s>, </s>, the 256
// byte tokens, then scored pieces and a few special tokens.
type spmVocab struct {
	v   Vocab
	ids map[string]int32
}

func newSPMVocab(t testing.TB, withBytes bool, pieces map[string]float32, extra map[string]TokenType) spmVocab {
	t.Helper()
	v := DefaultVocab(ModelLlama, "")
	add := func(text string, score float32, typ TokenType) {
		v.Tokens = append(v.Tokens, text)
		v.Scores = append(v.Scores, score)
		v.Types = append(v.Types, typ)
	}
	add("<unk>", 0, TypeUnknown)
	add("<s>", 0, TypeControl)
	add("</s>", 0, TypeControl)
	if withBytes {
		for b := range 256 {
			add(fmt.Sprintf("<0x%02X>", b), 0, TypeByte)
		}
	}
	for _, text := range sortedKeys(pieces) {
		add(text, pieces[text], TypeNormal)
	}
	for _, text := range sortedKeys(extra) {
		add(text, 0, extra[text])
	}
	ids := make(map[string]int32)
	for i, s := range v.Tokens {
		ids[s] = int32(i)
	}
	return spmVocab{v: v, ids: ids}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func (s spmVocab) idsOf(t testing.TB, texts ...string) []int32 {
	t.Helper()
	return idsOf(t, s.ids, texts)
}

// idsOf returns the ids of texts in a test vocabulary, failing t for a
// text it lacks.
func idsOf(t testing.TB, ids map[string]int32, texts []string) []int32 {
	t.Helper()
	out := make([]int32, len(texts))
	for i, text := range texts {
		id, ok := ids[text]
		if !ok {
			t.Fatalf("test vocabulary has no %q", text)
		}
		out[i] = id
	}
	return out
}

func mustNew(t testing.TB, v Vocab) *Tokenizer {
	t.Helper()
	tok, err := New(v)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return tok
}

func TestSPMEncode(t *testing.T) {
	sv := newSPMVocab(t, true, map[string]float32{
		"▁": -10, "a": -10, "b": -10, "c": -10, "x": -10,
		"bc": -1, "▁a": -2, "ab": -3, "abc": -5, "▁ab": -4,
		"aa": -6,
	}, map[string]TokenType{
		"<|user|>": TypeUserDefined,
		"<|ctl|>":  TypeControl,
		"<x>":      TypeControl,
		"<x><y>":   TypeControl,
		"<nope>":   TypeUnused,
	})
	tok := mustNew(t, sv.v)
	byteTok := func(b byte) string { return fmt.Sprintf("<0x%02X>", b) }

	tests := []struct {
		name string
		text string
		opts EncodeOptions
		want []string
	}{
		// "bc" scores best, then "▁a"; that leaves "a"+"bc" and "ab" stale,
		// and "▁abc" is not a token.
		{"highest score first", "abc", EncodeOptions{}, []string{"▁a", "bc"}},
		{"BOS", "abc", EncodeOptions{AddSpecial: true}, []string{"<s>", "▁a", "bc"}},
		// Equal scores: the leftmost pair merges first.
		{"tie goes left", "xaaa", EncodeOptions{}, []string{"▁", "x", "aa", "a"}},
		{"spaces become ▁", "a  b", EncodeOptions{}, []string{"▁a", "▁", "▁", "b"}},
		{"byte fallback", "é", EncodeOptions{}, []string{"▁", byteTok(0xC3), byteTok(0xA9)}},
		{"newline is a byte", "a\nb", EncodeOptions{}, []string{"▁a", byteTok('\n'), "b"}},
		{"empty", "", EncodeOptions{}, []string{}},
		{"empty with BOS", "", EncodeOptions{AddSpecial: true}, []string{"<s>"}},
		// User-defined tokens are matched without ParseSpecial; the text
		// after a special token gets the space prefix again.
		{"user-defined", "a<|user|>b", EncodeOptions{}, []string{"▁a", "<|user|>", "▁", "b"}},
		{"control needs parse-special", "<|ctl|>", EncodeOptions{ParseSpecial: true}, []string{"<|ctl|>"}},
		{"control as text", "<s>", EncodeOptions{}, []string{"▁", byteTok('<'), byteTok('s'), byteTok('>')}},
		{"BOS text parsed", "<s>a", EncodeOptions{AddSpecial: true, ParseSpecial: true}, []string{"<s>", "<s>", "▁a"}},
		{"longest special first", "<x><y><x>", EncodeOptions{ParseSpecial: true}, []string{"<x><y>", "<x>"}},
		{"unused is not special", "<nope>", EncodeOptions{ParseSpecial: true}, []string{"▁", byteTok('<'), byteTok('n'), byteTok('o'), byteTok('p'), byteTok('e'), byteTok('>')}},
		{"unknown parsed", "<unk>", EncodeOptions{ParseSpecial: true}, []string{"<unk>"}},
		{"invalid UTF-8", "\xff\xe6a", EncodeOptions{}, []string{"▁", byteTok(0xFF), byteTok(0xE6), byteTok('a')}},
	}
	for _, tt := range tests {
		got := tok.Encode(tt.text, tt.opts)
		if want := sv.idsOf(t, tt.want...); !slices.Equal(got, want) {
			t.Errorf("%s: Encode(%q) = %v, want %v %q", tt.name, tt.text, got, want, tt.want)
		}
	}
}

func TestSPMFlags(t *testing.T) {
	pieces := map[string]float32{"▁": -1, "a": -1, "b": -1, "▁a": -0.5}

	sv := newSPMVocab(t, true, pieces, nil)
	sv.v.AddSpacePrefix = false
	sv.v.AddEOS = true
	tok := mustNew(t, sv.v)
	if got, want := tok.Encode("ab", EncodeOptions{AddSpecial: true}), sv.idsOf(t, "<s>", "a", "b", "</s>"); !slices.Equal(got, want) {
		t.Errorf("no space prefix, add EOS: got %v, want %v", got, want)
	}
	if got, want := tok.Decode(sv.idsOf(t, "▁a", "b")), " ab"; got != want {
		t.Errorf("Decode without space prefix = %q, want %q", got, want)
	}

	sv.v.AddBOS = false
	tok = mustNew(t, sv.v)
	if got, want := tok.Encode("a", EncodeOptions{AddSpecial: true}), sv.idsOf(t, "a", "</s>"); !slices.Equal(got, want) {
		t.Errorf("no BOS: got %v, want %v", got, want)
	}

	// Without byte tokens a missing character becomes <unk> per byte.
	sv = newSPMVocab(t, false, pieces, nil)
	tok = mustNew(t, sv.v)
	if got, want := tok.Encode("aé", EncodeOptions{}), sv.idsOf(t, "▁a", "<unk>", "<unk>"); !slices.Equal(got, want) {
		t.Errorf("no byte tokens: got %v, want %v", got, want)
	}
	// ... and with no unknown token either, the bytes are dropped.
	sv.v.UNK = NoToken
	tok = mustNew(t, sv.v)
	if got, want := tok.Encode("aé", EncodeOptions{}), sv.idsOf(t, "▁a"); !slices.Equal(got, want) {
		t.Errorf("no byte or unknown tokens: got %v, want %v", got, want)
	}
}

func TestSPMDecode(t *testing.T) {
	sv := newSPMVocab(t, true, map[string]float32{"▁": -1, "a": -1, "b": -1, "▁a": -0.5, "▁b": -0.5},
		map[string]TokenType{"<|user|>": TypeUserDefined, "<nope>": TypeUnused})
	sv.v.AddEOS = true
	tok := mustNew(t, sv.v)
	tests := []struct {
		ids  []string
		opts DecodeOptions
		want string
	}{
		{[]string{"▁a", "▁b"}, DecodeOptions{}, "a b"},
		{[]string{"a", "▁b"}, DecodeOptions{}, "a b"},
		{[]string{"▁", "▁a"}, DecodeOptions{}, " a"},
		{[]string{"<s>", "▁a", "</s>"}, DecodeOptions{}, " a"},
		{[]string{"<s>", "▁a", "</s>"}, DecodeOptions{UnparseSpecial: true}, "<s> a</s>"},
		{[]string{"<s>", "▁a", "</s>"}, DecodeOptions{RemoveSpecial: true, UnparseSpecial: true}, " a"},
		{[]string{"▁a", "</s>"}, DecodeOptions{RemoveSpecial: true, UnparseSpecial: true}, "a"},
		{[]string{"<0xC3>", "<0xA9>", "▁a"}, DecodeOptions{}, "é a"},
		{[]string{"<|user|>", "▁a"}, DecodeOptions{}, "<|user|> a"},
		{[]string{"<unk>", "<nope>", "▁a"}, DecodeOptions{}, " a"},
		{[]string{"<unk>", "<nope>", "▁a"}, DecodeOptions{UnparseSpecial: true}, "<unk> a"},
	}
	for _, tt := range tests {
		if got := tok.DecodeWith(sv.idsOf(t, tt.ids...), tt.opts); got != tt.want {
			t.Errorf("DecodeWith(%q, %+v) = %q, want %q", tt.ids, tt.opts, got, tt.want)
		}
	}
	if got := tok.Decode([]int32{-5, sv.ids["▁a"], 1 << 30}); got != "a" {
		t.Errorf("Decode with ids out of range = %q, want %q", got, "a")
	}
	for text, want := range map[string]string{"<nope>": "", "<|user|>": "<|user|>", "<unk>": "<unk>", "▁a": " a", "<0x0A>": "\n"} {
		if got := tok.Piece(sv.ids[text]); got != want {
			t.Errorf("Piece(%q) = %q, want %q", text, got, want)
		}
	}
}
