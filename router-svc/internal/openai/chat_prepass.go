package openai

import (
	"strings"
	"unicode"
)

// The pre-pass: Baton rewrites a chat template's source before the engine
// (github.com/ardanlabs/jinja) compiles it, for what the engine does
// differently from Python's jinja2 and cannot be configured:
//
//   - Whitespace control. The engine applies {%- -%}, trim_blocks and
//     lstrip_blocks to the nearest text on that side even when other tags
//     stand between (`A: {{ x }}{%- endif %}` loses the space), keeps
//     "\r\n" and the template's last newline, strips only ASCII
//     whitespace and ignores the + modifiers. The pre-pass applies jinja2's
//     lexer rules itself (Hugging Face's settings: trim_blocks,
//     lstrip_blocks, keep_trailing_newline off), drops the markers from the
//     tags, and writes each text so that the engine's own trimming cannot
//     change it: whitespace at a text's edges goes into a string literal
//     expression, which no trimming touches.
//   - {% raw %}: its content is copied as a string literal, untouched by
//     the renames and checks below.
//   - Builtin filters that must be Baton's (the engine looks a filter up
//     among its builtins first, so registering one cannot replace it):
//     tojson (see tojsonFilter), string and join (Python's str() of the
//     value, see pyStr) are renamed to names no builtin has in
//     `x | tojson`; the render binds those. A {% filter %} block cannot
//     use them (the engine looks its filter up among the builtins only):
//     refused at load.
//   - Printing: every {{ expression }} goes through printFunc, which
//     writes the value as Python's str() does (1.0, None, a list's repr),
//     where the engine writes 1, "" and its own repr.
//
// It also finds what cannot be made exact here: Python's %-formatting
// ("%s" % x, which the engine evaluates as a modulo: refused at load), the
// ~ operator (the engine's own printing of a float, None or a list
// operand) and `"x" | safe + y` (jinja2 escapes y's HTML characters, the
// engine does not): warnings at load.

// replacedFilters maps a filter's name in templates to the variable that
// holds Baton's version of it.
var replacedFilters = map[string]string{"tojson": "__baton_tojson", "string": "__baton_string", "join": "__baton_join"}

// printFunc is the function every printed expression is wrapped in.
const printFunc = "__baton_print"

// prepassResult is what the pre-pass found besides the rewritten source.
type prepassResult struct {
	src string
	// formatLines are the lines with Python %-formatting.
	formatLines []int
	// tildeLines are the lines that concatenate with ~.
	tildeLines []int
	// safeAddLines are the lines that add to a value marked safe.
	safeAddLines []int
	// filterLines are the lines of a {% filter %} block of a replaced
	// filter: the engine runs its own filter there, whatever the name is.
	filterLines []int
}

// prepass rewrites src as described above. A tag that is not closed is
// copied as it is, for the engine to report.
func prepass(src string) prepassResult {
	// jinja2 turns every newline into "\n" and drops one at the very end.
	src = strings.ReplaceAll(src, "\r\n", "\n")
	src = strings.ReplaceAll(src, "\r", "\n")
	src = strings.TrimSuffix(src, "\n")
	p := &prepasser{src: src, lineStart: true}
	p.run()
	return prepassResult{src: p.out.String(), formatLines: p.formatLines, tildeLines: p.tildeLines,
		safeAddLines: p.safeAddLines, filterLines: p.filterLines}
}

type prepasser struct {
	src string
	out strings.Builder
	// lineStart: the last tag's end (with what it trimmed) ended a line,
	// or nothing came before (jinja2's line_starting, for lstrip_blocks).
	lineStart    bool
	formatLines  []int
	tildeLines   []int
	safeAddLines []int
	filterLines  []int
}

// tag kinds, by the opener's second byte.
const (
	tagExpr    = '{'
	tagBlock   = '%'
	tagComment = '#'
)

func (p *prepasser) run() {
	s := p.src
	pos := 0
	for pos < len(s) {
		open := nextOpener(s, pos)
		if open < 0 {
			p.text(s[pos:])
			return
		}
		kind := s[open+1]
		sign := byte(0)
		if open+2 < len(s) && (s[open+2] == '-' || s[open+2] == '+') {
			sign = s[open+2]
		}
		text := p.leftTrim(s[pos:open], kind, sign)
		contentStart := open + 2
		if sign != 0 {
			contentStart++
		}
		if kind == tagBlock {
			if end, ok := rawBegin(s, contentStart); ok {
				p.text(text)
				pos = p.raw(s, open, end)
				continue
			}
		}
		p.text(text)
		var end int
		switch kind {
		case tagComment:
			e := strings.Index(s[contentStart:], "#}")
			if e < 0 {
				p.out.WriteString(s[open:])
				return
			}
			e += contentStart
			rsign := byte(0)
			if e > contentStart && (s[e-1] == '-' || s[e-1] == '+') {
				rsign = s[e-1]
			}
			end = p.rightTrim(e+2, tagComment, rsign) // a comment prints nothing
		default:
			closer := "}}"
			if kind == tagBlock {
				closer = "%}"
			}
			contentEnd, rsign, ok := p.tagEnd(s, contentStart, closer, kind)
			if !ok {
				p.out.WriteString(s[open:])
				return
			}
			p.tag(s[contentStart:contentEnd], kind, lineOf(s, open))
			rlen := len(closer)
			if rsign != 0 {
				rlen++
			}
			end = p.rightTrim(contentEnd+rlen, kind, rsign)
		}
		pos = end
	}
}

