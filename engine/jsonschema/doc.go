// Package jsonschema compiles a JSON Schema to a GBNF grammar (engine/grammar)
// so that constrained decoding can only produce JSON the schema accepts:
// response_format json_schema, and forced tool calls whose arguments must
// match a function's parameters.
//
// # The subset
//
// What OpenAI's strict structured outputs support, with these meanings:
//
//   - type: "object", "array", "string", "number", "integer", "boolean",
//     "null", or an array of them (["string", "null"]); each type's keywords
//     apply to its values only. Without "type", the type-specific keywords
//     present decide it (properties -> object, items -> array, ...); a schema
//     with none allows any JSON value, as does the boolean schema true.
//   - object: properties, required (every name must be a declared property),
//     additionalProperties. With additionalProperties false (what OpenAI strict
//     mode requires) only the declared properties can appear. With it true or
//     absent the grammar still emits only the declared properties: a subset of
//     what the schema accepts, so outputs stay valid and the model is not
//     invited to invent keys; an object schema with no properties and
//     additionalProperties not false allows any object. A schema for
//     additional properties is refused.
//   - array: items (one schema; absent means any value), minItems, maxItems;
//     uniqueItems only as false.
//   - string: minLength and maxLength (counted in code points, as JSON Schema
//     counts; at most MaxCount); pattern (below); format "uuid" only, any
//     other format is refused by name. pattern cannot be combined with the
//     length keywords.
//   - integer: minimum, maximum, exclusiveMinimum, exclusiveMaximum (any
//     bounds within ±1e18, compiled digit by digit); number: only "minimum": 0
//     (no minus sign); other number bounds and multipleOf are refused.
//   - enum and const with any JSON values (written compactly), filtered by
//     "type" when both are given.
//   - anyOf; oneOf only when its branches cannot match the same value
//     (different types, or distinct constants), where it means the same as
//     anyOf; allOf only with a single schema. These, and $ref, stand alone:
//     other value keywords beside them are refused.
//   - $defs and definitions with local references "#/$defs/NAME", any JSON
//     pointer into the document, and "#"; recursion is allowed as long as a
//     value is produced between two visits (a reference cycle through $ref and
//     anyOf alone is refused).
//   - Annotations are ignored: description, title, default, examples,
//     $schema, $id, $comment, deprecated, readOnly, writeOnly.
//
// Every other keyword is refused with an *Error naming it and the JSON
// pointer of the schema object holding it; the error wraps
// engine.ErrInvalidInput.
//
// Patterns are a safe regex subset matched, as JSON Schema says, anywhere in
// the string unless anchored: literals, escaped punctuation, \d \w \s and
// their negations (ASCII, as Go's regexp), \t \n \r \f \v \xHH \uHHHH,
// classes with ranges and negation, '.', groups (...) and (?:...),
// alternation, * + ? {m} {m,} {m,n} (and their lazy forms), and ^/$ at the
// start/end of the pattern or of a top-level alternative. Lookaround,
// backreferences, word boundaries, Unicode classes, named groups and flags
// are refused. Characters are matched after JSON decoding; the grammar
// writes each one raw where JSON allows and escaped where it must.
//
// # Output shape
//
// Properties are emitted in schema order, required ones always, optional ones
// possibly skipped; no other order is allowed, which keeps the grammar
// unambiguous. Whitespace is bounded so a model cannot loop on it forever:
// after '{', '[', ',', ':' and after each key and value there may be
// nothing, one space, or one newline followed by at most 20 spaces or tabs;
// none before or after the whole value. Strings allow every JSON escape, with
// \u escapes only for whole code points (a surrogate pair together).
// Numbers follow JSON with at most 3 exponent digits.
//
// # Limits
//
// A schema is at most MaxSchemaBytes and MaxDepth levels deep; a grammar at
// most MaxRules rules and MaxGrammarBytes; each length, item count or pattern
// count at most MaxCount, and their sum per grammar bounded, so a hostile
// schema cannot blow up compile time, memory or the grammar engine.
package jsonschema
