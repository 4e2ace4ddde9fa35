package openai

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/baton-serving/baton/engine/grammar"
	"github.com/baton-serving/baton/engine/jsonschema"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
)

func declaredOf(names ...string) func(string) bool {
	return func(n string) bool {
		for _, m := range names {
			if m == n {
				return true
			}
		}
		return false
	}
}

func TestDetectFamily(t *testing.T) {
	for file, want := range map[string]toolFamily{
		"llama3.jinja":  familyLlama3,
		"qwen25.jinja":  familyHermes,
		"qwen3.jinja":   familyHermes,
		"mistral.jinja": familyMistral,
	} {
		if got := detectFamily(readTemplate(t, file)); got != want {
			t.Errorf("%s: family %v, want %v", file, got, want)
		}
	}
	if got := detectFamily(""); got != familyGeneric {
		t.Errorf("plain default: %v", got)
	}
}

func TestParseToolCalls(t *testing.T) {
	w := parsedCall{Name: "get_weather", Arguments: `{"city": "Paris"}`}
	tm := parsedCall{Name: "get_time", Arguments: `{"tz":"CET"}`}
	decl := declaredOf("get_weather", "get_time")
	cases := []struct {
		name    string
		fam     toolFamily
		text    string
		content string
		calls   []parsedCall // nil: no call, the text is content
	}{
		{"llama parameters", familyLlama3, `{"name": "get_weather", "parameters": {"city": "Paris"}}`, "", []parsedCall{w}},
		{"llama python_tag", familyLlama3, "<|python_tag|>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}", "", []parsedCall{w}},
		{"llama several", familyLlama3, `{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", "parameters": {"tz":"CET"}}`, "", []parsedCall{w, tm}},
		{"llama prose", familyLlama3, "The weather is nice.", "The weather is nice.", nil},
		{"llama unknown tool", familyLlama3, `{"name": "launch", "parameters": {}}`, `{"name": "launch", "parameters": {}}`, nil},
		{"llama trailing prose", familyLlama3, `{"name": "get_weather", "parameters": {"city": "Paris"}} and more`, `{"name": "get_weather", "parameters": {"city": "Paris"}} and more`, nil},
		{"hermes one", familyHermes, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", "", []parsedCall{w}},
		{"hermes text before", familyHermes, "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", "Let me look.", []parsedCall{w}},
		{"hermes two, last unclosed", familyHermes, "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}</tool_call>\n<tool_call>{\"name\": \"get_time\", \"arguments\": {\"tz\":\"CET\"}}", "", []parsedCall{w, tm}},
		{"hermes broken", familyHermes, "<tool_call>{\"name\": \"get_weather\", \"arguments\": {</tool_call>", "<tool_call>{\"name\": \"get_weather\", \"arguments\": {</tool_call>", nil},
		{"hermes broken second block", familyHermes, "<tool_call>{\"name\": \"get_time\", \"arguments\": {\"tz\":\"CET\"}}</tool_call> <tool_call>{oops</tool_call> bye", "", []parsedCall{tm}},
		{"hermes undeclared first block", familyHermes, "<tool_call>{\"name\": \"launch\"}</tool_call><tool_call>{\"name\": \"get_time\", \"arguments\": {\"tz\":\"CET\"}}</tool_call>", "<tool_call>{\"name\": \"launch\"}</tool_call><tool_call>{\"name\": \"get_time\", \"arguments\": {\"tz\":\"CET\"}}</tool_call>", nil},
		{"hermes arguments as string", familyHermes, "<tool_call>{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}</tool_call>", "", []parsedCall{w}},
		{"mistral array", familyMistral, `[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {"tz":"CET"}}]`, "", []parsedCall{w, tm}},
		{"mistral marker decoded to nothing", familyMistral, ` [{"name": "get_weather", "arguments": {"city": "Paris"}}]`, "", []parsedCall{w}},
		{"mistral ARGS form", familyMistral, `[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{"tz":"CET"}`, "", []parsedCall{w, tm}},
		{"generic object", familyGeneric, ` {"name": "get_weather", "arguments": {"city": "Paris"}} `, "", []parsedCall{w}},
		{"generic list", familyGeneric, `[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {"tz":"CET"}}]`, "", []parsedCall{w, tm}},
		{"generic no arguments", familyGeneric, `{"name": "get_time"}`, "", []parsedCall{{Name: "get_time", Arguments: "{}"}}},
		{"generic arguments not an object", familyGeneric, `{"name": "get_time", "arguments": 3}`, `{"name": "get_time", "arguments": 3}`, nil},
		{"generic empty list", familyGeneric, `[]`, `[]`, nil},
		{"generic extra key", familyGeneric, `{"name": "get_time", "query": "x"}`, `{"name": "get_time", "query": "x"}`, nil},
		{"llama extra key", familyLlama3, `{"name": "get_weather", "parameters": {"city": "Paris"}, "note": 1}`, `{"name": "get_weather", "parameters": {"city": "Paris"}, "note": 1}`, nil},
		{"generic type and id", familyGeneric, `{"type": "function", "id": "c1", "name": "get_time", "arguments": {"tz":"CET"}}`, "", []parsedCall{tm}},
		{"hermes trailing text", familyHermes, "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}</tool_call>\nDone.", "Done.", []parsedCall{w}},
		{"hermes text around", familyHermes, "Let me look.\n<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}</tool_call>\n Done.", "Let me look.\nDone.", []parsedCall{w}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			content, calls, ok := parseToolCalls(c.fam, c.text, decl)
			if ok != (c.calls != nil) || content != c.content || !reflect.DeepEqual(calls, c.calls) {
				t.Errorf("parse = %q %+v %v; want %q %+v", content, calls, ok, c.content, c.calls)
			}
			// Streamed in pieces, the same split.
			for _, size := range []int{1, 3, 7, len(c.text)} {
				sc, scalls := streamSplit(c.fam, c.text, size, "get_weather", "get_time")
				want := c.content
				if c.calls == nil {
					want = c.text
				}
				if sc != want || !reflect.DeepEqual(scalls, c.calls) {
					t.Errorf("streamed by %d: %q %+v; want %q %+v", size, sc, scalls, want, c.calls)
				}
			}
		})
	}
}

