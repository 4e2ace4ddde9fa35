package jsonschema

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/grammar"
)

// FuzzToGrammar: ToGrammar never panics, every error is an *Error wrapping
// engine.ErrInvalidInput, and every grammar it returns parses with
// engine/grammar and stays within the size bound.
func FuzzToGrammar(f *testing.F) {
	files, _ := filepath.Glob("testdata/schemas/*.json")
	for _, p := range files {
		if data, err := os.ReadFile(p); err == nil {
			f.Add(data)
		}
	}
	for _, s := range []string{
		`{"type":"string","pattern":"^(a|b*)+c{2,3}[^x-z]$"}`,
		`{"type":"integer","minimum":-99,"maximum":1234}`,
		`{"$defs":{"a":{"anyOf":[{"$ref":"#/$defs/b"},{"type":"null"}]},"b":{"type":"array","items":{"$ref":"#/$defs/a"}}},"$ref":"#/$defs/a"}`,
		`{"oneOf":[{"const":"a"},{"type":"number"}]}`,
		`{"type":["object","array"],"properties":{"a":true},"items":false}`,
		`{"type":"string","pattern":"(a?)*"}`,
		hostilePattern,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		src, err := ToGrammar(data)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || !errors.Is(err, engine.ErrInvalidInput) {
				t.Fatalf("error %v (%T) is not an *Error wrapping ErrInvalidInput", err, err)
			}
			return
		}
		if len(src) > MaxGrammarBytes {
			t.Fatalf("grammar is %d bytes", len(src))
		}
		if _, err := grammar.Parse(src); err != nil {
			// Parse bounds the work of the start state: a pattern that
			// forks into too many parse paths is refused there (the
			// router parses every grammar it forwards), never anything else.
			var e *grammar.Error
			if errors.As(err, &e) && errors.Is(err, engine.ErrInvalidInput) && strings.Contains(e.Msg, "too ambiguous") {
				return
			}
			t.Fatalf("grammar for %q does not parse: %v\n%s", data, err, src)
		}
	})
}
