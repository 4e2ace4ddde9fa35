package grammar

import (
	"encoding/binary"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/baton-serving/baton/engine/testmodel"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// llama2Pieces reads llama2.c's tokenizer.bin (the 32000-token Llama 2
// vocabulary): int32 max_token_length, then per token float32 score,
// int32 length, bytes. llama2.c's export already wrote "▁" as a space; ids
// 0-2 are <unk> <s> </s> (control: nil), 3-258 are the byte tokens
// <0xNN>. It returns nil when the file is absent.
func llama2Pieces(t testing.TB) [][]byte {
	t.Helper()
	b, err := os.ReadFile("../../../shared/models/tokenizer.bin")
	if err != nil {
		return nil
	}
	const n = 32000
	pieces := make([][]byte, n)
	off := 4
	for i := range n {
		if off+8 > len(b) {
			t.Fatalf("tokenizer.bin: truncated at token %d", i)
		}
		_ = math.Float32frombits(binary.LittleEndian.Uint32(b[off:]))
		l := int(binary.LittleEndian.Uint32(b[off+4:]))
		off += 8
		if off+l > len(b) {
			t.Fatalf("tokenizer.bin: truncated in token %d", i)
		}
		p := b[off : off+l]
		off += l
		switch {
		case i < 3:
		case i < 259:
			pieces[i] = []byte{byte(i - 3)}
		default:
			pieces[i] = []byte(string(p))
		}
	}
	return pieces
}

// syntheticPieces is engine/testmodel's vocabulary as token bytes.
func syntheticPieces(size int, seed uint64) [][]byte {
	toks, _, types := testmodel.Vocabulary(size, seed)
	pieces := make([][]byte, len(toks))
	for i, tok := range toks {
		switch types[i] {
		case 6: // byte token <0xNN>
			pieces[i] = []byte{byte(i - 3)}
		case 1:
			pieces[i] = []byte(strings.ReplaceAll(tok, "▁", " "))
		}
	}
	return pieces
}

// vocab32k is the real Llama 2 vocabulary when the shared models are
// present, else a synthetic one of the same size; eos is id 2.
func vocab32k(t testing.TB) *Vocab {
	t.Helper()
	p := llama2Pieces(t)
	if p == nil {
		p = syntheticPieces(32000, 1)
	}
	return NewVocab(p, []int32{2})
}

// smallVocab is a vocabulary for exhaustive checks: single characters,
// multi-character pieces, pieces that split UTF-8 characters, raw bytes,
// an empty piece, a control token and the eos id 1.
func smallVocab() (*Vocab, [][]byte) {
	words := []string{
		"", // id 0: empty piece, never allowed
		"", // id 1: eos (nil below)
		"{", "}", "[", "]", ",", ":", "\"", " ", "\n", "\\", "\\\"",
		"a", "b", "x", "true", "false", "null", "nu", "ll", "0", "1", "12", "-", ".", "e", "5",
		"{\"", "\":", "\",", "\"}", "\"a\"", ": ", ", ", "[1", "]}", "é", "日", "本", "日本", "😀",
		"\xc3", "\xa9", "\xe6\x97", "\xa5", "\xf0\x9f", "\x98\x80", "\x80", "\xff",
		"ab", "ba", "aa", "xyz", "(", ")", "()", "aé", " 日本", "a\xc3", "\"\xe6", "a\xff", " \x80", "b\xe0\x80",
	}
	for c := 'c'; c <= 'z'; c++ {
		if c != 'e' && c != 'x' {
			words = append(words, string(c))
		}
	}
	pieces := make([][]byte, len(words)+1)
	for i, w := range words {
		pieces[i] = []byte(w)
	}
	pieces[1] = nil
	pieces[len(words)] = nil // a control token
	return NewVocab(pieces, []int32{1}), pieces
}

// nodes is the number of trie nodes (for benchmarks and sizing).
func (v *Vocab) nodes() int { return len(v.first) - 1 }

// clone returns an independent copy of the matcher at the same point.
func (m *Matcher) clone() *Matcher {
	return &Matcher{g: m.g, v: m.v, st: m.st, part: m.part}
}
