package openai

import (
	"fmt"
	"strings"
)

// forcingGrammar is the GBNF that makes the model call a tool: the family's
// call syntax, a call object {"name": <const>, "arguments": <schema>} per
// allowed tool (an alternation), one call or — with parallel_tool_calls —
// one or more. Each tool's parameters grammar (engine/jsonschema) has its
// rules renamed apart ("t<i>-" prefix) so that they combine.
func forcingGrammar(ts *toolSetup) (string, error) {
	var b strings.Builder
	var alts []string
	for i, t := range ts.tools {
		if ts.choice == "function" && t.Name != ts.named {
			continue
		}
		prefix := fmt.Sprintf("t%d-", i)
		renamed, err := renameRules(ts.grammars[i], prefix)
		if err != nil {
			return "", fmt.Errorf("tool %q: %w", t.Name, err)
		}
		key := "arguments"
		if ts.family == familyLlama3 {
			key = "parameters"
		}
		fmt.Fprintf(&b, "call-%d ::= %s %sroot %s\n", i, gbnfLiteral(`{"name": "`+t.Name+`", "`+key+`": `), prefix, gbnfLiteral("}"))
		b.WriteString(renamed)
		b.WriteByte('\n')
		alts = append(alts, fmt.Sprintf("call-%d", i))
	}
	if len(alts) == 0 {
		return "", fmt.Errorf("no tool to call")
	}
	fmt.Fprintf(&b, "call ::= %s\n", strings.Join(alts, " | "))
	var root string
	switch ts.family {
	case familyHermes:
		one := gbnfLiteral(hermesOpen+"\n") + " call " + gbnfLiteral("\n"+hermesClose)
		root = one
		if !ts.single {
			root = one + " ( " + gbnfLiteral("\n") + " " + one + " )*"
		}
	case familyLlama3:
		root = "call"
		if !ts.single {
			root = "call ( " + gbnfLiteral("; ") + " call )*"
		}
	case familyMistral:
		// The [TOOL_CALLS] marker is a control token, which a grammar
		// cannot produce; the bare array parses the same.
		root = gbnfLiteral("[") + " call ( " + gbnfLiteral(", ") + " call )* " + gbnfLiteral("]")
		if ts.single {
			root = gbnfLiteral("[") + " call " + gbnfLiteral("]")
		}
	default:
		root = "call"
		if !ts.single {
			root = gbnfLiteral("[") + " call ( " + gbnfLiteral(", ") + " call )* " + gbnfLiteral("]")
		}
	}
	return "root ::= " + root + "\n" + b.String(), nil
}

// gbnfLiteral quotes s as a GBNF string literal.
func gbnfLiteral(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// renameRules prefixes every rule name of GBNF source src — definitions
// and references — leaving string literals, character classes, repetition
// counts and comments alone.
func renameRules(src, prefix string) (string, error) {
	var b strings.Builder
	isWord := func(c byte) bool {
		return c == '-' || c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
	}
	for i := 0; i < len(src); {
		c := src[i]
		switch {
		case c == '"' || c == '[':
			end := byte('"')
			if c == '[' {
				end = ']'
			}
			j := i + 1
			for ; j < len(src) && src[j] != end; j++ {
				if src[j] == '\\' {
					j++
				}
			}
			if j >= len(src) {
				return "", fmt.Errorf("unterminated %c at offset %d", c, i)
			}
			b.WriteString(src[i : j+1])
			i = j + 1
		case c == '{':
			j := strings.IndexByte(src[i:], '}')
			if j < 0 {
				return "", fmt.Errorf("unterminated { at offset %d", i)
			}
			b.WriteString(src[i : i+j+1])
			i += j + 1
		case c == '#':
			j := strings.IndexByte(src[i:], '\n')
			if j < 0 {
				j = len(src) - i
			}
			b.WriteString(src[i : i+j])
			i += j
		case isWord(c):
			j := i
			for j < len(src) && isWord(src[j]) {
				j++
			}
			b.WriteString(prefix)
			b.WriteString(src[i:j])
			i = j
		default:
			b.WriteByte(c)
			i++
		}
	}
	return b.String(), nil
}
