package testmodel

import (
	"crypto/sha256"
	"fmt"
	"strings"
	"testing"
)

// vocabHash is a digest of Vocabulary(size, seed)'s tokens.
func vocabHash(size int, seed uint64) string {
	tokens, _, _ := Vocabulary(size, seed)
	return fmt.Sprintf("%x", sha256.Sum256([]byte(strings.Join(tokens, "\x00"))))[:16]
}

// TestVocabularyStable: the synthetic vocabulary is part of every generated
// file, whose sha256 golden data records: the same sizes and seeds must
// give the same tokens as they always did (digests taken before
// Vocabulary was made faster for big vocabularies).
func TestVocabularyStable(t *testing.T) {
	for _, tc := range []struct {
		size int
		seed uint64
		want string
	}{
		{512, 1, "b1d80fb063a3fcb8"},
		{32000, 1, "44cd19254baf8714"},
	} {
		if got := vocabHash(tc.size, tc.seed); got != tc.want {
			t.Errorf("Vocabulary(%d, %d): digest %s, want %s", tc.size, tc.seed, got, tc.want)
		}
	}
}

// BenchmarkVocabulary262k is Gemma 3's vocabulary size; before the rune
// counts were kept beside the pieces it took 45 s (2 cores, shared).
func BenchmarkVocabulary262k(b *testing.B) {
	for b.Loop() {
		Vocabulary(262144, 1)
	}
}
