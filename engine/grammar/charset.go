package grammar

import (
	"slices"
)

const maxRune = 0x10FFFF

// rng is an inclusive range of code points.
type rng struct{ lo, hi rune }

// normalize sorts ranges and merges those that overlap or touch.
func normalize(set []rng) []rng {
	if len(set) == 0 {
		return nil
	}
	set = slices.Clone(set)
	slices.SortFunc(set, func(a, b rng) int { return int(a.lo) - int(b.lo) })
	out := set[:1]
	for _, r := range set[1:] {
		last := &out[len(out)-1]
		if r.lo <= last.hi+1 {
			last.hi = max(last.hi, r.hi)
			continue
		}
		out = append(out, r)
	}
	return out
}

// complement returns the code points 0..maxRune not in a normalized set.
func complement(set []rng) []rng {
	var out []rng
	next := rune(0)
	for _, r := range set {
		if r.lo > next {
			out = append(out, rng{next, r.lo - 1})
		}
		next = r.hi + 1
	}
	if next <= maxRune {
		out = append(out, rng{next, maxRune})
	}
	return out
}

// charset is a compiled set: normalized ranges plus an ASCII bitmap.
type charset struct {
	ranges []rng
	ascii  [2]uint64
}

func newCharset(ranges []rng) charset {
	cs := charset{ranges: ranges}
	for _, r := range ranges {
		for c := r.lo; c <= r.hi && c < 128; c++ {
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
		if c < r.lo {
			return false
		}
		if c <= r.hi {
			return true
		}
	}
	return false
}

// overlaps reports whether some code point in [lo, hi] is in the set.
func (cs *charset) overlaps(lo, hi rune) bool {
	for _, r := range cs.ranges {
		if r.lo > hi {
			return false
		}
		if r.hi >= lo {
			return true
		}
	}
	return false
}
