package tokenizer

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/baton-serving/baton/engine/gguf"
	"github.com/baton-serving/baton/engine/refdata"
)

// storiesTokenizer loads stories260K's tokenizer when the shared data is
// there, and returns nil otherwise (the fuzz target then uses the synthetic
// vocabularies only).
func storiesTokenizer(tb testing.TB) *Tokenizer {
	path, ok := refdata.Lookup(refdata.ModelFile)
	if !ok {
		return nil
	}
	f, err := gguf.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	tok, err := FromGGUF(f)
	if err != nil {
		tb.Fatalf("FromGGUF(stories260K): %v", err)
	}
	return tok
}

// FuzzEncode checks, for arbitrary input:
//   - Encode never panics, under every option combination, and returns ids
//     inside the vocabulary (also for BERT's WordPiece, bert-bge's vocabulary);
//   - llama vocabularies with byte fallback: for valid UTF-8 without U+2581
//     (which the model cannot tell from a space) and without the text of a
//     user-defined token (which is always parsed, and the text after it
//     gets a space prefix of its own, as in llama.cpp),
//     Decode(Encode(text, {})) == text exactly: Encode adds the dummy-prefix
//     space and Decode removes it again, and every other space, control
//     character or unknown character survives as "▁" or byte tokens;
//   - the same ids streamed through a StreamDecoder give " " + text;
//   - byte-level BPE with every pre-tokenizer that has no clean_spaces pass
//     (qwen2, deepseek-llm, tekken, ...): Decode(Encode) is the identity on
//     any byte string, valid UTF-8 or not;
//   - every pre-tokenizer cuts the text into non-empty words that join back
//     to exactly the text.
//
// The seed corpus includes llama.cpp's tokenizer test inputs and extra.inp.
func FuzzEncode(f *testing.F) {
	for _, io := range [][2]string{{"ggml-vocab-gpt-2.gguf.inp", "ggml-vocab-gpt-2.gguf.out"}, {"extra.inp", "ggml-vocab-gpt-2.gguf.extra.out"}} {
		for _, c := range readLlamaCppCases(f, io[0], io[1]) {
			f.Add(c.text)
		}
	}
	for _, s := range []string{
		"", " ", "  ", "\n", "Once upon a time", "Hello, world!", "naïve 東京 🙂",
		"<s> is parsed as BOS", "</s><unk><s>", "a<|user|>b", "\xff\xfe", "a\xe2\x96", "▁x",
		"Lily's dog, Max, is 3 years old!", "  leading\t\ttabs\r\n", "12345678901234567890",
		"I'M here 'll 'VE", "x = (y+1);\n\n\n  ", "\u0378\u00a0\u3000", strings.Repeat("ab", 50),
	} {
		f.Add(s)
	}
	stories := storiesTokenizer(f)
	spm := mustNew(f, newSPMVocab(f, true, map[string]float32{
		"▁": -1, "a": -2, "b": -2, "▁a": -0.5, "ab": -0.7, "▁ab": -0.2, "aa": -3,
	}, map[string]TokenType{"<|user|>": TypeUserDefined, "<|ctl|>": TypeControl}).v)
	bpes := map[string]*Tokenizer{}
	for pre := range preTokenizers {
		bpes[pre] = mustNew(f, newBPEVocab(f, pre).v)
	}
	bert, err := FromGGUF(openLlamaCppVocab(f, "ggml-vocab-bert-bge"))
	if err != nil {
		f.Fatal(err)
	}

	f.Fuzz(func(t *testing.T, text string) {
		llamas := []*Tokenizer{spm}
		if stories != nil {
			llamas = append(llamas, stories)
		}
		all := append([]*Tokenizer{bert}, llamas...)
		for _, tok := range bpes {
			all = append(all, tok)
		}
		for _, tok := range all {
			for _, opts := range []EncodeOptions{{}, {AddSpecial: true}, {ParseSpecial: true}, {AddSpecial: true, ParseSpecial: true}} {
				for _, id := range tok.Encode(text, opts) {
					if id < 0 || int(id) >= tok.VocabSize() {
						t.Fatalf("%s/%s: Encode(%q, %+v) gave id %d outside [0, %d)", tok.Model(), tok.Pre(), text, opts, id, tok.VocabSize())
					}
				}
			}
		}

		if utf8.ValidString(text) && !strings.Contains(text, spmSpace) {
			for _, tok := range llamas {
				if holdsUserDefined(tok, text) {
					continue
				}
				ids := tok.Encode(text, EncodeOptions{})
				if got := tok.Decode(ids); got != text {
					t.Errorf("llama: Decode(Encode(%q)) = %q (ids %v)", text, got, ids)
				}
				d := tok.NewStreamDecoder()
				var b strings.Builder
				for _, id := range ids {
					b.WriteString(d.Next(id))
				}
				b.WriteString(d.Flush())
				want := ""
				if text != "" {
					want = " " + text
				}
				if b.String() != want {
					t.Errorf("llama: streaming Encode(%q) gave %q, want %q", text, b.String(), want)
				}
			}
		}

		for pre, tok := range bpes {
			if tok.pre.cleanSpaces {
				continue
			}
			if got := tok.Decode(tok.Encode(text, EncodeOptions{})); got != text {
				t.Errorf("%s: Decode(Encode(%q)) = %q", pre, text, got)
			}
		}
		for pre, cfg := range preTokenizers {
			words := preTokenize(text, cfg.stages)
			for i, w := range words {
				if w == "" {
					t.Fatalf("%s: preTokenize(%q) word %d is empty: %q", pre, text, i, words)
				}
			}
			if got := strings.Join(words, ""); got != text {
				t.Errorf("%s: preTokenize(%q) joins to %q", pre, text, got)
			}
		}
	})
}

// holdsUserDefined reports whether text contains a user-defined token's text.
func holdsUserDefined(tok *Tokenizer, text string) bool {
	for _, id := range tok.specials {
		if tok.Type(id) == TypeUserDefined && strings.Contains(text, tok.Token(id)) {
			return true
		}
	}
	return false
}
