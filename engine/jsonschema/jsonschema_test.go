package jsonschema

import (
	"errors"
	"strings"
	"testing"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/grammar"
)

// TestKeywords checks, keyword by keyword, texts the grammar must accept and
// texts it must refuse.
func TestKeywords(t *testing.T) {
	bv := newByteVocab()
	cases := []struct {
		name, schema string
		accept       []string
		reject       []string
	}{
		{"null", `{"type":"null"}`, []string{"null"}, []string{"nul", "0", `"null"`}},
		{"boolean", `{"type":"boolean"}`, []string{"true", "false"}, []string{"True", "1", "null"}},
		{"integer", `{"type":"integer"}`, []string{"0", "-7", "1234567890123"}, []string{"01", "1.0", "-", "+1", "1e3"}},
		{"number", `{"type":"number"}`, []string{"0", "-0.5", "1e10", "2.5E-3", "7"}, []string{".5", "1.", "01", "1e", "NaN"}},
		{"string", `{"type":"string"}`, []string{`""`, `"a b"`, `"\"\\\/\b\f\n\r\t"`, `"\u00e9"`, `"\ud83d\ude00"`, `"é😀"`}, []string{`"a`, "\"\n\"", `"\x"`, `"\ud83d"`, `"\ude00"`}},
		{"boolean schema true", `true`, []string{"null", `{"a":[1]}`, `"s"`}, []string{"", "nope"}},
		{"minLength/maxLength", `{"type":"string","minLength":2,"maxLength":3}`, []string{`"ab"`, `"abc"`, `"\n😀"`, `"\ud83d\ude00x"`}, []string{`"a"`, `"abcd"`, `"😀"`}},
		{"enum", `{"enum":["a",1,null,[true],{"k":"v"}]}`, []string{`"a"`, "1", "null", "[true]", `{"k":"v"}`}, []string{`"b"`, "2", "true", `{"k": "v"}`}},
		{"enum filtered by type", `{"type":"string","enum":["a",1]}`, []string{`"a"`}, []string{"1"}},
		{"const", `{"const":{"a":[1,2]}}`, []string{`{"a":[1,2]}`}, []string{`{"a":[1]}`, `{}`}},
		{"integer enum keeps 4.0", `{"type":"integer","enum":[4.0,4.5]}`, []string{"4.0"}, []string{"4.5"}},
		{"type array", `{"type":["string","null"],"maxLength":1}`, []string{"null", `"x"`}, []string{`"xy"`, "0"}},
		{"minimum/maximum", `{"type":"integer","minimum":-3,"maximum":12}`, []string{"-3", "-1", "0", "9", "10", "12"}, []string{"-4", "13", "20", "-0", "100"}},
		{"exclusive bounds", `{"type":"integer","exclusiveMinimum":1,"exclusiveMaximum":100}`, []string{"2", "99", "50"}, []string{"1", "100", "0"}},
		{"open-ended minimum", `{"type":"integer","minimum":95}`, []string{"95", "99", "100", "123456"}, []string{"94", "9", "-100"}},
		{"open-ended maximum", `{"type":"integer","maximum":-95}`, []string{"-95", "-100", "-123456"}, []string{"-94", "0", "95"}},
		{"number minimum 0", `{"type":"number","minimum":0}`, []string{"0", "0.5", "3e2"}, []string{"-1", "-0.5"}},
		{"array items", `{"type":"array","items":{"type":"integer"}}`, []string{"[]", "[1]", "[1,2,3]", "[ 1, 2 ]", "[\n  1\n]"}, []string{"[1,]", "[,]", `["a"]`, "[1 2]"}},
		{"minItems/maxItems", `{"type":"array","items":{"type":"boolean"},"minItems":1,"maxItems":2}`, []string{"[true]", "[true,false]"}, []string{"[]", "[true,true,true]"}},
		{"maxItems 0", `{"type":"array","maxItems":0}`, []string{"[]"}, []string{"[1]"}},
		{"object required and order", `{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"}},"required":["a","b"],"additionalProperties":false}`,
			[]string{`{"a":1,"b":""}`, `{ "a": 1, "b": "x" }`}, []string{`{"b":"","a":1}`, `{"a":1}`, `{"a":1,"b":"","c":2}`, `{"a":1,,"b":""}`}},
		{"optional properties", `{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"},"c":{"type":"integer"}},"required":["b"],"additionalProperties":false}`,
			[]string{`{"b":1}`, `{"a":1,"b":2}`, `{"b":2,"c":3}`, `{"a":1,"b":2,"c":3}`}, []string{`{}`, `{"a":1}`, `{"a":1,"c":3}`, `{"c":3,"b":2}`, `{"b":1,}`}},
		{"all optional", `{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}},"additionalProperties":false}`,
			[]string{`{}`, `{"a":1}`, `{"b":1}`, `{"a":1,"b":2}`}, []string{`{,"b":1}`, `{"a":1,}`, `{"b":1,"a":2}`}},
		{"object without properties", `{"type":"object"}`, []string{`{}`, `{"x":[1,{"y":null}]}`}, []string{`[]`, `{"x"}`}},
		{"closed empty object", `{"type":"object","additionalProperties":false}`, []string{`{}`, `{ }`}, []string{`{"a":1}`}},
		{"additionalProperties true keeps declared", `{"type":"object","properties":{"a":{"type":"null"}},"required":["a"],"additionalProperties":true}`, []string{`{"a":null}`}, []string{`{"a":null,"b":1}`}},
		{"anyOf", `{"anyOf":[{"type":"integer"},{"type":"string","maxLength":1}]}`, []string{"1", `"a"`}, []string{`"ab"`, "null"}},
		{"oneOf disjoint", `{"oneOf":[{"type":"integer"},{"type":"null"}]}`, []string{"1", "null"}, []string{`""`}},
		{"allOf of one", `{"allOf":[{"type":"boolean"}]}`, []string{"true"}, []string{"null"}},
		{"$ref and $defs", `{"$defs":{"b":{"type":"boolean"}},"type":"array","items":{"$ref":"#/$defs/b"}}`, []string{"[true,false]"}, []string{"[1]"}},
		{"recursive $ref", `{"$defs":{"t":{"type":"array","items":{"$ref":"#/$defs/t"}}},"$ref":"#/$defs/t"}`, []string{"[]", "[[],[[]]]"}, []string{"[1]", "[[]"}},
		{"$ref to root", `{"type":"object","properties":{"c":{"$ref":"#"}},"additionalProperties":false}`, []string{`{}`, `{"c":{"c":{}}}`}, []string{`{"c":1}`}},
		{"definitions", `{"definitions":{"n":{"type":"null"}},"$ref":"#/definitions/n"}`, []string{"null"}, []string{"0"}},
		{"format uuid", `{"type":"string","format":"uuid"}`, []string{`"123e4567-e89b-12d3-a456-426614174000"`}, []string{`"123e4567e89b12d3a456426614174000"`, `"x"`}},
		{"annotations ignored", `{"type":"null","title":"t","description":"d","default":null,"examples":[null],"$schema":"https://json-schema.org/draft/2020-12/schema","$id":"urn:x","$comment":"c"}`, []string{"null"}, []string{"1"}},
		{"inferred object type", `{"properties":{"a":{"type":"null"}},"required":["a"]}`, []string{`{"a":null}`}, []string{"null"}},
		{"pattern anchored", `{"type":"string","pattern":"^[a-c]{2}\\d$"}`, []string{`"ab1"`, `"cc9"`}, []string{`"ab"`, `"abc1"`, `"xab1"`}},
		{"pattern unanchored", `{"type":"string","pattern":"b+c"}`, []string{`"bc"`, `"abbcd"`, `"x\nbc"`}, []string{`"b"`, `"cb"`}},
		{"pattern alternation and groups", `{"type":"string","pattern":"^(?:ab|c)+$|^z$"}`, []string{`"ab"`, `"cabc"`, `"z"`}, []string{`""`, `"a"`, `"zz"`}},
		{"pattern escapes", `{"type":"string","pattern":"^\\.\\\\\"\\t$"}`, []string{`".\\\"\t"`}, []string{`".\\\" "`}},
		{"pattern dot", `{"type":"string","pattern":"^.$"}`, []string{`"a"`, `"é"`, `"\""`, `"\t"`}, []string{`"\n"`, `""`, `"ab"`}},
		{"pattern negated class", `{"type":"string","pattern":"^[^a-z]$"}`, []string{`"A"`, `"1"`, `"\""`, `"\n"`}, []string{`"a"`, `"z"`}},
		{"pattern counts", `{"type":"string","pattern":"^a{2}b{1,}c{0,2}$"}`, []string{`"aab"`, `"aabbbcc"`}, []string{`"ab"`, `"aabccc"`}},
		{"pattern empty", `{"type":"string","pattern":"^$"}`, []string{`""`}, []string{`"a"`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := compile(t, tc.schema)
			for _, s := range tc.accept {
				if !bv.matches(g, s) {
					src, _ := ToGrammar([]byte(tc.schema))
					t.Errorf("grammar refuses %q; want accepted\n%s", s, src)
				}
			}
			for _, s := range tc.reject {
				if bv.matches(g, s) {
					src, _ := ToGrammar([]byte(tc.schema))
					t.Errorf("grammar accepts %q; want refused\n%s", s, src)
				}
			}
		})
	}
}

