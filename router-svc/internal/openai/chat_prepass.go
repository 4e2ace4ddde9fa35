package openai

import (
	"strings"
)

// The engine (github.com/ardanlabs/jinja) looks a filter up among its own
// builtins first and only then among the render's variables, so a builtin
// filter cannot be replaced by registering one. Where Baton's filter must
// win (tojson, see tojsonFilter), NewChatTemplate renames the filter in
// the template's source before compiling it, to a name no builtin has,
// and the render binds that name to Baton's filter.

// replacedFilters maps a filter's name in templates to the variable that
// holds Baton's version of it.
var replacedFilters = map[string]string{"tojson": "__baton_tojson"}

// renameFilters rewrites every use of a replaced filter (`x | tojson`,
// `x|tojson(indent=4)`) inside the template's {{ }} and {% %} tags to its
// replacement's name. Text outside tags, comments and string literals are
// left alone, so a template that writes "| tojson" as text still does.
// formatAt are the offsets of Python %-formatting ("%s" % x) in the tags,
// which the engine evaluates as a modulo of a string: wrong text, no error.
func renameFilters(src string) (out string, formatAt []int) {
	var b strings.Builder
	b.Grow(len(src) + 64)
	i := 0
	for i < len(src) {
		open := strings.Index(src[i:], "{")
		if open < 0 || i+open+1 >= len(src) {
			b.WriteString(src[i:])
			break
		}
		open += i
		b.WriteString(src[i:open])
		switch src[open+1] {
		case '#':
			end := strings.Index(src[open+2:], "#}")
			if end < 0 {
				b.WriteString(src[open:])
				return b.String(), formatAt
			}
			end += open + 4
			b.WriteString(src[open:end])
			i = end
		case '{', '%':
			closer := "}}"
			if src[open+1] == '%' {
				closer = "%}"
			}
			i = renameInTag(&b, src, open, closer, &formatAt)
		default:
			b.WriteByte('{')
			i = open + 1
		}
	}
	return b.String(), formatAt
}

// renameInTag copies the tag that starts at src[open] (its opener two
// bytes long) up to and including its closer, renaming the replaced
// filters, and returns the index after it (len(src) when it is not
// closed: the compiler reports that).
func renameInTag(b *strings.Builder, src string, open int, closer string, formatAt *[]int) int {
	b.WriteString(src[open : open+2])
	i := open + 2
	depth := 0 // brackets open in the expression: "}}" inside {'a': {'b': 1}} does not close
	for i < len(src) {
		c := src[i]
		switch {
		case c == '\'' || c == '"':
			end := i + 1
			for end < len(src) && src[end] != c {
				if src[end] == '\\' {
					end++
				}
				end++
			}
			end = min(end+1, len(src))
			b.WriteString(src[i:end])
			i = end
			// A literal followed by the % operator (not by the %} closer).
			j := i
			for j < len(src) && (src[j] == ' ' || src[j] == '\t' || src[j] == '\n' || src[j] == '\r') {
				j++
			}
			if j+1 < len(src) && src[j] == '%' && src[j+1] != '}' {
				*formatAt = append(*formatAt, j)
			}
		case depth == 0 && strings.HasPrefix(src[i:], closer):
			b.WriteString(closer)
			return i + len(closer)
		case c == '{' || c == '(' || c == '[':
			depth++
			b.WriteByte(c)
			i++
		case (c == '}' || c == ')' || c == ']') && depth > 0:
			depth--
			b.WriteByte(c)
			i++
		case c == '|':
			b.WriteByte('|')
			i++
			j := i
			for j < len(src) && (src[j] == ' ' || src[j] == '\t' || src[j] == '\n' || src[j] == '\r') {
				j++
			}
			k := j
			for k < len(src) && isIdentByte(src[k]) {
				k++
			}
			b.WriteString(src[i:j])
			if repl, ok := replacedFilters[src[j:k]]; ok {
				b.WriteString(repl)
			} else {
				b.WriteString(src[j:k])
			}
			i = k
		default:
			b.WriteByte(c)
			i++
		}
	}
	return i
}

func isIdentByte(c byte) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}