// nextOpener is the index of the first "{{", "{%" or "{#" at or after pos,
// or -1.
func nextOpener(s string, pos int) int {
	for {
		i := strings.IndexByte(s[pos:], '{')
		if i < 0 || pos+i+1 >= len(s) {
			return -1
		}
		i += pos
		if c := s[i+1]; c == '{' || c == '%' || c == '#' {
			return i
		}
		pos = i + 1
	}
}

// leftTrim applies the left side of a tag to the text before it: with "-"
// all whitespace (Python's, Unicode's); for a block or a comment without
// "+", lstrip_blocks: the whitespace between the line's start and the tag
// when nothing else is there.
func (p *prepasser) leftTrim(text string, kind, sign byte) string {
	switch {
	case sign == '-':
		return strings.TrimRightFunc(text, pyIsSpace)
	case sign == '+' || kind == tagExpr:
		return text
	}
	l := strings.LastIndexByte(text, '\n') + 1
	if (l > 0 || p.lineStart) && l < len(text) && strings.TrimLeftFunc(text[l:], pyIsSpace) == "" {
		return text[:l]
	}
	return text
}

// rightTrim applies the right side of a tag whose closer ends before end:
// with "-" all whitespace after it, for a block or a comment without "+"
// trim_blocks' one newline. It returns where the text after the tag
// starts.
func (p *prepasser) rightTrim(end int, kind, sign byte) int {
	s := p.src
	switch {
	case sign == '-':
		rest := strings.TrimLeftFunc(s[end:], pyIsSpace)
		end = len(s) - len(rest)
	case sign == '+' || kind == tagExpr:
	case end < len(s) && s[end] == '\n':
		end++
	}
	p.lineStart = end > 0 && s[end-1] == '\n'
	return end
}

// tagEnd finds the closer of the tag whose content starts at i: the first
// closer outside string literals and brackets (jinja2 does not end a tag
// inside an open bracket), with the "-" or "+" (blocks only) before it.
func (p *prepasser) tagEnd(s string, i int, closer string, kind byte) (contentEnd int, sign byte, ok bool) {
	depth := 0
	for i < len(s) {
		c := s[i]
		switch {
		case c == '\'' || c == '"':
			i = stringEnd(s, i)
			continue
		case depth == 0 && (c == '-' || c == '+' && kind == tagBlock) && strings.HasPrefix(s[i+1:], closer):
			return i, c, true
		case depth == 0 && strings.HasPrefix(s[i:], closer):
			return i, 0, true
		case c == '{' || c == '(' || c == '[':
			depth++
		case (c == '}' || c == ')' || c == ']') && depth > 0:
			depth--
		}
		i++
	}
	return 0, 0, false
}

// stringEnd is the index after the string literal that opens at s[i].
func stringEnd(s string, i int) int {
	q := s[i]
	j := i + 1
	for j < len(s) && s[j] != q {
		if s[j] == '\\' {
			j++
		}
		j++
	}
	return min(j+1, len(s))
}

// rawBegin matches the rest of a `{% raw %}` opener (`raw`, then `%}` or
// `-%}`, spaces around) from i, and returns the index after it.
func rawBegin(s string, i int) (int, bool) {
	i = skipPySpace(s, i)
	if !strings.HasPrefix(s[i:], "raw") {
		return 0, false
	}
	i = skipPySpace(s, i+3)
	switch {
	case strings.HasPrefix(s[i:], "%}"):
		return i + 2, true
	case strings.HasPrefix(s[i:], "-%}"):
		rest := strings.TrimLeftFunc(s[i+3:], pyIsSpace)
		return len(s) - len(rest), true
	}
	return 0, false
}

func skipPySpace(s string, i int) int {
	rest := strings.TrimLeftFunc(s[i:], pyIsSpace)
	return len(s) - len(rest)
}

