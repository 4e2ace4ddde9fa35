package jsonschema

import (
	"fmt"
	"strings"

	"github.com/baton-serving/baton/engine"
)

// Error is an unsupported or invalid schema. Keyword names the JSON Schema
// keyword at fault ("patternProperties", "minimum"; empty when the schema is
// not a schema at all, e.g. not JSON), Path is the JSON pointer of the schema
// object that holds it ("#/properties/a"), and Message says what is wrong.
// The OpenAI layer turns it into a 400 that names the keyword; errors.Is(err,
// engine.ErrInvalidInput) is true so the services map it without knowing this
// type.
type Error struct {
	Keyword string
	Path    string
	Message string
}

func (e *Error) Error() string {
	if e.Keyword == "" {
		return fmt.Sprintf("json schema at %s: %s", e.Path, e.Message)
	}
	return fmt.Sprintf("json schema keyword %q at %s: %s", e.Keyword, e.Path, e.Message)
}

// Unwrap makes every schema error an engine.ErrInvalidInput.
func (e *Error) Unwrap() error { return engine.ErrInvalidInput }

func errorf(path, keyword, format string, args ...any) *Error {
	return &Error{Keyword: keyword, Path: path, Message: fmt.Sprintf(format, args...)}
}

// child appends one reference token to a JSON pointer, escaping "~" and "/"
// as RFC 6901 asks.
func child(path, token string) string {
	token = strings.ReplaceAll(token, "~", "~0")
	token = strings.ReplaceAll(token, "/", "~1")
	return path + "/" + token
}