// TestErrors checks that unsupported and invalid schemas are refused with an
// *Error naming the keyword and the path, wrapping engine.ErrInvalidInput.
func TestErrors(t *testing.T) {
	cases := []struct {
		schema, keyword, path string
	}{
		{`{"type":"object","patternProperties":{"a":{}}}`, "patternProperties", "#"},
		{`{"type":"object","properties":{"a":{"type":"string","format":"email"}}}`, "format", "#/properties/a"},
		{`{"type":"object","properties":{"x/y":{"type":"number","maximum":3}}}`, "maximum", "#/properties/x~1y"},
		{`{"type":"number","multipleOf":2}`, "multipleOf", "#"},
		{`{"allOf":[{"type":"string"},{"maxLength":3}]}`, "allOf", "#"},
		{`{"not":{"type":"string"}}`, "not", "#"},
		{`{"type":"array","items":{"type":"string","pattern":"(?=a)"}}`, "pattern", "#/items"},
		{`{"type":"string","pattern":"\\bword"}`, "pattern", "#"},
		{`{"type":"string","pattern":"(a)\\1"}`, "pattern", "#"},
		{`{"type":"string","pattern":"a^b"}`, "pattern", "#"},
		{`{"type":"string","pattern":"a**"}`, "pattern", "#"},
		{`{"type":"string","pattern":"[a"}`, "pattern", "#"},
		{`{"type":"string","pattern":"\\p{L}"}`, "pattern", "#"},
		{`{"type":"string","pattern":"a","maxLength":3}`, "pattern", "#"},
		{`{"type":"object","additionalProperties":{"type":"string"}}`, "additionalProperties", "#"},
		{`{"type":"object","properties":{"a":{}},"required":["b"]}`, "required", "#"},
		{`{"type":"array","prefixItems":[{}]}`, "prefixItems", "#"},
		{`{"type":"array","uniqueItems":true}`, "uniqueItems", "#"},
		{`{"type":"array","minItems":3,"maxItems":2}`, "maxItems", "#"},
		{`{"type":"string","maxLength":-1}`, "maxLength", "#"},
		{`{"type":"string","maxLength":100000}`, "maxLength", "#"},
		{`{"type":"strin"}`, "type", "#"},
		{`{"type":["string","string"]}`, "type", "#"},
		{`{"$ref":"https://example.com/s.json"}`, "$ref", "#"},
		{`{"$ref":"#/$defs/missing"}`, "$ref", "#"},
		{`{"$ref":"#"}`, "$ref", "#"},
		{`{"$defs":{"a":{"anyOf":[{"$ref":"#/$defs/a"},{"type":"null"}]}},"$ref":"#/$defs/a"}`, "$ref", "#/$defs/a"},
		{`{"$ref":"#/$defs/a","type":"object","$defs":{"a":{}}}`, "type", "#"},
		{`{"oneOf":[{"type":"integer"},{"type":"number"}]}`, "oneOf", "#"},
		{`{"oneOf":[{"const":1},{"enum":[1.0,2]}]}`, "oneOf", "#"},
		{`{"enum":[]}`, "enum", "#"},
		{`{"type":"string","enum":[1,2]}`, "enum", "#"},
		{`{"const":1,"enum":[2]}`, "const", "#"},
		{`{"enum":["a"],"maxLength":2}`, "maxLength", "#"},
		{`{"properties":{},"items":{}}`, "type", "#"},
		{`{"type":"integer","minimum":1e30}`, "minimum", "#"},
		{`{"type":"integer","minimum":1e999999999}`, "minimum", "#"},
		{`{"type":"integer","minimum":5,"maximum":4}`, "maximum", "#"},
		{`{"nullable":true}`, "nullable", "#"},
		{`{"type":"object","type":"string"}`, "type", "#"},
		{`{"anyOf":[false]}`, "", "#/anyOf/0"},
		{`{"properties":{"a":3}}`, "", "#/properties/a"},
		{`{"type":"object"`, "", "#"},
		{`{} {}`, "", "#"},
		{`"string"`, "", "#"},
	}
	for _, tc := range cases {
		_, err := ToGrammar([]byte(tc.schema))
		var e *Error
		if !errors.As(err, &e) {
			t.Errorf("ToGrammar(%s) = %v; want an *Error", tc.schema, err)
			continue
		}
		if !errors.Is(err, engine.ErrInvalidInput) {
			t.Errorf("ToGrammar(%s): %v does not wrap engine.ErrInvalidInput", tc.schema, err)
		}
		if e.Keyword != tc.keyword || e.Path != tc.path {
			t.Errorf("ToGrammar(%s): keyword %q path %q (%v); want keyword %q path %q", tc.schema, e.Keyword, e.Path, err, tc.keyword, tc.path)
		}
		if tc.keyword != "" && !strings.Contains(err.Error(), tc.keyword) {
			t.Errorf("ToGrammar(%s): message %q does not name %q", tc.schema, err, tc.keyword)
		}
	}
}