// streamSplit feeds text to a toolStream in pieces of size bytes and
// returns the content it sent and the calls it found.
func streamSplit(fam toolFamily, text string, size int, declared ...string) (string, []parsedCall) {
	ts := &toolSetup{family: fam, choice: "auto"}
	for _, n := range declared {
		ts.tools = append(ts.tools, ToolDef{Name: n})
	}
	s := newToolStream(ts)
	var b strings.Builder
	var calls []parsedCall
	for i := 0; i < len(text); i += size {
		content, cs := s.push(text[i:min(i+size, len(text))])
		b.WriteString(content)
		calls = append(calls, cs...)
	}
	rest, cs := s.finish()
	b.WriteString(rest)
	return b.String(), append(calls, cs...)
}

// FuzzParseToolCalls: no input panics the parsers; a call they return names
// a declared tool and carries a JSON object as arguments; streaming the same
// text in arbitrary pieces splits it into the same content and calls; the
// forced-call streamer's deltas stay in order on any text.
func FuzzParseToolCalls(f *testing.F) {
	for _, s := range []string{
		`{"name": "f", "parameters": {"a": 1}}`,
		"<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
		"hi <tool_call>{\"name\": \"g\", \"arguments\": {\"x\": [1, {\"y\": null}]}}</tool_call><tool_call>",
		`[TOOL_CALLS][{"name": "f", "arguments": {"a": "b"}}]`,
		`[TOOL_CALLS]f[ARGS]{"a": 1}`,
		`[{"name": "f", "arguments": {}}, {"name": "g"}]`,
		"<|python_tag|>{\"name\": \"f\"}; {\"name\": \"g\", \"arguments\": \"{}\"}",
		"plain text <tool_c",
		"",
	} {
		f.Add(s, uint8(0), uint8(3))
		f.Add(s, uint8(1), uint8(1))
		f.Add(s, uint8(2), uint8(5))
		f.Add(s, uint8(3), uint8(2))
	}
	decl := declaredOf("f", "g")
	f.Fuzz(func(t *testing.T, text string, fam, size uint8) {
		family := toolFamily(fam % 4)
		content, calls, ok := parseToolCalls(family, text, decl)
		if ok {
			for _, c := range calls {
				if !decl(c.Name) || !isObject([]byte(c.Arguments)) {
					t.Fatalf("call %+v from %q", c, text)
				}
			}
		} else if content != text || calls != nil {
			t.Fatalf("no call, but content %q calls %v", content, calls)
		}
		n := int(size%16) + 1
		sc, scalls := streamSplit(family, text, n, "f", "g")
		want := content
		if !ok {
			want = text
		}
		if sc != want || !reflect.DeepEqual(scalls, calls) {
			t.Fatalf("streamed by %d: %q %+v; whole: %q %+v", n, sc, scalls, want, calls)
		}
		// The forced-call streamer takes any text too: its deltas
		// begin calls in order and add to the last one begun.
		fs := &forcedStream{ts: &toolSetup{family: family, choice: "required", tools: []ToolDef{{Name: "f"}, {Name: "g"}}}}
		begun := 0
		check := func(ds []toolCallDelta) {
			for _, d := range ds {
				if d.ID != "" {
					if d.Index != begun {
						t.Fatalf("call %d begun after %d", d.Index, begun)
					}
					begun++
				} else if d.Index != begun-1 {
					t.Fatalf("fragment of call %d after %d began", d.Index, begun)
				}
			}
		}
		for i := 0; i < len(text); i += n {
			check(fs.push(text[i:min(i+n, len(text))]))
		}
		_, rest, _, _ := fs.finish()
		check(rest)
	})
}