// raw copies the content of the raw block whose opener spans s[open:end]
// (no trim_blocks after it, as in jinja2) up to its {% endraw %}, as a
// string literal, and returns where the text after the block starts.
func (p *prepasser) raw(s string, open, end int) int {
	p.lineStart = end > 0 && s[end-1] == '\n'
	for i := end; ; {
		j := strings.Index(s[i:], "{%")
		if j < 0 {
			p.out.WriteString(s[open:]) // unclosed: the engine reports it
			return len(s)
		}
		j += i
		k := j + 2
		sign := byte(0)
		if k < len(s) && (s[k] == '-' || s[k] == '+') {
			sign = s[k]
			k++
		}
		k = skipPySpace(s, k)
		if !strings.HasPrefix(s[k:], "endraw") {
			i = j + 2
			continue
		}
		k = skipPySpace(s, k+len("endraw"))
		rsign := byte(0)
		if k < len(s) && (s[k] == '-' || s[k] == '+') {
			rsign = s[k]
			k++
		}
		if !strings.HasPrefix(s[k:], "%}") {
			i = j + 2
			continue
		}
		p.literal(p.leftTrim(s[end:j], tagBlock, sign))
		return p.rightTrim(k+2, tagBlock, rsign)
	}
}

// text writes text that the engine's trimming must leave as it is: its
// whitespace edges (and a "{" at its end, which would make an opener with
// the next tag) as string literals.
func (p *prepasser) text(t string) {
	isEdge := func(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }
	i := 0
	for i < len(t) && isEdge(t[i]) {
		i++
	}
	j := len(t)
	for j > i && (isEdge(t[j-1]) || t[j-1] == '{') {
		j--
	}
	p.literal(t[:i])
	p.out.WriteString(t[i:j])
	p.literal(t[j:])
}

// literal writes an expression that prints t.
func (p *prepasser) literal(t string) {
	if t == "" {
		return
	}
	p.out.WriteString(`{{ "`)
	for i := 0; i < len(t); i++ {
		if t[i] == '"' || t[i] == '\\' {
			p.out.WriteByte('\\')
		}
		p.out.WriteByte(t[i])
	}
	p.out.WriteString(`" }}`)
}

// tag writes a {{ }} or {% %} tag with the given content, its filters
// renamed and, for {{ }}, wrapped in printFunc; line is the tag's line.
func (p *prepasser) tag(content string, kind byte, line int) {
	var b strings.Builder
	i := 0
	if kind == tagBlock {
		// {% filter NAME %}: the filter's name after the keyword.
		j := skipPySpace(content, 0)
		if k := identEnd(content, j); content[j:k] == "filter" {
			b.WriteString(content[:k])
			i = k
			j = skipPySpace(content, k)
			k = identEnd(content, j)
			b.WriteString(content[i:j])
			if _, ok := replacedFilters[content[j:k]]; ok {
				p.filterLines = append(p.filterLines, line)
			}
			b.WriteString(content[j:k])
			i = k
		}
	}
	p.expr(&b, content, i, line)
	if kind == tagExpr {
		if strings.TrimSpace(b.String()) == "" {
			p.out.WriteString("{{" + b.String() + "}}")
			return
		}
		p.out.WriteString("{{ " + printFunc + "(" + b.String() + ") }}")
		return
	}
	p.out.WriteString("{% " + b.String() + " %}")
}

// expr copies the tag content s[i:] to b, renaming the replaced filters
// (`x | tojson`, `x|tojson(indent=4)`) and noting %-formatting after a
// string literal and the ~ operator. String literals are copied as they
// are.
func (p *prepasser) expr(b *strings.Builder, s string, i, line int) {
	for i < len(s) {
		c := s[i]
		switch {
		case c == '\'' || c == '"':
			end := stringEnd(s, i)
			b.WriteString(s[i:end])
			i = end
			// A literal followed by the % operator.
			if j := skipPySpace(s, i); j < len(s) && s[j] == '%' {
				p.formatLines = append(p.formatLines, line+strings.Count(s[:j], "\n"))
			}
		case c == '~':
			p.tildeLines = append(p.tildeLines, line+strings.Count(s[:i], "\n"))
			b.WriteByte(c)
			i++
		case c == '|':
			b.WriteByte('|')
			j := skipPySpace(s, i+1)
			k := identEnd(s, j)
			b.WriteString(s[i+1 : j])
			if repl, ok := replacedFilters[s[j:k]]; ok {
				b.WriteString(repl)
			} else {
				b.WriteString(s[j:k])
			}
			// "x" | safe + y: jinja2's Markup escapes y's HTML characters.
			if n := skipPySpace(s, k); s[j:k] == "safe" && n < len(s) && s[n] == '+' {
				p.safeAddLines = append(p.safeAddLines, line+strings.Count(s[:k], "\n"))
			}
			i = k
		default:
			b.WriteByte(c)
			i++
		}
	}
}

func identEnd(s string, i int) int {
	for i < len(s) && isIdentByte(s[i]) {
		i++
	}
	return i
}

func isIdentByte(c byte) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// pyIsSpace is Python's str.isspace for one character, which jinja2's
// rstrip() and \s use: Unicode's white space and the separators
// U+001C..U+001F.
func pyIsSpace(r rune) bool {
	return unicode.IsSpace(r) || r >= 0x1c && r <= 0x1f
}