// TestLimits checks the size bounds: an oversized or deeply nested schema,
// and length bounds that would blow up the grammar, are refused.
func TestLimits(t *testing.T) {
	big := `{"type":"string","description":"` + strings.Repeat("x", MaxSchemaBytes) + `"}`
	deep := strings.Repeat(`{"type":"array","items":`, MaxDepth+1) + `true` + strings.Repeat("}", MaxDepth+1)
	var props []string
	for i := range 100 {
		props = append(props, `"p`+itoa(i)+`":{"type":"string","maxLength":1000}`)
	}
	many := `{"type":"object","properties":{` + strings.Join(props, ",") + `}}`
	for name, s := range map[string]string{"bytes": big, "depth": deep, "repeat budget": many} {
		if _, err := ToGrammar([]byte(s)); !errors.Is(err, engine.ErrInvalidInput) {
			t.Errorf("%s: ToGrammar = %v; want ErrInvalidInput", name, err)
		}
	}
}

// TestAnyObject checks the json_object grammar: objects only, bounded
// whitespace, nothing around the object.
func TestAnyObject(t *testing.T) {
	g, err := grammar.Parse(AnyObject)
	if err != nil {
		t.Fatal(err)
	}
	bv := newByteVocab()
	for _, s := range []string{`{}`, `{"a":1}`, `{"a":[1,{"b":null}],"c":"d"}`, "{\n  \"a\": true\n}", `{ "x" : -1.5e3 }`} {
		if !bv.matches(g, s) {
			t.Errorf("AnyObject refuses %q", s)
		}
	}
	for _, s := range []string{`[]`, `1`, ` {}`, `{} `, `{"a":1,}`, "{" + strings.Repeat(" ", 22) + "}", "{\n\n}"} {
		if bv.matches(g, s) {
			t.Errorf("AnyObject accepts %q", s)
		}
	}
}

