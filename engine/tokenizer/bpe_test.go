package tokenizer

import (
	"slices"
	"strings"
	"testing"
)

// bpeVocab builds a small byte-level BPE vocabulary: the 256 byte stand-ins
// (ids 0-255, in byte order), then the merge results, then special tokens.
type bpeVocab struct {
	v   Vocab
	ids map[string]int32
}

var testMerges = []string{
	"h e",     // 0
	"Ġ t",     // 1
	"Ġt he",   // 2
	"l l",     // 3
	"e ll",    // 4
	"h ell",   // 5
	"hell o",  // 6: "hello" is a token, but "h e" first never reaches it
	"1 2",     // 7
	"12 3",    // 8
	"Ġ Ġ",     // 9
	"Ċ Ċ",     // 10
	"Ã ©",     // 11: "é"
	"Ġ w",     // 12
	"o r",     // 13
	"Ġw or",   // 14
	"l d",     // 15
	"Ġwor ld", // 16
}

func newBPEVocab(t testing.TB, pre string) bpeVocab {
	t.Helper()
	v := DefaultVocab(ModelGPT2, pre)
	for b := range 256 {
		v.Tokens = append(v.Tokens, string(byteRunes[b]))
	}
	for _, m := range testMerges {
		v.Tokens = append(v.Tokens, strings.Replace(m, " ", "", 1))
	}
	v.Merges = testMerges
	for range v.Tokens {
		v.Types = append(v.Types, TypeNormal)
	}
	for _, s := range []struct {
		text string
		typ  TokenType
	}{{"<|endoftext|>", TypeControl}, {"<|im_start|>", TypeControl}, {"<tool>", TypeUserDefined}, {"<|bos|>", TypeControl}} {
		v.Tokens = append(v.Tokens, s.text)
		v.Types = append(v.Types, s.typ)
	}
	ids := make(map[string]int32)
	for i, s := range v.Tokens {
		ids[s] = int32(i)
	}
	v.BOS = ids["<|bos|>"]
	v.EOS = ids["<|endoftext|>"]
	return bpeVocab{v: v, ids: ids}
}

func (b bpeVocab) idsOf(t testing.TB, texts ...string) []int32 {
	t.Helper()
	return idsOf(t, b.ids, texts)
}

func TestByteRunes(t *testing.T) {
	// Spot checks against GPT-2's bytes_to_unicode.
	for b, want := range map[byte]rune{' ': 'Ġ', '\n': 'Ċ', '\t': 'ĉ', 0: 'Ā', '!': '!', 0x7F: 'ġ', 0xAD: 'Ń', 0xC3: 'Ã', 0xFF: 'ÿ'} {
		if got := byteRunes[b]; got != want {
			t.Errorf("byteRunes[%#x] = %q, want %q", b, got, want)
		}
	}
	seen := map[rune]bool{}
	for b, r := range byteRunes {
		if seen[r] {
			t.Fatalf("byteRunes maps two bytes to %q", r)
		}
		seen[r] = true
		if got := byteDecode(string(r)); got != string([]byte{byte(b)}) {
			t.Errorf("byteDecode(%q) = %q, want byte %#x", r, got, b)
		}
	}
	if got := byteDecode("Ġhi中"); got != " hi中" {
		t.Errorf("byteDecode passes unmapped code points through: got %q", got)
	}
}

