package grammar

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/baton-serving/baton/engine"
)

func mustParse(t testing.TB, src string) *Grammar {
	t.Helper()
	g, err := Parse(src)
	if err != nil {
		t.Fatalf("Parse(%q): %v", src, err)
	}
	return g
}

func jsonGrammar(t testing.TB) string {
	t.Helper()
	b, err := os.ReadFile("testdata/json.gbnf")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestParseAccepts: grammars in the notation llama.cpp accepts, each with
// sentences it must match and texts it must not.
func TestParseAccepts(t *testing.T) {
	cases := []struct {
		name, src string
		yes, no   []string
	}{
		{"literal", `root ::= "abc"`, []string{"abc"}, []string{"", "ab", "abcd", "abd"}},
		{"alternation", `root ::= "a" | "bc" | ""`, []string{"a", "bc", ""}, []string{"b", "abc"}},
		{"sequence and refs", "root ::= a b\na ::= \"x\"\nb ::= \"y\" | \"z\"", []string{"xy", "xz"}, []string{"x", "yx"}},
		{"group", `root ::= ("a" | "b") "c"`, []string{"ac", "bc"}, []string{"c", "abc"}},
		{"star", `root ::= "a"*`, []string{"", "a", "aaaa"}, []string{"b", "aab"}},
		{"plus", `root ::= [0-9]+`, []string{"0", "123"}, []string{"", "1a"}},
		{"optional", `root ::= "a"? "b"`, []string{"b", "ab"}, []string{"aab", "a"}},
		{"literal repeated whole", `root ::= "ab"+`, []string{"ab", "abab"}, []string{"a", "aba", "abb"}},
		{"exact count", `root ::= "x"{3}`, []string{"xxx"}, []string{"xx", "xxxx"}},
		{"at least", `root ::= "x"{2,}`, []string{"xx", "xxxxxxx"}, []string{"", "x"}},
		{"between", `root ::= [a-c]{1,3}`, []string{"a", "abc", "cc"}, []string{"", "abca", "d"}},
		{"at most", `root ::= "x"{0,2} "."`, []string{".", "x.", "xx."}, []string{"xxx."}},
		{"zero times", `root ::= "a" "x"{0} "b"`, []string{"ab"}, []string{"axb"}},
		{"group repeated", `root ::= ("ab" | "c"){2}`, []string{"abab", "cab", "cc"}, []string{"ab", "abcab"}},
		{"class", `root ::= [a-zA-Z_] [a-z0-9_-]*`, []string{"x", "_a-1", "Zz9"}, []string{"1a", "a$"}},
		{"negated class", `root ::= "\"" [^"\\]* "\""`, []string{`""`, `"a b"`, `"é"`}, []string{`"a"b"`, `"\"`}},
		{"any", `root ::= . .`, []string{"ab", "é\n", "日本"}, []string{"a", "abc"}},
		{"escapes", `root ::= "\n\t\r\\\"\x41\u00e9\U0001F600"`, []string{"\n\t\r\\\"Aé😀"}, []string{"\n"}},
		{"escapes in class", `root ::= [\x00-\x1F\]\[\-]`, []string{"\x01", "]", "[", "-"}, []string{"a", " "}},
		{"unicode class", `root ::= [ぁ-ゟ]+`, []string{"ひらがな"}, []string{"カ", "a"}},
		{"comments", "# a grammar\nroot ::= \"a\" # the a\n  # more\nb ::= \"b\"\n", []string{"a"}, []string{"b"}},
		{"newlines in parens", "root ::= (\n  \"a\"\n  | \"b\"\n)\n", []string{"a", "b"}, []string{"ab"}},
		{"newline after bar", "root ::= \"a\" |\n  \"b\"", []string{"a", "b"}, nil},
		{"crlf", "root ::= a\r\na ::= \"x\"\r\n", []string{"x"}, nil},
		{"right recursion", `root ::= "(" root ")" | ""`, []string{"", "()", "((()))"}, []string{"(()", ")("}},
		{"nullable tail loop", `root ::= ("a"?)* "b"`, []string{"b", "aab"}, []string{"ba"}},
		{"names with dashes", "root ::= check-mate\ncheck-mate ::= \"#\"", []string{"#"}, nil},
		{"empty class never matches", `root ::= "a" | []`, []string{"a"}, []string{""}},
		{"negated empty is any", `root ::= [^]`, []string{"x", "é"}, []string{""}},
		{"json", jsonGrammar(t),
			[]string{`{}`, `{"a": [1, -2.5e3, true, false, null, "x\u00e9y"]}`, `"héllo"`, `-0.5`, `[[], {}]`, ` 1 `},
			[]string{`{`, `{"a" 1}`, `01`, `"\x"`, "\"\x01\"", `[1,]`, `tru`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := mustParse(t, c.src)
			for _, s := range c.yes {
				if !g.MatchString(s) {
					t.Errorf("%q rejected", s)
				}
			}
			for _, s := range c.no {
				if g.MatchString(s) {
					t.Errorf("%q accepted", s)
				}
			}
		})
	}
}

// TestParseErrors: each malformed grammar is refused with an error that
// wraps engine.ErrInvalidInput, names the rule and the offset, and says
// what is wrong.
func TestParseErrors(t *testing.T) {
	cases := []struct {
		name, src string
		rule      string
		offset    int
		msg       string
	}{
		{"undefined rule", "root ::= item\n", "item", 9, `rule "item" is used but never defined`},
		{"missing root", `start ::= "a"`, "", 13, `no rule named "root"`},
		{"empty grammar", "", "", 0, `no rule named "root"`},
		{"no ::=", `root = "a"`, "root", 5, `expected "::="`},
		{"unbalanced (", `root ::= ("a" | "b"`, "root", 9, `unbalanced '('`},
		{"unbalanced )", `root ::= "a")`, "root", 12, `unbalanced ')'`},
		{"unbalanced ]", `root ::= "a"]`, "root", 12, `unbalanced ']'`},
		{"unterminated class", `root ::= [a-z`, "root", 9, `unterminated character class`},
		{"unterminated literal", `root ::= "abc`, "root", 9, `unterminated string literal`},
		{"bad escape", `root ::= "a\q"`, "root", 11, `unknown escape \q`},
		{"short hex escape", `root ::= "\x4"`, "root", 10, `needs 2 hex digits`},
		{"bad hex escape", `root ::= "\u12G4"`, "root", 10, `needs 4 hex digits`},
		{"escape beyond unicode", `root ::= "\U00110000"`, "root", 10, `beyond Unicode`},
		{"backwards range", `root ::= [z-a]`, "root", 13, `backwards`},
		{"defined twice", "root ::= a\na ::= \"x\"\na ::= \"y\"", "a", 21, `defined twice (first at offset 11)`},
		{"repetition without symbol", `root ::= *"a"`, "root", 9, `must follow a symbol`},
		{"repetition after group start", `root ::= ( +"a")`, "root", 11, `must follow a symbol`},
		{"bad count", `root ::= "a"{x}`, "root", 13, `expected a repetition count`},
		{"max below min", `root ::= "a"{3,2}`, "root", 12, `maximum is below the minimum`},
		{"count too big", `root ::= "a"{10001}`, "root", 13, `above the limit of 10000`},
		{"unclosed count", `root ::= "a"{1,2`, "root", 16, `expected '}'`},
		{"direct left recursion", "root ::= expr\nexpr ::= expr \"+\" \"1\" | \"1\"", "expr", 23, `left recursion: rule "expr"`},
		{"indirect left recursion", "root ::= a\na ::= b \"x\" | \"y\"\nb ::= a \"z\"", "a", 17, `left recursion: rule "a"`},
		{"left recursion behind a nullable", "root ::= a\na ::= \"x\"? a \"y\" | \"z\"", "a", 22, `left recursion: rule "a"`},
		{"left recursion on root", `root ::= "a" | root "a"`, "root", 15, `left recursion: rule "root"`},
		{"left recursion through a rule that can be empty", "root ::= a\na ::= \"x\" | b \"y\"\nb ::= \"z\" | opt a \"w\"\nopt ::= \"q\" | ", "a", 23, `left recursion`},
		{"two rules on a line", `root ::= "a" b ::= "c"`, "root", 15, `expected a newline`},
		{"invalid utf-8", "root ::= \"\xff\"", "root", 10, `invalid UTF-8`},
		{"name expected", "root ::= \"a\"\n::= \"b\"", "", 13, `expected a rule name`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse(c.src)
			if err == nil {
				t.Fatalf("Parse(%q) succeeded", c.src)
			}
			if !errors.Is(err, engine.ErrInvalidInput) {
				t.Errorf("error %v does not wrap engine.ErrInvalidInput", err)
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("error %T is not *Error", err)
			}
			if e.Rule != c.rule || e.Offset != c.offset {
				t.Errorf("error names rule %q at offset %d, want %q at %d (%v)", e.Rule, e.Offset, c.rule, c.offset, err)
			}
			if !strings.Contains(err.Error(), c.msg) {
				t.Errorf("error %q does not say %q", err, c.msg)
			}
		})
	}
}

// TestParseLimits: a hostile grammar is refused before it takes memory.
func TestParseLimits(t *testing.T) {
	big := "root ::= \"" + strings.Repeat("a", MaxSourceBytes) + "\""
	if _, err := Parse(big); err == nil || !strings.Contains(err.Error(), "limit") {
		t.Errorf("a %d-byte grammar: %v, want a size refusal", len(big), err)
	}
	// Nested repetitions multiply: each level's copies are references, so
	// this stays small; the element bound still stops a flat explosion.
	if _, err := Parse(`root ::= ((("a"{1000}){1000}){1000})`); err != nil {
		t.Errorf("nested repetitions: %v", err)
	}
	flat := "root ::= " + strings.Repeat(`"a"{10000} `, 30)
	if _, err := Parse(flat); err == nil || !strings.Contains(err.Error(), "elements") {
		t.Errorf("300000 elements: %v, want the element limit", err)
	}
	deep := "root ::= " + strings.Repeat("(", 600) + `"a"` + strings.Repeat(")", 600)
	if _, err := Parse(deep); err == nil || !strings.Contains(err.Error(), "nested deeper") {
		t.Errorf("600 nested parentheses: %v, want the nesting limit", err)
	}
}