// TestWhitespaceBounded checks that no grammar lets whitespace run on: at
// every point at most 21 whitespace bytes in a row are allowed.
func TestWhitespaceBounded(t *testing.T) {
	bv := newByteVocab()
	g := compile(t, `{"type":"object","properties":{"a":{"type":"array"}},"required":["a"],"additionalProperties":false}`)
	m := g.NewMatcher(bv.v)
	for _, b := range []byte(`{"a":[`) {
		if err := m.Accept(int32(b)); err != nil {
			t.Fatal(err)
		}
	}
	n := 0
	for m.Allows(' ') || m.Allows('\t') || m.Allows('\n') {
		id := int32(' ')
		if n == 0 {
			id = '\n'
		}
		if err := m.Accept(id); err != nil {
			t.Fatal(err)
		}
		n++
		if n > 100 {
			t.Fatal("whitespace is unbounded")
		}
	}
	if n != 21 {
		t.Errorf("%d whitespace bytes in a row allowed; want 21 (newline + 20)", n)
	}
}

// TestPropertyOrderIsSchemaOrder checks that members come out in the
// schema's order, not sorted.
func TestPropertyOrderIsSchemaOrder(t *testing.T) {
	bv := newByteVocab()
	g := compile(t, `{"type":"object","properties":{"z":{"type":"null"},"a":{"type":"null"}},"required":["a","z"],"additionalProperties":false}`)
	if !bv.matches(g, `{"z":null,"a":null}`) || bv.matches(g, `{"a":null,"z":null}`) {
		t.Error("members are not in schema order")
	}
}

