package openai

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	"github.com/baton-serving/baton/engine/jsonschema"
)

// Tool calling (OpenAI's tools, tool_choice and parallel_tool_calls).
//
// Each model family writes its calls in its own syntax; the family is told
// by the markers in the model's chat template (detectFamily):
//
//   - Llama 3.x: a JSON object {"name": ..., "parameters": {...}} (or
//     "arguments"), optionally after <|python_tag|>; several separated by ";".
//   - Qwen2.5, Qwen3, Hermes: <tool_call>{"name": ..., "arguments": {...}}</tool_call>,
//     one or more.
//   - Mistral: [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...] — the
//     marker is a control token that decodes to nothing, so a bare JSON array
//     of calls is accepted too — and the newer [TOOL_CALLS]name[ARGS]{...}.
//   - generic (any other template, and the plain default): a JSON object
//     {"name": ..., "arguments": {...}} or a JSON array of them, the form the
//     generic tools preamble asks for.
//
// tool_choice:
//   - "auto" (the default with tools): the tools are rendered and the output
//     is parsed; a call becomes message.tool_calls, anything else content.
//   - "none": the model must not call a tool. The tools are left out of the
//     prompt (so the model is not invited to call them, as OpenAI promises)
//     and the output is never parsed; history with tool_calls and tool
//     messages still renders.
//   - "required" or {"type": "function", "function": {"name": ...}}: the
//     constrained decoder forces the family's call syntax with arguments
//     that match the tool's parameters schema (SamplingParams.grammar, see
//     forcingGrammar); parallel_tool_calls (default true) allows one or
//     more calls, false exactly one.
//
// The deprecated functions field is refused with a 400 that points to
// tools (function_call, its tool_choice, is accepted as "none" or "auto"
// only, see chatExtras).

// toolFamily is how a model writes tool calls.
type toolFamily int

const (
	familyGeneric toolFamily = iota
	familyLlama3
	familyHermes
	familyMistral
)

func (f toolFamily) String() string {
	return [...]string{"generic", "llama3", "hermes", "mistral"}[f]
}

// detectFamily tells a chat template's tool-call syntax by its markers.
func detectFamily(src string) toolFamily {
	switch {
	case strings.Contains(src, "<tool_call>"):
		return familyHermes
	case strings.Contains(src, "[TOOL_CALLS]"):
		return familyMistral
	case strings.Contains(src, "<|python_tag|>") || (strings.Contains(src, "<|start_header_id|>") && strings.Contains(src, "tool")):
		return familyLlama3
	}
	return familyGeneric
}

// toolSetup is a request's validated tools.
type toolSetup struct {
	tools    []ToolDef
	grammars []string // per tool: the GBNF of its parameters
	choice   string   // "auto", "none", "required" or "function"
	named    string   // with choice "function": the tool
	parallel bool
	family   toolFamily
}

// rendered is the tools the prompt shows: none with tool_choice "none".
func (ts *toolSetup) rendered() []ToolDef {
	if ts == nil || ts.choice == "none" {
		return nil
	}
	return ts.tools
}

// parses reports whether the output is parsed for calls.
func (ts *toolSetup) parses() bool { return ts != nil && ts.choice != "none" && len(ts.tools) > 0 }

// declared reports whether name is one of the tools.
func (ts *toolSetup) declared(name string) bool {
	_, ok := toolIndex(ts.tools, name)
	return ok
}

// forced reports whether the model must call a tool.
func (ts *toolSetup) forced() bool {
	return ts != nil && (ts.choice == "required" || ts.choice == "function")
}

// parse reads the calls in a whole output: content (nil when there is
// none) and the calls, or the text as content when it holds none.
func (ts *toolSetup) parse(text string) (*string, []parsedCall) {
	if !ts.parses() {
		return &text, nil
	}
	content, calls, ok := parseToolCalls(ts.family, text, ts.declared)
	if !ok {
		return &text, nil
	}
	if content == "" {
		return nil, calls
	}
	return &content, calls
}

var toolNameRE = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

