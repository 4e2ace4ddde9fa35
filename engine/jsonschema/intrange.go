package jsonschema

import (
	"fmt"
	"math/big"
	"strings"
)

// intRange is the GBNF of the decimal integers in [lo, hi] (nil: no bound),
// written without leading zeros: digit-by-digit alternatives, O(d²) text for
// d-digit bounds.
func intRange(lo, hi *big.Int) string {
	var alts []string
	one := big.NewInt(1)
	// Negative values: "-" then a magnitude in [max(1,-hi), -lo].
	if lo == nil || lo.Sign() < 0 {
		if hi == nil || hi.Sign() >= 0 || hi.Cmp(big.NewInt(-1)) <= 0 {
			minMag := one
			if hi != nil && hi.Sign() < 0 {
				minMag = new(big.Int).Neg(hi)
			}
			var maxMag *big.Int
			if lo != nil {
				maxMag = new(big.Int).Neg(lo)
			}
			alts = append(alts, `"-" `+natRange(minMag, maxMag))
		}
	}
	// Non-negative values.
	if hi == nil || hi.Sign() >= 0 {
		minNat := big.NewInt(0)
		if lo != nil && lo.Sign() > 0 {
			minNat = lo
		}
		alts = append(alts, natRange(minNat, hi))
	}
	// Zero first reads best; order does not matter to the language.
	for i, j := 0, len(alts)-1; i < j; i, j = i+1, j-1 {
		alts[i], alts[j] = alts[j], alts[i]
	}
	return alternatives(alts)
}

// natRange is the GBNF of the naturals in [a, b] (b nil: no maximum).
func natRange(a, b *big.Int) string {
	A := a.String()
	var alts []string
	if b == nil {
		alts = append(alts, sameLen(A, strings.Repeat("9", len(A))))
		alts = append(alts, fmt.Sprintf("[1-9] [0-9]{%d,}", len(A)))
		return alternatives(alts)
	}
	B := b.String()
	for l := len(A); l <= len(B); l++ {
		low := "1" + strings.Repeat("0", l-1)
		if l == 1 {
			low = "0"
		}
		if l == len(A) {
			low = A
		}
		high := strings.Repeat("9", l)
		if l == len(B) {
			high = B
		}
		alts = append(alts, sameLen(low, high))
	}
	return alternatives(alts)
}

// sameLen is the GBNF of the digit strings of x's length from x to y (x <= y).
func sameLen(x, y string) string {
	if x == y {
		return gbnfLit(x)
	}
	if x[0] == y[0] {
		return gbnfLit(x[:1]) + " " + sameLen(x[1:], y[1:])
	}
	rest := len(x) - 1
	var alts []string
	lowFull, highFull := x[0], y[0]
	if strings.Trim(x[1:], "0") != "" {
		alts = append(alts, gbnfLit(x[:1])+" "+sameLen(x[1:], strings.Repeat("9", rest)))
		lowFull++
	}
	var highAlt string
	if strings.Trim(y[1:], "9") != "" {
		highAlt = gbnfLit(y[:1]) + " " + sameLen(strings.Repeat("0", rest), y[1:])
		highFull--
	}
	if lowFull <= highFull {
		mid := fmt.Sprintf("[%c-%c]", lowFull, highFull)
		if lowFull == highFull {
			mid = gbnfLit(string(lowFull))
		}
		if rest > 0 {
			mid += " " + repeat("[0-9]", rest, rest)
		}
		alts = append(alts, mid)
	}
	if highAlt != "" {
		alts = append(alts, highAlt)
	}
	return alternatives(alts)
}
