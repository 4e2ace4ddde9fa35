// Package runeset holds the arithmetic on sets of Unicode code points, as
// sorted lists of inclusive ranges, that the grammar engine (character
// classes) and the JSON Schema compiler (pattern classes) both need.
package runeset

import "slices"

// MaxRune is the largest code point.
const MaxRune = 0x10FFFF

// Range is an inclusive range of code points.
type Range struct{ Lo, Hi rune }

// Normalize returns set sorted, with ranges that overlap or touch merged;
// nil for an empty set. set is not modified.
func Normalize(set []Range) []Range {
	if len(set) == 0 {
		return nil
	}
	set = slices.Clone(set)
	slices.SortFunc(set, func(a, b Range) int { return int(a.Lo) - int(b.Lo) })
	out := set[:1]
	for _, r := range set[1:] {
		last := &out[len(out)-1]
		if r.Lo <= last.Hi+1 {
			last.Hi = max(last.Hi, r.Hi)
			continue
		}
		out = append(out, r)
	}
	return out
}

// Complement returns the code points 0…MaxRune not in a normalized set.
func Complement(set []Range) []Range {
	var out []Range
	next := rune(0)
	for _, r := range set {
		if r.Lo > next {
			out = append(out, Range{Lo: next, Hi: r.Lo - 1})
		}
		next = r.Hi + 1
	}
	if next <= MaxRune {
		out = append(out, Range{Lo: next, Hi: MaxRune})
	}
	return out
}
