package jsonschema

import (
	"fmt"
	"strings"
)

// gbnfLit writes s as a GBNF string literal. Printable ASCII stays as is;
// everything else is a \x, \u or \U escape so the grammar source is plain
// ASCII whatever the schema holds.
func gbnfLit(s string) string {
	var sb strings.Builder
	sb.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			sb.WriteByte('\\')
			sb.WriteRune(r)
		case r >= 0x20 && r < 0x7F:
			sb.WriteRune(r)
		default:
			sb.WriteString(gbnfEscape(r))
		}
	}
	sb.WriteByte('"')
	return sb.String()
}

// gbnfEscape is the escape for one code point, valid in literals and in
// character classes.
func gbnfEscape(r rune) string {
	switch {
	case r < 0x80:
		return fmt.Sprintf(`\x%02X`, r)
	case r <= 0xFFFF:
		return fmt.Sprintf(`\u%04X`, r)
	default:
		return fmt.Sprintf(`\U%08X`, r)
	}
}

// classChar writes a code point for a character class: letters and digits
// plainly, the rest escaped (so ']', '-', '^' and '\' never need thought).
func classChar(r rune) string {
	if 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' {
		return string(r)
	}
	return gbnfEscape(r)
}

// repeat is x{lo,hi} (hi < 0: no maximum) in GBNF, written with the
// cheapest operator.
func repeat(x string, lo, hi int) string {
	switch {
	case lo == 0 && hi < 0:
		return x + "*"
	case lo == 1 && hi < 0:
		return x + "+"
	case lo == 0 && hi == 1:
		return x + "?"
	case lo == 1 && hi == 1:
		return x
	case hi == 0:
		return `""`
	case hi < 0:
		return fmt.Sprintf("%s{%d,}", x, lo)
	case lo == hi:
		return fmt.Sprintf("%s{%d}", x, lo)
	default:
		return fmt.Sprintf("%s{%d,%d}", x, lo, hi)
	}
}

// group parenthesises an expression unless it is already one symbol.
func group(x string) string {
	if isSymbol(x) {
		return x
	}
	return "(" + x + ")"
}

// isSymbol reports whether x is one rule name, one literal or one class.
func isSymbol(x string) bool {
	if x == "" {
		return false
	}
	if x[0] == '"' || x[0] == '[' {
		// One literal or class: the closing quote/bracket is the last byte
		// and nothing before it closes early.
		closer := byte('"')
		if x[0] == '[' {
			closer = ']'
		}
		for i := 1; i < len(x); i++ {
			switch x[i] {
			case '\\':
				i++
			case closer:
				return i == len(x)-1
			}
		}
		return false
	}
	for i := 0; i < len(x); i++ {
		c := x[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// alternatives joins expressions with '|' in one group.
func alternatives(xs []string) string {
	if len(xs) == 1 {
		return xs[0]
	}
	return "(" + strings.Join(xs, " | ") + ")"
}