func TestBPEEncode(t *testing.T) {
	tests := []struct {
		pre  string
		text string
		opts EncodeOptions
		want []string
	}{
		// "h e" (rank 0) beats "l l" (3), and nothing merges "he"+"ll":
		// rank order, not greed, decides.
		{"gpt-2", "hello", EncodeOptions{}, []string{"he", "ll", "o"}},
		// Llama 3 ignores merges for a word that is a token.
		{"llama-bpe", "hello", EncodeOptions{}, []string{"hello"}},
		{"gpt-2", " the world", EncodeOptions{}, []string{"Ġthe", "Ġworld"}},
		{"gpt-2", "a   b", EncodeOptions{}, []string{"a", "ĠĠ", "Ġ", "b"}},
		{"gpt-2", "x\n\ny", EncodeOptions{}, []string{"x", "Ċ", "Ċ", "y"}},
		{"llama-bpe", "x\n\ny", EncodeOptions{}, []string{"x", "ĊĊ", "y"}},
		{"gpt-2", "12345", EncodeOptions{}, []string{"123", "4", "5"}},
		{"llama-bpe", "12312", EncodeOptions{}, []string{"123", "12"}},
		{"qwen2", "123", EncodeOptions{}, []string{"1", "2", "3"}},
		{"smollm", "x123", EncodeOptions{}, []string{"x", "1", "2", "3"}},
		{"gpt-2", "café", EncodeOptions{}, []string{"c", "a", "f", "Ã©"}},
		{"gpt-2", "東", EncodeOptions{}, []string{"æ", "Ŀ", "±"}},
		{"gpt-2", "\xff", EncodeOptions{}, []string{"ÿ"}},
		// Special tokens.
		{"gpt-2", "<|im_start|>hi<|endoftext|>", EncodeOptions{ParseSpecial: true}, []string{"<|im_start|>", "h", "i", "<|endoftext|>"}},
		{"gpt-2", "a<tool>b", EncodeOptions{}, []string{"a", "<tool>", "b"}},
		{"gpt-2", "<|endoftext|>", EncodeOptions{}, []string{"<", "|", "e", "n", "d", "o", "f", "t", "e", "x", "t", "|", ">"}},
		// BOS per the pre-tokenizer's default: on for Llama 3 only.
		{"llama-bpe", "hi", EncodeOptions{AddSpecial: true}, []string{"<|bos|>", "h", "i"}},
		{"gpt-2", "hi", EncodeOptions{AddSpecial: true}, []string{"h", "i"}},
		{"gpt-2", "", EncodeOptions{AddSpecial: true}, []string{}},
	}
	for _, tt := range tests {
		bv := newBPEVocab(t, tt.pre)
		tok := mustNew(t, bv.v)
		got := tok.Encode(tt.text, tt.opts)
		if want := bv.idsOf(t, tt.want...); !slices.Equal(got, want) {
			t.Errorf("%s Encode(%q) = %v, want %v %q", tt.pre, tt.text, got, want, tt.want)
		}
	}
}

func TestBPEMissingStandIn(t *testing.T) {
	// A vocabulary without the stand-in for "z": that character becomes
	// the unknown token if there is one, and is dropped otherwise.
	bv := newBPEVocab(t, "gpt-2")
	bv.v.Tokens[int('z')] = "[z-gone]"
	bv.v.UNK = bv.ids["<tool>"]
	tok := mustNew(t, bv.v)
	if got, want := tok.Encode("azb", EncodeOptions{}), bv.idsOf(t, "a", "<tool>", "b"); !slices.Equal(got, want) {
		t.Errorf("with UNK: got %v, want %v", got, want)
	}
	bv.v.UNK = NoToken
	tok = mustNew(t, bv.v)
	if got, want := tok.Encode("azb", EncodeOptions{}), bv.idsOf(t, "a", "b"); !slices.Equal(got, want) {
		t.Errorf("without UNK: got %v, want %v", got, want)
	}
}

