package openai

import (
	"errors"
	"strings"
	"testing"
)

// TestChatTemplateStartupCheck: a template the engine cannot render fails
// when it is loaded (at the router's startup), with an error that names
// the construct — never at the first request, never as a wrong prompt.
// A template that refuses some conversations itself (raise_exception, as
// Gemma 2's refuses a system message) still loads.
func TestChatTemplateStartupCheck(t *testing.T) {
	bad := []struct{ src, names string }{
		{`{% for m in messages %}{{ m.content | frobnicate }}{% endfor %}`, `frobnicate`},
		{`{% for m in messages %}{{ m.content.casefold() }}{% endfor %}`, `casefold`},
		// Python's %-formatting: the engine computes a modulo and prints "0".
		{`{% for m in messages %}{{ "<%s>%s" % (m.role, m.content) }}{% endfor %}`, `% formatting`},
		{`{%- if tools %}{{ tools | map(attribute="function") | frobnicate }}{% endif %}{{ messages[0].content }}`, `frobnicate`},
	}
	for _, c := range bad {
		_, err := NewChatTemplate(c.src, "", "")
		if err == nil || !strings.Contains(err.Error(), c.names) {
			t.Errorf("%s: loaded with error %v, want one naming %q", c.src, err, c.names)
		}
	}
	for _, f := range []string{"gemma2.jinja", "mistral.jinja", "llama3.jinja", "qwen3.jinja", "phi3.jinja"} {
		if _, err := NewChatTemplate(readTemplate(t, f), "<s>", "</s>"); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
	// At a request, the template's own complaint is told apart from an
	// engine failure.
	g, err := NewChatTemplate(readTemplate(t, "gemma2.jinja"), "<bos>", "<eos>")
	if err != nil {
		t.Fatal(err)
	}
	_, err = g.Render([]Message{{Role: "system", Content: "x"}, {Role: "user", Content: "y"}}, true)
	var raised *TemplateRaised
	if !errors.As(err, &raised) || raised.Message != "System role not supported" {
		t.Errorf("gemma2 with a system message: %v (%T), want a TemplateRaised", err, err)
	}
}
