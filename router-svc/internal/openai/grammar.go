package openai

import "errors"

// errNoConstrainedDecoding: the constrained decoder (engine/grammar,
// engine/jsonschema) is not in this build yet; structured output is refused
// rather than ignored.
var errNoConstrainedDecoding = errors.New("constrained decoding (grammars and JSON schemas) is not supported by this build")

func anyObjectGrammar() (string, error) { return "", errNoConstrainedDecoding }

func parseGrammar(string) error { return errNoConstrainedDecoding }

func compileSchema([]byte) (string, error) { return "", errNoConstrainedDecoding }
