package openai

import (
	"github.com/baton-serving/baton/engine/grammar"
	"github.com/baton-serving/baton/engine/jsonschema"
)

// The constrained decoder's compilers, run at the router so that a grammar
// or schema Baton cannot follow is a 400 naming the field (and the schema
// keyword) before any worker is involved; the GBNF source is what travels
// to the workers (SamplingParams.grammar).

// anyObjectGrammar is the GBNF of response_format json_object.
func anyObjectGrammar() (string, error) { return jsonschema.AnyObject, nil }

// parseGrammar checks GBNF source (the grammar field).
func parseGrammar(src string) error {
	_, err := grammar.Parse(src)
	return err
}

// compileSchema compiles a JSON Schema to GBNF; its errors name the keyword
// and its path in the schema (*jsonschema.Error). The router's prepare
// parses the result, as it parses every request's grammar.
func compileSchema(schema []byte) (string, error) {
	return jsonschema.ToGrammar(schema)
}
