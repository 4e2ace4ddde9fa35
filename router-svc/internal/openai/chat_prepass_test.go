package openai

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// snippetCases are short templates with what Python's jinja2, set up as
// Hugging Face's apply_chat_template sets it up, renders for them (one user
// message "Hello", add_generation_prompt true): whitespace control
// ({%- -%}, trim_blocks, lstrip_blocks, the + modifiers) where tags meet
// with no text between them, newlines, {% raw %}, the filter block, and
// values printed directly (floats, Python's repr of lists, dicts and
// strings). TestTemplateSnippetsOracle checks the wants against jinja2.
var snippetCases = []struct{ src, want string }{
	// REV1: a left trim right after a tag trims nothing
	{"{% if true %}A: {{ 'x' }}{%- endif %}", "A: x"},
	// REV1
	{"{{ 'a' }} {{ 'b' }}{{- 'c' }}", "a bc"},
	// REV1
	{"A: {% set y = 1 %}{%- if true %}x{% endif %}", "A: x"},
	// REV1
	{"{% for i in [1,2] %}{{ i }} {% if true %}{%- endif %}{% endfor %}", "1 2 "},
	// REV1
	{"A: {# c #}{%- if true %}x{% endif %}", "A: x"},
	// REV1: GLM-5.2's form
	{"{%- if true %}Reasoning Effort: {{ 'Max' }}{%- endif %}", "Reasoning Effort: Max"},
	// a right trim right before a tag
	{"{% if true -%}{{ 'x' }} B{% endif %}", "x B"},
	// a right trim right before a tag
	{"{{ 'x' -}}{{ 'y' }} B", "xy B"},
	// trim_blocks does not reach past an expression
	{"{% if true %}{{ 'x' }}\nB{% endif %}", "x\nB"},
	// trim_blocks removes one newline, once
	{"{% if true %}{% if true %}\n\nB{% endif %}{% endif %}", "\nB"},
	// lstrip_blocks only at the start of a line
	{"A\n  {{ 'x' }}{% if true %}y{% endif %}", "A\n  xy"},
	// lstrip_blocks only at the start of a line
	{"A\n  {# c #}{% if true %}y{% endif %}", "A\ny"},
	// lstrip_blocks only at the start of a line
	{"{% if true %}  {% if true %}x{% endif %}{% endif %}", "  x"},
	// lstrip_blocks after trim_blocks
	{"{% if true %}\n  {% if true %}x{% endif %}{% endif %}", "x"},
	// lstrip_blocks after a newline
	{"{{ 'a' }}\n  {% if true %}x{% endif %}", "a\nx"},
	// lstrip_blocks at the start
	{"  {% if true %}x{% endif %}", "x"},
	// lstrip_blocks after a right trim
	{"{{ 'a' -}}\n  {% if true %}x{% endif %}", "ax"},
	// the + modifiers
	{"A\n  {%+ if true %}y{% endif +%}\nB", "A\n  y\nB"},
	// the + modifiers
	{"A\n  {#+ c +#}\nB", "A\n  \nB"},
	// CRLF and a trailing newline
	{"A\r\n{% if true %}\r\nB\r\n{% endif %}\r\n", "A\nB\n"},
	// a trailing newline
	{"A\n", "A"},
	// a trailing newline
	{"A\n\n", "A\n"},
	// Unicode whitespace
	{"A\u00a0\u3000{%- if true -%}\u2028\u0085 B{% endif %}", "AB"},
	// Unicode whitespace
	{"A\n\u00a0{% if true %}x{% endif %}", "A\nx"},
	// a brace before a trimmed tag
	{"a{ {%- if true %}b{% endif %}", "a{b"},
	// text in a block set
	{"{% set s %}  x \n{% endset %}[{{ s }}]", "[  x \n]"},
	// raw is copied
	{"{% raw %}{{ messages | tojson }}{% endraw %}", "{{ messages | tojson }}"},
	// raw is copied
	{"{% raw %}{{ '%s' % 1 }}{% endraw %}", "{{ '%s' % 1 }}"},
	// raw is copied
	{"{% raw %}{%- if x -%} {# c #} \"q\" \\ {% endraw %}", "{%- if x -%} {# c #} \"q\" \\ "},
	// raw and whitespace
	{"A \n  {%- raw -%}\n  {{ x }} {%- endraw %}\nB", "A{{ x }}B"},
	// raw and whitespace
	{"  {% raw %}\nx\n  {% endraw %}\nB", "\nx\nB"},
	// the filter block
	{"{% filter upper %}a{{ 'b' }}{% endfilter %}", "AB"},
	// floats
	{"{{ 1.0 }}|{{ -0.0 }}|{{ 2.5 }}|{{ 10000000000000000.0 }}|{{ 0.00001 }}|{{ 0.1 + 0.2 }}|{{ 3 / 2 }}|{{ 4 / 2 }}", "1.0|-0.0|2.5|1e+16|1e-05|0.30000000000000004|1.5|2.0"},
	// floats as strings
	{"{{ 1.0 | string }}|{{ [1.0, 2] | join(',') }}|{{ [{'a': 1.0}, {'a': none}] | join(', ', attribute='a') }}|{{ 'ab' | join('-') }}", "1.0|1.0,2|1.0, None|a-b"},
	// repr
	{"{{ [1.0, 'it\\'s', \"a\", none, true] }}|{{ {'k': 'v\u2028', 'n': none, 't': false} }}|{{ 'x\\ny' }}", "[1.0, \"it's\", 'a', None, True]|{'k': 'v\\u2028', 'n': None, 't': False}|x\ny"},
	// repr
	{"{{ ['a\"b', \"a'b\", 'a\\'\"b', '\\\\', '\\t\u0001\u00a0\u00e9\u2028'] }}", "['a\"b', \"a'b\", 'a\\'\"b', '\\\\', '\\t\\x01\\xa0\u00e9\\u2028']"},
	// none and bools
	{"{{ none }}|{{ true }}|{{ false }}|{{ 1 }}|{{ -3 }}", "None|True|False|1|-3"},
}

