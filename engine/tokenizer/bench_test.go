package tokenizer

import (
	"strings"
	"testing"
)

// benchText is about 4 KB of mixed prose, digits, punctuation and non-ASCII.
var benchText = strings.Repeat("Once upon a time, there was a little girl named Lily. "+
	"She had 3 cats and 12 dogs; they ate 1,234 treats!\n\"Let's go,\" she said — naïve 東京 🙂. ", 24)

func BenchmarkEncodeStories(b *testing.B) {
	tok := storiesTokenizer(b)
	if tok == nil {
		b.Skip("stories260K.gguf not found")
	}
	b.SetBytes(int64(len(benchText)))
	for b.Loop() {
		tok.Encode(benchText, EncodeOptions{AddSpecial: true, ParseSpecial: true})
	}
}

func BenchmarkEncodeLlamaBPE(b *testing.B) {
	tok := mustNew(b, newBPEVocab(b, "llama-bpe").v)
	b.SetBytes(int64(len(benchText)))
	for b.Loop() {
		tok.Encode(benchText, EncodeOptions{AddSpecial: true, ParseSpecial: true})
	}
}

func BenchmarkDecodeStories(b *testing.B) {
	tok := storiesTokenizer(b)
	if tok == nil {
		b.Skip("stories260K.gguf not found")
	}
	ids := tok.Encode(benchText, EncodeOptions{})
	b.SetBytes(int64(len(benchText)))
	for b.Loop() {
		tok.Decode(ids)
	}
}

// Long degenerate inputs stay linearithmic: a quadratic step would make
// these 256 KB inputs take minutes. The outputs are checked too.
func TestLongInputs(t *testing.T) {
	const n = 256 << 10
	spm := newSPMVocab(t, true, map[string]float32{"▁": -1, "a": -1, "aa": -2, "aaaa": -3, "▁a": -4}, map[string]TokenType{"<u>": TypeUserDefined})
	spmTok := mustNew(t, spm.v)
	bpeTok := mustNew(t, newBPEVocab(t, "llama-bpe").v)
	inputs := map[string]string{
		"one letter":     strings.Repeat("a", n),
		"spaces":         strings.Repeat(" ", n),
		"newlines":       strings.Repeat(" \n", n/2),
		"digits":         strings.Repeat("7", n),
		"specials":       strings.Repeat("<s><u>", n/6),
		"near specials":  strings.Repeat("<s", n/2),
		"multibyte":      strings.Repeat("東", n/3),
		"invalid":        strings.Repeat("\xff", n),
		"apostrophes":    strings.Repeat("'", n),
		"punctuation":    strings.Repeat("!?", n/2),
		"mixed no space": strings.Repeat("ab1.", n/4),
	}
	for name, in := range inputs {
		ids := bpeTok.Encode(in, EncodeOptions{})
		if got := bpeTok.Decode(ids); got != in {
			t.Errorf("%s: BPE round trip lost text (%d bytes in, %d out)", name, len(in), len(got))
		}
		ids = spmTok.Encode(in, EncodeOptions{ParseSpecial: true})
		if len(ids) == 0 {
			t.Errorf("%s: SPM encoded %d bytes to nothing", name, len(in))
		}
		if name == "one letter" && len(ids) != n/4+1 {
			// "▁a" scores worst, so "aaaa" wins everywhere: ▁ then n/4 × aaaa.
			t.Errorf("one letter: %d ids, want %d", len(ids), n/4+1)
		}
	}
}

// BenchmarkEncodeLlamaCpp encodes benchText with real vocabularies from
// llama.cpp's test set, one per tokenizer model and pre-tokenizer family.
func BenchmarkEncodeLlamaCpp(b *testing.B) {
	for _, name := range []string{"llama-spm", "llama-bpe", "qwen2", "gpt-2", "deepseek-llm", "falcon", "bert-bge"} {
		b.Run(name, func(b *testing.B) {
			tok, err := FromGGUF(openLlamaCppVocab(b, "ggml-vocab-"+name))
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(benchText)))
			for b.Loop() {
				tok.Encode(benchText, EncodeOptions{AddSpecial: true, ParseSpecial: true})
			}
		})
	}
}
