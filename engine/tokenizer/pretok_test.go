package tokenizer

import (
	"slices"
	"strings"
	"testing"
)

// The expectations below were worked out by hand from the regular
// expressions in llama.cpp's llama-vocab.cpp (leftmost alternative wins,
// greedy quantifiers, `\s+(?!\S)` leaving the last space for the next word).
func TestPreTokenizers(t *testing.T) {
	tests := []struct {
		pre  string
		text string
		want []string
	}{
		// Llama 3.
		{"llama-bpe", "Hello world", []string{"Hello", " world"}},
		{"llama-bpe", "I'm here, you're THERE'S", []string{"I", "'m", " here", ",", " you", "'re", " THERE", "'S"}},
		{"llama-bpe", "don't we'll they'VE it'D", []string{"don", "'t", " we", "'ll", " they", "'VE", " it", "'D"}},
		{"llama-bpe", "'ll 'LL", []string{"'ll", " '", "LL"}},
		{"llama-bpe", "x's 'x", []string{"x", "'s", " '", "x"}},
		{"llama-bpe", "12345678", []string{"123", "456", "78"}},
		{"llama-bpe", "abc1234def", []string{"abc", "123", "4", "def"}},
		{"llama-bpe", "a 12", []string{"a", " ", "12"}},
		{"llama-bpe", "a   b", []string{"a", "  ", " b"}},
		{"llama-bpe", "   x", []string{"  ", " x"}},
		{"llama-bpe", "hi  ", []string{"hi", "  "}},
		{"llama-bpe", "hi ", []string{"hi", " "}},
		{"llama-bpe", "a  \n\n b", []string{"a", "  \n\n", " b"}},
		{"llama-bpe", "line\r\nnext", []string{"line", "\r\n", "next"}},
		{"llama-bpe", "Hi!!\n\nYo", []string{"Hi", "!!\n\n", "Yo"}},
		{"llama-bpe", "x = (y+1);", []string{"x", " =", " (", "y", "+", "1", ");"}},
		{"llama-bpe", "$100", []string{"$", "100"}},
		{"llama-bpe", "\tfoo\nbar", []string{"\tfoo", "\n", "bar"}},
		{"llama-bpe", "naïve café", []string{"naïve", " café"}},
		{"llama-bpe", "東京タワー 2024年", []string{"東京タワー", " ", "202", "4", "年"}},
		{"llama-bpe", "٣٤٥٦", []string{"٣٤٥", "٦"}},
		{"llama-bpe", "a\u00a0\u00a0b", []string{"a", "\u00a0", "\u00a0b"}},
		{"llama-bpe", "🙂🙂 ok", []string{"🙂🙂", " ok"}},
		{"llama-bpe", "", nil},

		// Qwen2: the same, but digits one by one.
		{"qwen2", "12345", []string{"1", "2", "3", "4", "5"}},
		{"qwen2", "I'D go 2x", []string{"I", "'D", " go", " ", "2", "x"}},
		{"qwen2", "a  \n b", []string{"a", "  \n", " b"}},

		// GPT-2: case-sensitive contractions, space-prefixed runs of one
		// class, whitespace without the newline rule.
		{"gpt-2", "Hello world", []string{"Hello", " world"}},
		{"gpt-2", "I'M x's", []string{"I", "'", "M", " x", "'s"}},
		{"gpt-2", "abc123 456", []string{"abc", "123", " 456"}},
		{"gpt-2", "hi!? ok", []string{"hi", "!?", " ok"}},
		{"gpt-2", "a   b", []string{"a", "  ", " b"}},
		{"gpt-2", "hello\n\nworld", []string{"hello", "\n", "\n", "world"}},
		{"gpt-2", "end  ", []string{"end", "  "}},
		{"gpt-2", "\tx", []string{"\t", "x"}},

		// SmolLM: every digit alone first, then GPT-2 inside each piece.
		{"smollm", "abc 123 def", []string{"abc", " ", "1", "2", "3", " def"}},
		{"smollm", "x1y", []string{"x", "1", "y"}},
		{"smollm", "v2.0", []string{"v", "2", ".", "0"}},

		// default: punctuation runs, GPT-2, number runs, then ASCII digit
		// triples.
		{"default", "hello, world! 12345 $5", []string{"hello", ",", " world", "!", " ", "123", "45", " ", "$", "5"}},
		{"", "a+=b", []string{"a", "+=", "b"}},
	}
	for _, tt := range tests {
		cfg, ok := preTokenizers[normPre(tt.pre)]
		if !ok {
			t.Fatalf("pre-tokenizer %q missing", tt.pre)
		}
		got := preTokenize(tt.text, cfg.stages)
		if !slices.Equal(got, tt.want) {
			t.Errorf("%s %q: got %q, want %q", tt.pre, tt.text, got, tt.want)
		}
	}
}

// Whatever the input, the words must cover it exactly, and none is empty.
func TestPreTokenizePartitions(t *testing.T) {
	inputs := []string{
		"", " ", "\n", "a", "\xff\xfe", "a\xe2\x96", "'", "' ", "''s", "\r\n\r\n  x",
		"mixed 123 \t\t东京 ... 's 'S\n\n\n", strings.Repeat(" ", 100) + "x",
		"\u0378\u0379 x \u0378", // unassigned code points
	}
	for name, cfg := range preTokenizers {
		for _, in := range inputs {
			words := preTokenize(in, cfg.stages)
			if got := strings.Join(words, ""); got != in {
				t.Errorf("%s %q: words %q join to %q", name, in, words, got)
			}
			for _, w := range words {
				if w == "" {
					t.Errorf("%s %q: empty word in %q", name, in, words)
				}
			}
		}
	}
}