// prepareTools validates tools, tool_choice and parallel_tool_calls (and
// refuses the deprecated functions). It returns nil when
// the request declares no tools.
func prepareTools(in *chatRequest, family toolFamily) (*toolSetup, *httpError) {
	if !isNull(in.Functions) {
		return nil, invalid("functions", "functions is deprecated and not supported; declare them as tools: [{\"type\": \"function\", \"function\": {...}}]")
	}
	ts := &toolSetup{choice: "auto", parallel: true, family: family}
	if in.ParallelToolCalls != nil {
		ts.parallel = *in.ParallelToolCalls
	}
	if !isNull(in.Tools) {
		var list []json.RawMessage
		if err := json.Unmarshal(in.Tools, &list); err != nil {
			return nil, invalid("tools", "tools: expected an array of tools")
		}
		seen := map[string]int{}
		for i, raw := range list {
			t, g, herr := parseTool(i, raw)
			if herr != nil {
				return nil, herr
			}
			if k, dup := seen[t.Name]; dup {
				return nil, invalid(fmt.Sprintf("tools[%d].function.name", i), "tools[%d].function.name %q: already declared by tools[%d]", i, t.Name, k)
			}
			seen[t.Name] = i
			ts.tools = append(ts.tools, t)
			ts.grammars = append(ts.grammars, g)
		}
	}
	if !isNull(in.ToolChoice) {
		var s string
		if err := json.Unmarshal(in.ToolChoice, &s); err == nil {
			switch s {
			case "auto", "none", "required":
				ts.choice = s
			default:
				return nil, invalid("tool_choice", "tool_choice %q: want \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}", s)
			}
		} else {
			var obj struct {
				Type     string `json:"type"`
				Function *struct {
					Name string `json:"name"`
				} `json:"function"`
			}
			if err := json.Unmarshal(in.ToolChoice, &obj); err != nil {
				return nil, invalid("tool_choice", "tool_choice: expected a string or {\"type\": \"function\", \"function\": {\"name\": ...}}")
			}
			if obj.Type != "function" {
				return nil, invalid("tool_choice.type", "tool_choice.type %q: want \"function\"", obj.Type)
			}
			if obj.Function == nil || obj.Function.Name == "" {
				return nil, invalid("tool_choice.function.name", "tool_choice.function.name is required")
			}
			if _, ok := toolIndex(ts.tools, obj.Function.Name); !ok {
				return nil, invalid("tool_choice.function.name", "tool_choice.function.name %q: no such tool in tools", obj.Function.Name)
			}
			ts.choice, ts.named = "function", obj.Function.Name
		}
	}
	if len(ts.tools) == 0 {
		if ts.choice == "required" {
			return nil, invalid("tool_choice", "tool_choice \"required\" needs tools")
		}
		return nil, nil
	}
	return ts, nil
}

func toolIndex(tools []ToolDef, name string) (int, bool) {
	for i, t := range tools {
		if t.Name == name {
			return i, true
		}
	}
	return 0, false
}

// emptyParameters is a function that takes no arguments, as OpenAI reads a
// tool without parameters.
const emptyParameters = `{"type": "object", "properties": {}, "additionalProperties": false}`

