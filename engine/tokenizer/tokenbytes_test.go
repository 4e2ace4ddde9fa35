package tokenizer

import (
	"bytes"
	"testing"
)

func TestTokenBytes(t *testing.T) {
	sv := newSPMVocab(t, true, map[string]float32{"▁": -1, "a": -1, "▁a": -0.5}, map[string]TokenType{"<tool>": TypeUserDefined, "<unused0>": TypeUnused})
	tok := mustNew(t, sv.v)
	tests := []struct {
		token string
		want  []byte
	}{
		{"▁a", []byte(" a")},
		{"▁", []byte(" ")},
		{"a", []byte("a")},
		{"<0xE6>", []byte{0xE6}},
		{"<0x0A>", []byte("\n")},
		{"<tool>", []byte("<tool>")},
		{"<s>", nil},
		{"</s>", nil},
		{"<unk>", nil},
		{"<unused0>", nil},
	}
	for _, tt := range tests {
		got := tok.TokenBytes(sv.idsOf(t, tt.token)[0])
		if !bytes.Equal(got, tt.want) || (tt.want == nil) != (got == nil) {
			t.Errorf("TokenBytes(%q) = %q, want %q", tt.token, got, tt.want)
		}
	}
	for _, id := range []int32{-1, int32(tok.VocabSize()), 1 << 30} {
		if got := tok.TokenBytes(id); got != nil {
			t.Errorf("TokenBytes(%d) = %q, want nil", id, got)
		}
	}
	// Fresh slices: changing one does not change the tokenizer.
	id := sv.idsOf(t, "▁a")[0]
	tok.TokenBytes(id)[0] = 'X'
	if got := tok.TokenBytes(id); string(got) != " a" {
		t.Errorf("TokenBytes after a caller's write = %q", got)
	}
}

// Byte-level BPE tokens are their decoded bytes, special ones nothing.
func TestTokenBytesBPE(t *testing.T) {
	bv := newBPEVocab(t, "qwen2")
	tok := mustNew(t, bv.v)
	for _, tt := range []struct {
		token string
		want  string
	}{{string(byteRunes[' ']), " "}, {string(byteRunes[0xE6]), "\xe6"}, {"<|endoftext|>", ""}, {"<tool>", "<tool>"}} {
		if got := tok.TokenBytes(bv.idsOf(t, tt.token)[0]); string(got) != tt.want {
			t.Errorf("TokenBytes(%q) = %q, want %q", tt.token, got, tt.want)
		}
	}
}

// Concatenating TokenBytes over any encoding equals what a StreamDecoder
// streams for it (valid UTF-8 in, so no U+FFFD), on the synthetic vocabulary
// and, when the shared data is there, stories260K.
func TestTokenBytesMatchStream(t *testing.T) {
	sv := newSPMVocab(t, true, map[string]float32{"▁": -1, "a": -1, "b": -1, "▁a": -0.5}, nil)
	toks := []*Tokenizer{mustNew(t, sv.v)}
	if st := storiesTokenizer(t); st != nil {
		toks = append(toks, st)
	}
	for _, tok := range toks {
		for _, text := range []string{"ab", "naïve 東京 🙂", "Once upon a time, Lily\n\tsaw", ""} {
			ids := tok.Encode(text, EncodeOptions{AddSpecial: true})
			d := tok.NewStreamDecoder()
			var streamed string
			var joined []byte
			for _, id := range ids {
				streamed += d.Next(id)
				joined = append(joined, tok.TokenBytes(id)...)
			}
			streamed += d.Flush()
			if string(joined) != streamed {
				t.Errorf("%q: TokenBytes joined %q, stream %q", text, joined, streamed)
			}
		}
	}
}

// PromptBytes joined give back the encoded text: the space prefix Encode
// adds is dropped from the first token that has bytes, BOS or not.
func TestPromptBytes(t *testing.T) {
	sv := newSPMVocab(t, true, map[string]float32{"▁": -1, "a": -1, "b": -1, "▁a": -0.5}, nil)
	toks := []*Tokenizer{mustNew(t, sv.v)}
	if st := storiesTokenizer(t); st != nil {
		toks = append(toks, st)
	}
	for _, tok := range toks {
		for _, text := range []string{"ab", " a", "naïve 東京 🙂", "Once upon a time, Lily\n\tsaw"} {
			for _, opts := range []EncodeOptions{{}, {AddSpecial: true}} {
				var joined []byte
				for _, b := range tok.PromptBytes(tok.Encode(text, opts)) {
					joined = append(joined, b...)
				}
				if string(joined) != text {
					t.Errorf("%q %+v: PromptBytes join to %q", text, opts, joined)
				}
			}
		}
	}
	// Only the first token with bytes loses a space, and only one.
	tok := toks[0]
	got := tok.PromptBytes(sv.idsOf(t, "<s>", "▁", "▁a"))
	if got[0] != nil || string(got[1]) != "" || string(got[2]) != " a" {
		t.Errorf("PromptBytes(<s> ▁ ▁a) = %q", got)
	}
	// A vocabulary without a space prefix keeps every byte.
	bv := newBPEVocab(t, "qwen2")
	btok := mustNew(t, bv.v)
	sp := string(byteRunes[' '])
	if got := btok.PromptBytes(bv.idsOf(t, sp)); string(got[0]) != " " {
		t.Errorf("BPE PromptBytes(space) = %q", got)
	}
}