// TestAmbiguousPatternBounded: a short pattern whose nested optional
// repetitions fork into millions of parse paths, ((a?){2}){2}... 22 levels
// deep (once 12 s to match three characters), costs each character a
// bounded closure: the stack nodes the grammar interns stay within the
// per-transition budget, and the string's text is refused (too ambiguous
// to follow) rather than followed in part.
func TestAmbiguousPatternBounded(t *testing.T) {
	src, err := ToGrammar([]byte(hostilePattern))
	if err != nil {
		t.Fatalf("ToGrammar: %v", err)
	}
	g, err := grammar.Parse(src)
	if err != nil {
		t.Fatal(err)
	}
	if g.MatchString(`"aaa"`) {
		t.Error(`"aaa" matches a grammar too ambiguous to follow`)
	}
	if _, nodes, _, _ := g.CacheStats(); nodes > 1<<20 {
		t.Fatalf("matching 5 characters interned %d stack nodes, want at most %d", nodes, 1<<20)
	}
}

// hostilePattern is TestAmbiguousPatternBounded's schema (also a fuzz seed).
var hostilePattern = `{"type":"string","pattern":"^` + strings.Repeat("(", 22) + "a?" + strings.Repeat("){2}", 22) + `$"}`

// TestHugeCount: a count too large to read ("maxLength": 1e5000) is
// reported as above the supported maximum, not as not an integer; a
// negative or fractional one is still not a non-negative integer.
func TestHugeCount(t *testing.T) {
	for schema, want := range map[string]string{
		`{"type":"string","maxLength":1e5000}`:  "above the supported maximum",
		`{"type":"string","maxLength":1E+999}`:  "above the supported maximum",
		`{"type":"string","maxLength":-1e5000}`: "non-negative integer",
		`{"type":"string","maxLength":1e-5000}`: "non-negative integer",
		`{"type":"string","maxLength":2.5}`:     "non-negative integer",
	} {
		_, err := ToGrammar([]byte(schema))
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "maxLength") {
			t.Errorf("%s: %v, want it to say %q", schema, err, want)
		}
	}
}