// parseTool reads tools[i] and compiles its parameters schema.
func parseTool(i int, raw json.RawMessage) (ToolDef, string, *httpError) {
	p := fmt.Sprintf("tools[%d]", i)
	var t struct {
		Type     *string         `json:"type"`
		Function json.RawMessage `json:"function"`
	}
	if err := json.Unmarshal(raw, &t); err != nil {
		return ToolDef{}, "", invalid(p, "%s: expected a tool object {\"type\": \"function\", \"function\": {...}}", p)
	}
	if t.Type == nil || *t.Type != "function" {
		got := "missing"
		if t.Type != nil {
			got = fmt.Sprintf("%q", *t.Type)
		}
		return ToolDef{}, "", invalid(p+".type", "%s.type is %s: only \"function\" tools are supported", p, got)
	}
	if isNull(t.Function) {
		return ToolDef{}, "", invalid(p+".function", "%s.function is required", p)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(t.Function, &fields); err != nil {
		return ToolDef{}, "", invalid(p+".function", "%s.function: expected an object", p)
	}
	var def ToolDef
	if err := json.Unmarshal(fields["name"], &def.Name); err != nil || isNull(fields["name"]) {
		return def, "", invalid(p+".function.name", "%s.function.name: expected a string", p)
	}
	if !toolNameRE.MatchString(def.Name) {
		return def, "", invalid(p+".function.name", "%s.function.name %q: want 1-64 characters of a-z A-Z 0-9 _ -", p, def.Name)
	}
	if d, ok := fields["description"]; ok && !isNull(d) {
		var s string
		if err := json.Unmarshal(d, &s); err != nil {
			return def, "", invalid(p+".function.description", "%s.function.description: expected a string", p)
		}
		def.Description = &s
	}
	if s, ok := fields["strict"]; ok && !isNull(s) {
		var b bool
		if err := json.Unmarshal(s, &b); err != nil {
			return def, "", invalid(p+".function.strict", "%s.function.strict: expected a boolean", p)
		}
	}
	schema := []byte(emptyParameters)
	if params, ok := fields["parameters"]; ok && !isNull(params) {
		if t := bytes.TrimSpace(params); len(t) == 0 || t[0] != '{' {
			return def, "", invalid(p+".function.parameters", "%s.function.parameters of tool %q: expected a JSON Schema object", p, def.Name)
		}
		def.Parameters = bytes.TrimSpace(params)
		schema = def.Parameters
	}
	g, err := jsonschema.ToGrammar(schema)
	if err != nil {
		// A *jsonschema.Error names the keyword (and its path) itself.
		return def, "", invalid(p+".function.parameters", "%s.function.parameters of tool %q: %v", p, def.Name, err)
	}
	return def, g, nil
}

// toolsPreamble is the text that shows the tools to a model whose template
// cannot (the plain default, or a template that never mentions tools): the
// answer format, then each tool's function as compact JSON, one a line —
// kept short, for small context windows.
func toolsPreamble(tools []ToolDef) string {
	var b strings.Builder
	b.WriteString(`Tools: to call one, answer only {"name": <name>, "arguments": <JSON object>}; for several, a JSON array of those.` + "\n")
	for _, t := range tools {
		name, _ := marshal(t.Name)
		b.WriteString(`{"name": ` + string(name))
		if t.Description != nil {
			d, _ := marshal(*t.Description)
			b.WriteString(`, "description": ` + string(d))
		}
		if t.Parameters != nil {
			var c bytes.Buffer
			if json.Compact(&c, t.Parameters) != nil {
				c.Reset()
				c.Write(t.Parameters)
			}
			b.WriteString(`, "parameters": ` + c.String())
		}
		b.WriteString("}\n")
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// withPreamble puts text in front of the system message, or before the
// first message's content when there is none (templates differ in whether
// they accept a system turn at all).
func withPreamble(msgs []Message, text string) []Message {
	out := append([]Message(nil), msgs...)
	if len(out) == 0 {
		return []Message{{Role: "system", Content: text}}
	}
	if out[0].Role == "system" {
		out[0].Content = text + "\n\n" + out[0].Content
		return out
	}
	out[0].Content = text + "\n\n" + out[0].Content
	return out
}

// genericCallsText is calls in the generic form, for templates that cannot
// render tool calls themselves.
func genericCallsText(calls []ToolCall) string {
	parts := make([]string, len(calls))
	for i, c := range calls {
		args := strings.TrimSpace(c.Arguments)
		if !json.Valid([]byte(args)) {
			b, _ := marshal(args)
			args = string(b)
		}
		name, _ := marshal(c.Name)
		parts[i] = `{"name": ` + string(name) + `, "arguments": ` + args + `}`
	}
	if len(parts) == 1 {
		return parts[0]
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// parsedCall is one call read from the model's output.
type parsedCall struct {
	Name      string
	Arguments string // JSON object text
}

// parseToolCalls reads the calls in a model's whole output text. content
// is the text before the first call (trimmed); ok is false when the output
// holds no well-formed call to a declared tool, and then the whole text is
// content.
func parseToolCalls(fam toolFamily, text string, declared func(string) bool) (content string, calls []parsedCall, ok bool) {
	switch fam {
	case familyHermes:
		calls, before, ok := parseHermes(text)
		if ok && allDeclared(calls, declared) {
			return strings.TrimRight(before, " \t\r\n"), calls, true
		}
		return text, nil, false
	case familyMistral:
		if calls, ok := parseMistral(text); ok && allDeclared(calls, declared) {
			return "", calls, true
		}
	}
	if calls, ok := parseJSONCalls(text); ok && allDeclared(calls, declared) {
		return "", calls, true
	}
	return text, nil, false
}

func allDeclared(calls []parsedCall, declared func(string) bool) bool {
	if len(calls) == 0 {
		return false
	}
	for _, c := range calls {
		if declared != nil && !declared(c.Name) {
			return false
		}
	}
	return true
}

const (
	hermesOpen   = "<tool_call>"
	hermesClose  = "</tool_call>"
	mistralMark  = "[TOOL_CALLS]"
	mistralArgs  = "[ARGS]"
	llamaPyTag   = "<|python_tag|>"
	maxToolCalls = 128
)

// parseHermes reads <tool_call>{json}</tool_call> blocks; the last may lack
// its closing tag (the generation ended at it).
func parseHermes(text string) ([]parsedCall, string, bool) {
	i := strings.Index(text, hermesOpen)
	if i < 0 {
		return nil, "", false
	}
	before, rest := text[:i], text[i:]
	var calls []parsedCall
	for {
		rest = strings.TrimSpace(rest)
		if rest == "" {
			break
		}
		if !strings.HasPrefix(rest, hermesOpen) || len(calls) == maxToolCalls {
			// Text after the calls: not part of them.
			break
		}
		rest = rest[len(hermesOpen):]
		body := rest
		if j := strings.Index(rest, hermesClose); j >= 0 {
			body, rest = rest[:j], rest[j+len(hermesClose):]
		} else {
			rest = ""
		}
		c, ok := decodeCall([]byte(strings.TrimSpace(body)))
		if !ok {
			return nil, "", false
		}
		calls = append(calls, c)
	}
	return calls, before, len(calls) > 0
}

// parseMistral reads [TOOL_CALLS][{...}, ...] or [TOOL_CALLS]name[ARGS]{...}
// (one or more).
func parseMistral(text string) ([]parsedCall, bool) {
	t := strings.TrimSpace(text)
	if !strings.HasPrefix(t, mistralMark) {
		return nil, false
	}
	t = strings.TrimSpace(t[len(mistralMark):])
	if strings.HasPrefix(t, "[") || strings.HasPrefix(t, "{") {
		return parseJSONCalls(t)
	}
	var calls []parsedCall
	for t != "" && len(calls) < maxToolCalls {
		j := strings.Index(t, mistralArgs)
		if j < 0 {
			return nil, false
		}
		name := strings.TrimSpace(t[:j])
		if !toolNameRE.MatchString(name) {
			return nil, false
		}
		dec := json.NewDecoder(strings.NewReader(t[j+len(mistralArgs):]))
		var args json.RawMessage
		if err := dec.Decode(&args); err != nil || !isObject(args) {
			return nil, false
		}
		calls = append(calls, parsedCall{Name: name, Arguments: string(args)})
		t = strings.TrimSpace(t[j+len(mistralArgs)+int(dec.InputOffset()):])
		t = strings.TrimSpace(strings.TrimPrefix(t, mistralMark))
	}
	return calls, len(calls) > 0
}

// parseJSONCalls reads the JSON forms (Llama 3.x and generic): after an
// optional <|python_tag|>, one or more call objects or arrays of them,
// separated by whitespace or ";", and nothing else.
func parseJSONCalls(text string) ([]parsedCall, bool) {
	t := strings.TrimSpace(text)
	t = strings.TrimSpace(strings.TrimPrefix(t, llamaPyTag))
	if t == "" || (t[0] != '{' && t[0] != '[') {
		return nil, false
	}
	var calls []parsedCall
	dec := json.NewDecoder(strings.NewReader(t))
	for {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, false
		}
		switch raw[0] {
		case '{':
			c, ok := decodeCall(raw)
			if !ok {
				return nil, false
			}
			calls = append(calls, c)
		case '[':
			var list []json.RawMessage
			if err := json.Unmarshal(raw, &list); err != nil || len(list) == 0 {
				return nil, false
			}
			for _, e := range list {
				c, ok := decodeCall(e)
				if !ok {
					return nil, false
				}
				calls = append(calls, c)
			}
		default:
			return nil, false
		}
		if len(calls) > maxToolCalls {
			return nil, false
		}
		rest := strings.TrimLeft(t[dec.InputOffset():], " \t\r\n;")
		if rest == "" {
			return calls, true
		}
		dec = json.NewDecoder(strings.NewReader(rest))
		t = rest
	}
}

// decodeCall reads {"name": ..., "arguments"|"parameters": {...}}; the
// arguments may also be a JSON string holding the object, as some models
// write them.
func decodeCall(raw []byte) (parsedCall, bool) {
	var c struct {
		Name       *string         `json:"name"`
		Arguments  json.RawMessage `json:"arguments"`
		Parameters json.RawMessage `json:"parameters"`
	}
	if !isObject(raw) || json.Unmarshal(raw, &c) != nil || c.Name == nil || !toolNameRE.MatchString(*c.Name) {
		return parsedCall{}, false
	}
	args := c.Arguments
	if args == nil {
		args = c.Parameters
	}
	if args == nil {
		args = json.RawMessage("{}")
	}
	if args[0] == '"' {
		var s string
		if json.Unmarshal(args, &s) != nil {
			return parsedCall{}, false
		}
		args = json.RawMessage(strings.TrimSpace(s))
	}
	if !isObject(args) {
		return parsedCall{}, false
	}
	return parsedCall{Name: *c.Name, Arguments: string(args)}, true
}

func isObject(raw []byte) bool {
	t := bytes.TrimSpace(raw)
	return len(t) > 0 && t[0] == '{' && json.Valid(t)
}

// callID is a new tool call id: "call_" and 24 random letters and digits,
// or 9 of them for Mistral, whose template refuses any other id.
func callID(fam toolFamily) string {
	const alnum = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	n, prefix := 24, "call_"
	if fam == familyMistral {
		n, prefix = 9, ""
	}
	b := make([]byte, n)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = alnum[int(b[i])%len(alnum)]
	}
	return prefix + string(b)
}

// forcingGrammar is the GBNF that makes the model call a tool: the family's
// call syntax, a call object {"name": <const>, "arguments": <schema>} per
// allowed tool (an alternation), one call or — with parallel_tool_calls —
// one or more. Each tool's parameters grammar (engine/jsonschema) has its
// rules renamed apart ("t<i>-" prefix) so that they combine.
func forcingGrammar(ts *toolSetup) (string, error) {
	var b strings.Builder
	var alts []string
	for i, t := range ts.tools {
		if ts.choice == "function" && t.Name != ts.named {
			continue
		}
		prefix := fmt.Sprintf("t%d-", i)
		renamed, err := renameRules(ts.grammars[i], prefix)
		if err != nil {
			return "", fmt.Errorf("tool %q: %w", t.Name, err)
		}
		key := "arguments"
		if ts.family == familyLlama3 {
			key = "parameters"
		}
		fmt.Fprintf(&b, "call-%d ::= %s %sroot %s\n", i, gbnfLiteral(`{"name": "`+t.Name+`", "`+key+`": `), prefix, gbnfLiteral("}"))
		b.WriteString(renamed)
		b.WriteByte('\n')
		alts = append(alts, fmt.Sprintf("call-%d", i))
	}
	if len(alts) == 0 {
		return "", fmt.Errorf("no tool to call")
	}
	fmt.Fprintf(&b, "call ::= %s\n", strings.Join(alts, " | "))
	var root string
	switch ts.family {
	case familyHermes:
		one := gbnfLiteral(hermesOpen+"\n") + " call " + gbnfLiteral("\n"+hermesClose)
		root = one
		if ts.parallel {
			root = one + " ( " + gbnfLiteral("\n") + " " + one + " )*"
		}
	case familyLlama3:
		root = "call"
		if ts.parallel {
			root = "call ( " + gbnfLiteral("; ") + " call )*"
		}
	case familyMistral:
		// The [TOOL_CALLS] marker is a control token, which a grammar
		// cannot produce; the bare array parses the same.
		root = gbnfLiteral("[") + " call ( " + gbnfLiteral(", ") + " call )* " + gbnfLiteral("]")
		if !ts.parallel {
			root = gbnfLiteral("[") + " call " + gbnfLiteral("]")
		}
	default:
		root = "call"
		if ts.parallel {
			root = gbnfLiteral("[") + " call ( " + gbnfLiteral(", ") + " call )* " + gbnfLiteral("]")
		}
	}
	return "root ::= " + root + "\n" + b.String(), nil
}

// gbnfLiteral quotes s as a GBNF string literal.
func gbnfLiteral(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// renameRules prefixes every rule name of GBNF source src — definitions
// and references — leaving string literals, character classes, repetition
// counts and comments alone.
func renameRules(src, prefix string) (string, error) {
	var b strings.Builder
	isWord := func(c byte) bool {
		return c == '-' || c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
	}
	for i := 0; i < len(src); {
		c := src[i]
		switch {
		case c == '"' || c == '[':
			end := byte('"')
			if c == '[' {
				end = ']'
			}
			j := i + 1
			for ; j < len(src) && src[j] != end; j++ {
				if src[j] == '\\' {
					j++
				}
			}
			if j >= len(src) {
				return "", fmt.Errorf("unterminated %c at offset %d", c, i)
			}
			b.WriteString(src[i : j+1])
			i = j + 1
		case c == '{':
			j := strings.IndexByte(src[i:], '}')
			if j < 0 {
				return "", fmt.Errorf("unterminated { at offset %d", i)
			}
			b.WriteString(src[i : i+j+1])
			i += j + 1
		case c == '#':
			j := strings.IndexByte(src[i:], '\n')
			if j < 0 {
				j = len(src) - i
			}
			b.WriteString(src[i : i+j])
			i += j
		case isWord(c):
			j := i
			for j < len(src) && isWord(src[j]) {
				j++
			}
			b.WriteString(prefix)
			b.WriteString(src[i:j])
			i = j
		default:
			b.WriteByte(c)
			i++
		}
	}
	return b.String(), nil
}

// toolStream splits a streamed output into content, sent as it comes, and
// tool calls, sent when the output ends. Text that may be the start of a
// call is held back, as a stop string's prefix is: for the Hermes family a
// suffix that is a prefix of <tool_call> (and the whitespace before it),
// for the JSON families an output whose first non-space character opens
// JSON (or a marker) — all of it, until the end shows whether it parses.
type toolStream struct {
	ts   *toolSetup
	held string // text not yet sent
	// calling: the held text is a call (or may be one) to the end.
	calling bool
	// plain: the output is known to hold no call (JSON families).
	plain bool
}

func newToolStream(ts *toolSetup) *toolStream { return &toolStream{ts: ts} }

// push takes the next piece of output and returns the content to send now.
func (s *toolStream) push(text string) string {
	if s.plain {
		return text
	}
	s.held += text
	if s.calling {
		return ""
	}
	if s.ts.family == familyHermes {
		if i := strings.Index(s.held, hermesOpen); i >= 0 {
			// The whitespace before the call stays held: dropped if
			// the call parses, content if it does not.
			out := strings.TrimRight(s.held[:i], " \t\r\n")
			s.held, s.calling = s.held[len(out):], true
			return out
		}
		keep := markerPrefixLen(s.held, hermesOpen)
		body := s.held[:len(s.held)-keep]
		ws := len(body) - len(strings.TrimRight(body, " \t\r\n"))
		keep += ws
		out := s.held[:len(s.held)-keep]
		s.held = s.held[len(s.held)-keep:]
		return out
	}
	t := strings.TrimLeft(s.held, " \t\r\n")
	switch {
	case t == "":
		return ""
	case t[0] == '{' || t[0] == '[' || strings.HasPrefix(t, llamaPyTag):
		s.calling = true
		return ""
	case strings.HasPrefix(llamaPyTag, t):
		return "" // may still become the tag
	}
	out := s.held
	s.held, s.plain = "", true
	return out
}

// markerPrefixLen is the length of the longest suffix of s that is a proper
// prefix of marker.
func markerPrefixLen(s, marker string) int {
	for n := min(len(s), len(marker)-1); n > 0; n-- {
		if strings.HasSuffix(s, marker[:n]) {
			return n
		}
	}
	return 0
}

// finish ends the output: the content still to send and the calls.
func (s *toolStream) finish() (string, []parsedCall) {
	held := s.held
	s.held = ""
	if !s.calling {
		return held, nil
	}
	content, calls, ok := parseToolCalls(s.ts.family, held, s.ts.declared)
	if !ok {
		return held, nil
	}
	if s.ts.family == familyHermes {
		// The text before the call was sent already.
		content = ""
	}
	return content, calls
}

// applyTools validates the request's tools into j: the tools to render and
// parse for and, when a call is forced, the grammar that forces it.
func (h *Handler) applyTools(in *chatRequest, j *job) *httpError {
	ts, herr := prepareTools(in, h.tmpl.family)
	if herr != nil {
		return herr
	}
	j.tools = ts
	if !ts.forced() {
		return nil
	}
	sp := j.req.Sampling
	if sp.GetGrammar() != "" || sp.GetJsonSchema() != "" {
		return invalid("tool_choice", "tool_choice %q forces a tool call and cannot be combined with response_format or grammar", ts.choice)
	}
	g, err := forcingGrammar(ts)
	if err != nil {
		return invalid("tools", "tools: %v", err)
	}
	sp.Grammar = g
	return nil
}

// messageToolCalls reads an assistant message's tool_calls.
func messageToolCalls(i int, raw json.RawMessage) ([]ToolCall, *httpError) {
	param := fmt.Sprintf("messages[%d].tool_calls", i)
	if isNull(raw) {
		return nil, nil
	}
	var list []struct {
		ID       *string `json:"id"`
		Type     *string `json:"type"`
		Function *struct {
			Name      *string         `json:"name"`
			Arguments json.RawMessage `json:"arguments"`
		} `json:"function"`
	}
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, invalid(param, "%s: expected an array of {\"id\", \"type\": \"function\", \"function\": {\"name\", \"arguments\"}}", param)
	}
	out := make([]ToolCall, len(list))
	for k, c := range list {
		p := fmt.Sprintf("%s[%d]", param, k)
		switch {
		case c.ID == nil || *c.ID == "":
			return nil, invalid(p+".id", "%s.id is required", p)
		case c.Type != nil && *c.Type != "function":
			return nil, invalid(p+".type", "%s.type %q: want \"function\"", p, *c.Type)
		case c.Function == nil:
			return nil, invalid(p+".function", "%s.function is required", p)
		case c.Function.Name == nil || *c.Function.Name == "":
			return nil, invalid(p+".function.name", "%s.function.name is required", p)
		}
		args := "{}"
		if !isNull(c.Function.Arguments) {
			if err := json.Unmarshal(c.Function.Arguments, &args); err != nil {
				return nil, invalid(p+".function.arguments", "%s.function.arguments: expected a string (the arguments' JSON)", p)
			}
		}
		out[k] = ToolCall{ID: *c.ID, Name: *c.Function.Name, Arguments: args}
	}
	return out, nil
}

// messageTools reads a message's tool_calls (assistant) and tool_call_id
// (tool) into out.
func messageTools(i int, m chatMessage, out *Message) *httpError {
	if !isNull(m.ToolCalls) {
		if out.Role != "assistant" {
			return invalid(fmt.Sprintf("messages[%d].tool_calls", i), "messages[%d].tool_calls: only assistant messages carry tool calls", i)
		}
		calls, herr := messageToolCalls(i, m.ToolCalls)
		if herr != nil {
			return herr
		}
		out.ToolCalls = calls
	}
	if out.Role == "tool" {
		if m.ToolCallID == "" {
			return invalid(fmt.Sprintf("messages[%d].tool_call_id", i), "messages[%d].tool_call_id is required for a tool message", i)
		}
		out.ToolCallID = m.ToolCallID
	}
	return nil
}

// forcedStream streams the calls of a forced reply (tool_choice required
// or a named function) as they are generated, as OpenAI does: the grammar
// fixes their syntax — {"name": "<name>", "<arguments|parameters>": <object>}
// inside the family's wrapping — so a call's first delta (index, id, type,
// name) goes out once its name is complete, and its arguments in fragments
// as they come. The fragments of a call put together are the arguments the
// whole reply would carry.
type forcedStream struct {
	ts    *toolSetup
	text  string // everything so far
	pos   int    // how far text has been read
	state int    // forcedSeek, forcedName, forcedKey, forcedArgs
	name  string
	calls int // calls begun
	// In the arguments: nesting depth, and inside a string (esc: after a
	// backslash).
	depth     int
	inStr     bool
	esc       bool
	complete  bool // the last call begun is complete
	fragStart int
}

const (
	forcedSeek = iota
	forcedName
	forcedKey
	forcedArgs
)

const callOpen = `{"name": "`

// push takes the next piece of output and returns the deltas it completes.
func (s *forcedStream) push(text string) []toolCallDelta {
	s.text += text
	var out []toolCallDelta
	for {
		switch s.state {
		case forcedSeek:
			i := strings.Index(s.text[s.pos:], callOpen)
			if i < 0 || s.calls == maxToolCalls {
				return out
			}
			s.pos += i + len(callOpen)
			s.state = forcedName
		case forcedName:
			i := strings.IndexByte(s.text[s.pos:], '"')
			if i < 0 {
				return out
			}
			s.name = s.text[s.pos : s.pos+i]
			s.pos += i + 1
			s.state = forcedKey
		case forcedKey:
			rest := s.text[s.pos:]
			key := ""
			for _, k := range []string{`, "arguments": `, `, "parameters": `} {
				if strings.HasPrefix(rest, k) {
					key = k
				} else if strings.HasPrefix(k, rest) {
					return out // not all there yet
				}
			}
			if key == "" {
				s.state = forcedSeek // not a call after all
				continue
			}
			s.pos += len(key)
			out = append(out, toolCallDelta{Index: s.calls, ID: callID(s.ts.family), Type: "function", Function: functionCall{Name: s.name}})
			s.calls++
			s.state, s.depth, s.inStr, s.esc, s.complete, s.fragStart = forcedArgs, 0, false, false, false, s.pos
		case forcedArgs:
			end := -1
			for i := s.pos; i < len(s.text) && end < 0; i++ {
				c := s.text[i]
				switch {
				case s.esc:
					s.esc = false
				case s.inStr && c == '\\':
					s.esc = true
				case s.inStr:
					s.inStr = c != '"'
				case c == '"':
					s.inStr = true
				case c == '{' || c == '[':
					s.depth++
				case c == '}' || c == ']':
					s.depth--
				}
				if s.depth == 0 && !s.inStr && c != ' ' && c != '\n' && c != '\t' && c != '\r' {
					end = i + 1
				}
			}
			if end < 0 {
				s.pos = len(s.text)
				if s.pos > s.fragStart {
					out = append(out, toolCallDelta{Index: s.calls - 1, Function: functionCall{Arguments: s.text[s.fragStart:s.pos]}})
					s.fragStart = s.pos
				}
				return out
			}
			s.pos = end
			out = append(out, toolCallDelta{Index: s.calls - 1, Function: functionCall{Arguments: s.text[s.fragStart:end]}})
			s.state, s.complete = forcedSeek, true
		}
	}
}

// finish ends the reply: the calls begun, and whether the last is
// complete. A reply in which no call began (a worker that did not follow
// the grammar) is read as tool_choice auto would read it: content, or the
// calls it holds.
func (s *forcedStream) finish() (content string, deltas []toolCallDelta, calls int, complete bool) {
	if s.calls > 0 {
		return "", nil, s.calls, s.complete
	}
	c, parsed := s.ts.parse(s.text)
	if len(parsed) == 0 {
		return s.text, nil, 0, true
	}
	if c != nil {
		content = *c
	}
	for i, p := range parsed {
		deltas = append(deltas, toolCallDelta{Index: i, ID: callID(s.ts.family), Type: "function", Function: functionCall{Name: p.Name}},
			toolCallDelta{Index: i, Function: functionCall{Arguments: p.Arguments}})
	}
	return content, deltas, len(parsed), true
}
