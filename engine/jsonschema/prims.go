package jsonschema

// The shared rules every compiled grammar draws on, added only when used.
// Whitespace is bounded (see the package doc): ws is nothing, one space, or
// one newline followed by at most 20 spaces or tabs.
const (
	ruleWS      = `ws ::= ("\x20" | "\n" [\x20\x09]{0,20})?`
	ruleHex     = `hex ::= [0-9a-fA-F]`
	ruleChar    = `char ::= [^\x22\x5C\x00-\x1F\uD800-\uDFFF] | "\\" ([\x22\x5C\x2Fbfnrt] | "u" ([0-9a-ce-fA-CE-F] hex{3} | [dD] [0-7] hex{2} | [dD] [89abAB] hex{2} "\\u" [dD] [c-fC-F] hex{2}))`
	ruleString  = `string ::= "\"" char* "\""`
	ruleNumber  = `number ::= "-"? ("0" | [1-9] [0-9]*) ("." [0-9]+)? ([eE] [\x2B\x2D]? [0-9]{1,3})?`
	ruleInteger = `integer ::= "-"? ("0" | [1-9] [0-9]*)`
	ruleBoolean = `boolean ::= "true" | "false"`
	ruleNull    = `null ::= "null"`
	ruleValue   = `value ::= object | array | string | number | boolean | null`
	ruleObject  = `object ::= "{" ws (string ws ":" ws value ws ("," ws string ws ":" ws value ws)*)? "}"`
	ruleArray   = `array ::= "[" ws (value ws ("," ws value ws)*)? "]"`
)

// AnyObject is the GBNF of any JSON object (response_format json_object),
// with the same bounded whitespace as ToGrammar's grammars and no whitespace
// before or after the object.
const AnyObject = "root ::= object\n" +
	ruleObject + "\n" + ruleValue + "\n" + ruleArray + "\n" + ruleString + "\n" +
	ruleChar + "\n" + ruleHex + "\n" + ruleNumber + "\n" + ruleBoolean + "\n" +
	ruleNull + "\n" + ruleWS + "\n"

// prims maps each shared rule to its definition and the shared rules it uses.
var prims = map[string]struct {
	def  string
	deps []string
}{
	"ws":      {ruleWS, nil},
	"hex":     {ruleHex, nil},
	"char":    {ruleChar, []string{"hex"}},
	"string":  {ruleString, []string{"char"}},
	"number":  {ruleNumber, nil},
	"integer": {ruleInteger, nil},
	"boolean": {ruleBoolean, nil},
	"null":    {ruleNull, nil},
	"value":   {ruleValue, []string{"object", "array", "string", "number", "boolean", "null"}},
	"object":  {ruleObject, []string{"ws", "string", "value"}},
	"array":   {ruleArray, []string{"ws", "value"}},
}

// primOrder is the order shared rules are written in, so output is stable.
var primOrder = []string{"value", "object", "array", "string", "char", "hex", "number", "integer", "boolean", "null", "ws"}
