package tokenizer

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestStreamDecoder(t *testing.T) {
	sv := newSPMVocab(t, true, map[string]float32{"▁": -1, "a": -1, "▁a": -0.5}, nil)
	tok := mustNew(t, sv.v)
	tests := []struct {
		name  string
		ids   []string
		want  []string // one per Next
		flush string
	}{
		// The first token keeps its space: generated text continues a prompt.
		{"leading space kept", []string{"▁a", "a"}, []string{" a", "a"}, ""},
		{"character split over byte tokens", []string{"▁", "<0xE6>", "<0x9D>", "<0xB1>", "a"}, []string{" ", "", "", "東", "a"}, ""},
		{"four-byte character", []string{"<0xF0>", "<0x9F>", "<0x99>", "<0x82>"}, []string{"", "", "", "🙂"}, ""},
		{"control tokens vanish", []string{"<s>", "▁a", "</s>"}, []string{"", " a", ""}, ""},
		{"invalid byte at once", []string{"<0xFF>", "a"}, []string{"\uFFFD", "a"}, ""},
		{"stray continuation", []string{"<0x9D>", "a"}, []string{"\uFFFD", "a"}, ""},
		{"cut short by a character", []string{"<0xE6>", "<0x9D>", "▁a"}, []string{"", "", "\uFFFD\uFFFD a"}, ""},
		{"cut short by the end", []string{"a", "<0xF0>", "<0x9F>"}, []string{"a", "", ""}, "\uFFFD\uFFFD"},
		{"bad lead then good", []string{"<0xE6>", "<0xE6>", "<0x9D>", "<0xB1>"}, []string{"", "\uFFFD", "", "東"}, ""},
	}
	for _, tt := range tests {
		d := tok.NewStreamDecoder()
		for i, id := range sv.idsOf(t, tt.ids...) {
			if got := d.Next(id); got != tt.want[i] {
				t.Errorf("%s: Next #%d (%q) = %q, want %q", tt.name, i, tt.ids[i], got, tt.want[i])
			}
		}
		if got := d.Flush(); got != tt.flush {
			t.Errorf("%s: Flush = %q, want %q", tt.name, got, tt.flush)
		}
		if got := d.Flush(); got != "" {
			t.Errorf("%s: second Flush = %q, want empty", tt.name, got)
		}
	}
	d := tok.NewStreamDecoder()
	if got := d.Next(-1) + d.Next(int32(tok.VocabSize())) + d.Flush(); got != "" {
		t.Errorf("ids out of range gave %q", got)
	}
}

// Streaming the encoding of any valid text one id at a time gives back
// " " + the text (the space prefix is kept), and every chunk is valid UTF-8.
func TestStreamDecoderRoundTrip(t *testing.T) {
	sv := newSPMVocab(t, true, map[string]float32{"▁": -1, "a": -1, "b": -1, "▁a": -0.5}, nil)
	tok := mustNew(t, sv.v)
	for _, text := range []string{"ab", "naïve 東京 🙂", "a\nb\tc", "  x", ""} {
		d := tok.NewStreamDecoder()
		var b strings.Builder
		for _, id := range tok.Encode(text, EncodeOptions{}) {
			chunk := d.Next(id)
			if !utf8.ValidString(chunk) {
				t.Errorf("%q: chunk %q is not valid UTF-8", text, chunk)
			}
			b.WriteString(chunk)
		}
		b.WriteString(d.Flush())
		want := " " + text
		if text == "" {
			want = ""
		}
		if b.String() != want {
			t.Errorf("streamed %q, want %q", b.String(), want)
		}
	}
}

func TestCompletePrefix(t *testing.T) {
	tests := []struct {
		in   string
		want int
	}{
		{"", 0},
		{"abc", 3},
		{"a\xe6", 1},
		{"a\xe6\x9d", 1},
		{"a\xe6\x9d\xb1", 4},
		{"\xf0\x9f\x99", 0},
		{"\xf0\x9f\x99\x82", 4},
		{"\xff", 1},
		{"\xe6a", 2},
		{"\x9d", 1},
		{"\xe6\xe6", 1},
	}
	for _, tt := range tests {
		if got := completePrefix([]byte(tt.in)); got != tt.want {
			t.Errorf("completePrefix(%q) = %d, want %d", tt.in, got, tt.want)
		}
	}
}