func TestRenameRules(t *testing.T) {
	src := "root ::= object\nobject ::= \"{\" ws (string ws \":\" ws value)? \"}\" # a comment with words\n" +
		`char ::= [^\x22\x5C] | "\\" [a-z]` + "\nws ::= [ ]{0,20}\n"
	got, err := renameRules(src, "t3-")
	if err != nil {
		t.Fatal(err)
	}
	want := "t3-root ::= t3-object\nt3-object ::= \"{\" t3-ws (t3-string t3-ws \":\" t3-ws t3-value)? \"}\" # a comment with words\n" +
		`t3-char ::= [^\x22\x5C] | "\\" [a-z]` + "\nt3-ws ::= [ ]{0,20}\n"
	if got != want {
		t.Errorf("renamed\n%s\nwant\n%s", got, want)
	}
	if _, err := renameRules(`a ::= "x`, "p-"); err == nil {
		t.Error("an unterminated literal was renamed")
	}
}

// TestForcingGrammar: the grammar that forces a call compiles with
// engine/grammar, accepts exactly the family's call syntax with arguments
// matching the schema, and what it accepts parses back to the call.
func TestForcingGrammar(t *testing.T) {
	weather := `{"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city", "days"], "additionalProperties": false}`
	timeP := `{"type": "object", "properties": {"tz": {"enum": ["CET", "UTC"]}}, "required": ["tz"], "additionalProperties": false}`
	setup := func(fam toolFamily, choice, named string, parallel bool) *toolSetup {
		ts := &toolSetup{family: fam, choice: choice, named: named, single: !parallel,
			tools: []ToolDef{{Name: "get_weather", Parameters: json.RawMessage(weather)}, {Name: "get_time", Parameters: json.RawMessage(timeP)}}}
		for _, td := range ts.tools {
			g, err := jsonschema.ToGrammar(td.Parameters)
			if err != nil {
				t.Fatal(err)
			}
			ts.grammars = append(ts.grammars, g)
		}
		return ts
	}
	w := `{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}`
	wl := `{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}`
	tm := `{"name": "get_time", "arguments": {"tz": "UTC"}}`
	cases := []struct {
		name          string
		ts            *toolSetup
		accept, refus []string
	}{
		{"hermes required parallel", setup(familyHermes, "required", "", true),
			[]string{"<tool_call>\n" + w + "\n</tool_call>", "<tool_call>\n" + w + "\n</tool_call>\n<tool_call>\n" + tm + "\n</tool_call>"},
			[]string{w, "<tool_call>\n" + `{"name": "get_weather", "arguments": {"city": "Paris"}}` + "\n</tool_call>", "<tool_call>\n" + `{"name": "nope", "arguments": {}}` + "\n</tool_call>"}},
		{"hermes named single", setup(familyHermes, "function", "get_time", false),
			[]string{"<tool_call>\n" + tm + "\n</tool_call>"},
			[]string{"<tool_call>\n" + w + "\n</tool_call>", "<tool_call>\n" + tm + "\n</tool_call>\n<tool_call>\n" + tm + "\n</tool_call>", "<tool_call>\n" + `{"name": "get_time", "arguments": {"tz": "PST"}}` + "\n</tool_call>"}},
		{"llama", setup(familyLlama3, "required", "", true), []string{wl, wl + "; " + wl}, []string{w}},
		{"mistral", setup(familyMistral, "required", "", true), []string{"[" + w + "]", "[" + w + ", " + tm + "]"}, []string{w}},
		{"generic single", setup(familyGeneric, "required", "", false), []string{w, tm}, []string{"[" + w + "]"}},
		{"generic parallel", setup(familyGeneric, "required", "", true), []string{"[" + w + "]", "[" + tm + ", " + w + "]"}, []string{w}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src, err := forcingGrammar(c.ts)
			if err != nil {
				t.Fatal(err)
			}
			g, err := grammar.Parse(src)
			if err != nil {
				t.Fatalf("%v\n%s", err, src)
			}
			for _, s := range c.accept {
				if !g.MatchString(s) {
					t.Errorf("refused %q", s)
				}
				if _, calls, ok := parseToolCalls(c.ts.family, s, c.ts.declared); !ok || len(calls) == 0 {
					t.Errorf("accepted %q does not parse back", s)
				}
			}
			for _, s := range c.refus {
				if g.MatchString(s) {
					t.Errorf("accepted %q", s)
				}
			}
		})
	}
}