func TestBPEDecode(t *testing.T) {
	tests := []struct {
		pre  string
		ids  []string
		opts DecodeOptions
		want string
	}{
		{"gpt-2", []string{"Ġthe", "Ġworld"}, DecodeOptions{}, " the world"},
		{"gpt-2", []string{"c", "a", "f", "Ã©"}, DecodeOptions{}, "café"},
		{"gpt-2", []string{"æ", "Ŀ", "±"}, DecodeOptions{}, "東"},
		{"gpt-2", []string{"<|im_start|>", "h", "i", "<|endoftext|>"}, DecodeOptions{}, "hi"},
		{"gpt-2", []string{"<|im_start|>", "h", "i", "<|endoftext|>"}, DecodeOptions{UnparseSpecial: true}, "<|im_start|>hi<|endoftext|>"},
		{"gpt-2", []string{"a", "<tool>"}, DecodeOptions{}, "a<tool>"},
		// clean_spaces (gpt-2 and llama-bpe have it, qwen2 not).
		{"gpt-2", []string{"a", "Ġ", ",", "Ġ", "?", "Ġ", "'", "s"}, DecodeOptions{}, "a,?'s"},
		{"llama-bpe", []string{"a", "Ġ", "'", "Ġ", "b"}, DecodeOptions{}, "a'b"},
		{"qwen2", []string{"a", "Ġ", ",", "Ġ", "?"}, DecodeOptions{}, "a , ?"},
		// BOS removal when the vocabulary adds BOS.
		{"llama-bpe", []string{"<|bos|>", "h"}, DecodeOptions{RemoveSpecial: true, UnparseSpecial: true}, "h"},
		{"gpt-2", []string{"<|bos|>", "h"}, DecodeOptions{RemoveSpecial: true, UnparseSpecial: true}, "<|bos|>h"},
	}
	for _, tt := range tests {
		bv := newBPEVocab(t, tt.pre)
		tok := mustNew(t, bv.v)
		if got := tok.DecodeWith(bv.idsOf(t, tt.ids...), tt.opts); got != tt.want {
			t.Errorf("%s DecodeWith(%q, %+v) = %q, want %q", tt.pre, tt.ids, tt.opts, got, tt.want)
		}
	}

	bv := newBPEVocab(t, "gpt-2")
	tok := mustNew(t, bv.v)
	if !tok.IsEOG(bv.ids["<|endoftext|>"]) || tok.IsEOG(bv.ids["<|im_start|>"]) || tok.IsEOG(bv.ids["h"]) {
		t.Errorf("IsEOG: EOGs are %v, want only <|endoftext|> (%d)", tok.EOGs(), bv.ids["<|endoftext|>"])
	}
	for _, text := range []string{"hi there, it's 12:30!\n\n  x", "naïve 東京 🙂", "\x00\x01\xff"} {
		if got := tok.Decode(tok.Encode(text, EncodeOptions{})); got != text {
			t.Errorf("round trip of %q gave %q", text, got)
		}
	}
}

func TestCleanSpaces(t *testing.T) {
	tests := map[string]string{
		"":                  "",
		" ":                 " ",
		"a , b . c ! d ? e": "a, b. c! d? e",
		" ,":                ",",
		"a ' b":             "a'b",
		"it 's he 'll":      "it's he 'll",
		"we 're they 've":   "we're they've",
		"I 'm , ok 't 'd":   "I'm, ok 't 'd",
		"a ' ' b":           "a'' b",
		"x '":               "x '",
	}
	for in, want := range tests {
		if got := string(cleanSpaces([]byte(in))); got != want {
			t.Errorf("cleanSpaces(%q) = %q, want %q", in, got, want)
		}
	}
}

// A Tokenizer is shared by every request; run it from several goroutines
// (under -race this also checks that Encode and Decode only read it).
func TestConcurrentUse(t *testing.T) {
	tok := mustNew(t, newBPEVocab(t, "llama-bpe").v)
	want := tok.Encode(benchText, EncodeOptions{AddSpecial: true})
	errs := make(chan string, 4)
	for range 4 {
		go func() {
			got := tok.Encode(benchText, EncodeOptions{AddSpecial: true})
			switch {
			case !slices.Equal(got, want):
				errs <- "Encode differs between goroutines"
			case tok.DecodeWith(got, DecodeOptions{RemoveSpecial: true}) != benchText:
				errs <- "Decode did not restore the text"
			default:
				errs <- ""
			}
		}()
	}
	for range 4 {
		if msg := <-errs; msg != "" {
			t.Error(msg)
		}
	}
}