// TestTemplateSnippets: the router renders each snippet exactly as jinja2
// does — the engine's own whitespace control strips text across tags, so
// the pre-pass (renameFilters) does it instead, and prints values as
// Python's str() does.
func TestTemplateSnippets(t *testing.T) {
	for _, c := range snippetCases {
		tmpl, err := NewChatTemplate(c.src, "<s>", "</s>")
		if err != nil {
			t.Errorf("%q: %v", c.src, err)
			continue
		}
		got, err := tmpl.Render([]Message{{Role: "user", Content: "Hello"}}, true)
		if err != nil {
			t.Errorf("%q: %v", c.src, err)
			continue
		}
		if got != c.want {
			t.Errorf("%q:\ngot  %q\nwant %q (jinja2)", c.src, got, c.want)
		}
	}
}

// TestTemplateSnippetsOracle: the wants of snippetCases are what jinja2
// renders (testdata/templates/render_snippets.py; skipped without python3
// and jinja2).
func TestTemplateSnippetsOracle(t *testing.T) {
	if err := exec.Command("python3", "-c", "import jinja2").Run(); err != nil {
		t.Skipf("python3 with jinja2: %v", err)
	}
	srcs := make([]string, len(snippetCases))
	for i, c := range snippetCases {
		srcs[i] = c.src
	}
	in, err := json.Marshal(srcs)
	if err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command("python3", filepath.Join("testdata", "templates", "render_snippets.py"))
	cmd.Stdin, cmd.Stdout, cmd.Stderr = bytes.NewReader(in), &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("render_snippets.py: %v\n%s", err, stderr.String())
	}
	var out []rendering
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		t.Fatal(err)
	}
	for i, c := range snippetCases {
		switch {
		case out[i].Text == nil:
			t.Errorf("%q: jinja2 fails: %s", c.src, out[i].Error)
		case *out[i].Text != c.want:
			t.Errorf("%q: jinja2 renders %q, the table says %q", c.src, *out[i].Text, c.want)
		}
	}
}

// TestTemplateLoadRefusesOrWarns: what the pre-pass cannot make exact is
// told at load — a filter block of a filter Baton replaces is refused
// (the engine would run its own tojson), a ~ concatenation (the engine
// prints a float operand its way: 'a' ~ 1.0 is "a1", jinja2's "a1.0")
// and `"x" | safe + y` (jinja2's Markup escapes y's HTML, the engine does
// not) load with a warning naming the line; a template without them has
// none.
func TestTemplateLoadRefusesOrWarns(t *testing.T) {
	for _, src := range []string{"{% filter tojson %}a<b{% endfilter %}", "x\n{%- filter join(',') %}ab{% endfilter %}"} {
		if _, err := NewChatTemplate(src, "", ""); err == nil || !strings.Contains(err.Error(), "filter block") || !strings.Contains(err.Error(), "line ") {
			t.Errorf("%q: loaded with error %v, want one naming the filter block and its line", src, err)
		}
	}
	tmpl, err := NewChatTemplate("{% for m in messages %}\n{{ m.role ~ ': ' ~ m.content }}{% endfor %}", "", "")
	if err != nil {
		t.Fatal(err)
	}
	if w := tmpl.Warning(); !strings.Contains(w, "line 2") || !strings.Contains(w, "~") {
		t.Errorf("warning %q, want one naming ~ and line 2", w)
	}
	tmpl, err = NewChatTemplate(`{{ "Use '"|safe + messages[0].content }}`, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if w := tmpl.Warning(); !strings.Contains(w, "line 1") || !strings.Contains(w, "safe") {
		t.Errorf("warning %q, want one naming safe and line 1", w)
	}
	tmpl, err = NewChatTemplate(readTemplate(t, "qwen3.jinja"), "", "")
	if err != nil {
		t.Fatal(err)
	}
	if w := tmpl.Warning(); w != "" {
		t.Errorf("qwen3.jinja: warning %q, want none", w)
	}
}