// TestToolStreamHoldsMarkerPrefix: content is streamed as it comes except a
// tail that may open a call; a Hermes call goes out as its block closes.
func TestToolStreamHoldsMarkerPrefix(t *testing.T) {
	push := func(s *toolStream, text string) string {
		t.Helper()
		content, calls := s.push(text)
		if calls != nil {
			t.Errorf("push(%q) sent calls %+v", text, calls)
		}
		return content
	}
	s := newToolStream(&toolSetup{family: familyHermes, choice: "auto", tools: []ToolDef{{Name: "f"}}})
	if got := push(s, "Sure. <tool"); got != "Sure." {
		t.Errorf("push = %q, want the text before the marker's prefix", got)
	}
	if got := push(s, "box> is a word"); got != " <toolbox> is a word" {
		t.Errorf("push = %q: a prefix that did not become the marker is content", got)
	}
	h := newToolStream(&toolSetup{family: familyHermes, choice: "auto", tools: []ToolDef{{Name: "f"}}})
	if got := push(h, "Let me see. <tool_call>\n{\"name\": \"f\", \"argu"); got != "Let me see." {
		t.Errorf("push = %q", got)
	}
	if content, calls := h.push("ments\": {}}\n</tool_call>\n<tool_"); content != "" || len(calls) != 1 || calls[0].Name != "f" {
		t.Errorf("the closed block was not sent: %q %+v", content, calls)
	}
	if content, calls := h.finish(); content != "" || calls != nil {
		t.Errorf("finish = %q %+v", content, calls)
	}
	g := newToolStream(&toolSetup{family: familyGeneric, choice: "auto", tools: []ToolDef{{Name: "f"}}})
	if push(g, "  ") != "" || push(g, ` {"na`) != "" || push(g, `me": "f"}`) != "" {
		t.Error("a JSON start was streamed as content")
	}
	if content, calls := g.finish(); content != "" || len(calls) != 1 || calls[0].Name != "f" {
		t.Errorf("finish = %q %+v", content, calls)
	}
	p := newToolStream(&toolSetup{family: familyGeneric, choice: "auto", tools: []ToolDef{{Name: "f"}}})
	if got := push(p, " Once"); got != " Once" {
		t.Errorf("prose held back: %q", got)
	}
}

