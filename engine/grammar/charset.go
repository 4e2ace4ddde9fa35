package grammar

import (
	"github.com/baton-serving/baton/engine/internal/runeset"
)

const maxRune = runeset.MaxRune

// rng is an inclusive range of code points.
type rng = runeset.Range

// charset is a compiled set: normalized ranges plus an ASCII bitmap.
type charset struct {
	ranges []rng
	ascii  [2]uint64
}

func newCharset(ranges []rng) charset {
	cs := charset{ranges: ranges}
	for _, r := range ranges {
		for c := r.Lo; c <= r.Hi && c < 128; c++ {
			cs.ascii[c>>6] |= 1 << (c & 63)
		}
	}
	return cs
}

func (cs *charset) has(c rune) bool {
	if c < 128 {
		return cs.ascii[c>>6]>>(c&63)&1 != 0
	}
	for _, r := range cs.ranges {
		if c < r.Lo {
			return false
		}
		if c <= r.Hi {
			return true
		}
	}
	return false
}

// overlaps reports whether some code point in [lo, hi] is in the set.
func (cs *charset) overlaps(lo, hi rune) bool {
	for _, r := range cs.ranges {
		if r.Lo > hi {
			return false
		}
		if r.Hi >= lo {
			return true
		}
	}
	return false
}