func TestCallID(t *testing.T) {
	id := callID(familyHermes)
	if !strings.HasPrefix(id, "call_") || len(id) != 29 {
		t.Errorf("id %q", id)
	}
	if id == callID(familyHermes) {
		t.Error("two ids alike")
	}
	if m := callID(familyMistral); len(m) != 9 {
		t.Errorf("mistral id %q: the template wants 9 characters", m)
	}
}

func readTemplate(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "templates", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestForcedStream: a forced reply streams each call's name as soon as it
// is complete and its arguments in fragments as they come; put together,
// the deltas are the calls the whole reply parses to, however the text is
// split.
func TestForcedStream(t *testing.T) {
	w := `{"name": "get_weather", "arguments": {"city": "Pa\"ris}", "tags": [{"a": 1}, []]}}`
	wl := `{"name": "get_weather", "parameters": {"city": "Paris"}}`
	tm := `{"name": "get_time", "arguments": {"tz": "UTC"}}`
	for _, c := range []struct {
		fam  toolFamily
		text string
	}{
		{familyHermes, "<tool_call>\n" + w + "\n</tool_call>\n<tool_call>\n" + tm + "\n</tool_call>"},
		{familyLlama3, wl + "; " + wl},
		{familyMistral, "[" + w + ", " + tm + "]"},
		{familyGeneric, tm},
		{familyGeneric, "[" + tm + ", " + w + "]"},
	} {
		ts := &toolSetup{family: c.fam, choice: "required", tools: []ToolDef{{Name: "get_weather"}, {Name: "get_time"}}}
		_, want, ok := parseToolCalls(c.fam, c.text, ts.declared)
		if !ok {
			t.Fatalf("%q does not parse", c.text)
		}
		for _, size := range []int{1, 2, 5, 13, len(c.text)} {
			s := &forcedStream{ts: ts}
			var got []parsedCall
			frags := 0
			add := func(ds []toolCallDelta) {
				for _, d := range ds {
					switch {
					case d.Index == len(got) && d.ID != "" && d.Function.Name != "":
						got = append(got, parsedCall{Name: d.Function.Name})
					case d.Index == len(got)-1 && d.ID == "" && d.Function.Name == "":
						got[d.Index].Arguments += d.Function.Arguments
						frags++
					default:
						t.Fatalf("delta %+v after %d calls", d, len(got))
					}
				}
			}
			for i := 0; i < len(c.text); i += size {
				add(s.push(c.text[i:min(i+size, len(c.text))]))
			}
			content, rest, calls, complete := s.finish()
			add(rest)
			if content != "" || calls != len(want) || !complete || !reflect.DeepEqual(got, want) {
				t.Errorf("%v by %d: %q %+v %d %v; want %+v", c.fam, size, content, got, calls, complete, want)
			}
			if size == 1 && frags <= len(want) {
				t.Errorf("%v: arguments in %d fragments: not streamed as they came", c.fam, frags)
			}
		}
	}
	// A reply that is no call at all (a worker that ignored the grammar)
	// is content.
	s := &forcedStream{ts: &toolSetup{family: familyGeneric, choice: "required", tools: []ToolDef{{Name: "f"}}}}
	if d := s.push("Once upon a time"); d != nil {
		t.Errorf("deltas %v", d)
	}
	if content, _, calls, _ := s.finish(); content != "Once upon a time" || calls != 0 {
		t.Errorf("finish = %q, %d calls", content, calls)
	}
}

// TestForcedCallExcludesOtherConstraints: a forced call sets the grammar
// (the generic family, parallel calls by default: a JSON array of calls),
// and cannot share the output with response_format or grammar, which set
// it too.
func TestForcedCallExcludesOtherConstraints(t *testing.T) {
	plain, err := NewChatTemplate("", "", "")
	if err != nil {
		t.Fatal(err)
	}
	h := &Handler{tmpl: plain}
	tools := json.RawMessage(`[{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"], "additionalProperties": false}}}]`)
	for _, c := range []struct {
		name, choice, preset string
		wantErr              bool
	}{
		{"required", `"required"`, "", false},
		{"named", `{"type": "function", "function": {"name": "f"}}`, "", false},
		{"auto", `"auto"`, "", false},
		{"required with a grammar", `"required"`, `root ::= "x"`, true},
		{"auto with a grammar", `"auto"`, `root ::= "x"`, false},
	} {
		j := &job{req: &batonv1.GenerateRequest{Sampling: &batonv1.SamplingParams{Grammar: c.preset}}}
		herr := h.applyTools(&chatRequest{Tools: tools, ToolChoice: json.RawMessage(c.choice)}, j)
		if (herr != nil) != c.wantErr || (herr != nil && herr.param != "tool_choice") {
			t.Errorf("%s: %+v", c.name, herr)
			continue
		}
		forced := c.choice != `"auto"`
		if herr == nil && forced {
			g, err := grammar.Parse(j.req.Sampling.GetGrammar())
			if err != nil || !g.MatchString(`[{"name": "f", "arguments": {"a": true}}]`) {
				t.Errorf("%s: the forcing grammar %v\n%s", c.name, err, j.req.Sampling.GetGrammar())
			}
		}
		if herr == nil && !forced && j.req.Sampling.GetGrammar() != c.preset {
			t.Errorf("%s: auto changed the grammar to %q", c.name, j.req.Sampling.GetGrammar())
		}
	}
}

// TestToolParametersAnyObject: a tool whose parameters are {} or absent
// takes any JSON object (what a forced call's arguments may be).
func TestToolParametersAnyObject(t *testing.T) {
	for _, fn := range []string{`{"name": "f", "parameters": {}}`, `{"name": "f"}`} {
		_, g, herr := parseTool(0, json.RawMessage(`{"type": "function", "function": `+fn+`}`))
		if herr != nil {
			t.Fatalf("%s: %v", fn, herr.message)
		}
		if g != jsonschema.AnyObject {
			t.Errorf("%s: grammar %q, want jsonschema.AnyObject", fn, g)
		}
	}
}

// TestWithPreamble: the tools preamble goes in front of the system
// message, else of the first user message — never into an assistant or
// tool turn — else into a system message of its own.
func TestWithPreamble(t *testing.T) {
	for _, c := range []struct {
		name string
		in   []Message
		want []Message
	}{
		{"system", []Message{{Role: "system", Content: "S"}, {Role: "user", Content: "U"}},
			[]Message{{Role: "system", Content: "P\n\nS"}, {Role: "user", Content: "U"}}},
		{"user first", []Message{{Role: "user", Content: "U"}}, []Message{{Role: "user", Content: "P\n\nU"}}},
		{"assistant first", []Message{{Role: "assistant", Content: "A"}, {Role: "user", Content: "U"}},
			[]Message{{Role: "assistant", Content: "A"}, {Role: "user", Content: "P\n\nU"}}},
		{"no user", []Message{{Role: "tool", Content: "T", ToolCallID: "c"}},
			[]Message{{Role: "system", Content: "P"}, {Role: "tool", Content: "T", ToolCallID: "c"}}},
		{"empty", nil, []Message{{Role: "system", Content: "P"}}},
	} {
		in := append([]Message(nil), c.in...)
		if got := withPreamble(c.in, "P"); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
		if !reflect.DeepEqual(in, c.in) {
			t.Errorf("%s: the messages were changed in place", c.name)
		}
	}
}

// TestHermesStreamIncremental: a long <tool_call> block streamed a byte at
// a time is not rescanned from its start on every push (the work stays
// linear in its length).
func TestHermesStreamIncremental(t *testing.T) {
	s := newToolStream(&toolSetup{family: familyHermes, choice: "auto", tools: []ToolDef{{Name: "f"}}})
	text := "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"q\": \"" + strings.Repeat("x", 4000) + "\"}}\n</tool_call>"
	var calls int
	for i := range len(text) {
		_, cs := s.push(text[i : i+1])
		calls += len(cs)
	}
	if calls != 1 {
		t.Fatalf("%d calls", calls)
	}
	if s.scanned > 16*len(text) { // each push reads its byte and the end tag's length before it
		t.Errorf("scanned %d bytes for a %d-byte block", s.scanned, len(text))
	}
}
