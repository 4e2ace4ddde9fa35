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
// Files: tools.go (validation, rendering, ids), toolparse.go (the parsers),
// toolgrammar.go (forcing), toolstream.go (streaming).
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
	// single: parallel_tool_calls false, at most one call (forced or
	// parsed).
	single bool
	family toolFamily
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
// none) and the calls, or the text as content when it holds none; dropped
// is the malformed text after the calls that is neither (for the log).
func (ts *toolSetup) parse(text string) (content *string, calls []parsedCall, dropped string) {
	if !ts.parses() {
		return &text, nil, ""
	}
	c, calls, dropped, ok := parseToolCallsDropped(ts.family, text, ts.declared)
	if !ok {
		return &text, nil, ""
	}
	calls = ts.limit(calls)
	if c == "" {
		return nil, calls, dropped
	}
	return &c, calls, dropped
}

// limit keeps only the first call with parallel_tool_calls false.
func (ts *toolSetup) limit(calls []parsedCall) []parsedCall {
	if ts.single && len(calls) > 1 {
		return calls[:1]
	}
	return calls
}

var toolNameRE = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

// prepareTools validates tools, tool_choice and parallel_tool_calls (and
// refuses the deprecated functions). It returns nil when
// the request declares no tools.
func prepareTools(in *chatRequest, family toolFamily) (*toolSetup, *httpError) {
	if !isNull(in.Functions) {
		return nil, invalid("functions", "functions is deprecated and not supported; declare them as tools: [{\"type\": \"function\", \"function\": {...}}]")
	}
	ts := &toolSetup{choice: "auto", family: family}
	if in.ParallelToolCalls != nil {
		ts.single = !*in.ParallelToolCalls
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
		// As OpenAI answers (tools: [] counts as none).
		switch {
		case !isNull(in.ToolChoice):
			return nil, invalid("tool_choice", "tool_choice is only allowed when 'tools' are specified")
		case in.ParallelToolCalls != nil:
			return nil, invalid("parallel_tool_calls", "parallel_tool_calls is only allowed when 'tools' are specified")
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

// objectKeywords are the JSON Schema keywords that only constrain objects:
// a parameters schema without "type" is read as an object schema when it
// has one of them.
var objectKeywords = []string{"properties", "required", "additionalProperties", "patternProperties",
	"minProperties", "maxProperties", "propertyNames", "dependentRequired", "dependentSchemas"}

// objectRoot checks that a tool's parameters schema (root, raw: its
// top-level keywords and text) describes an object — the arguments are a
// JSON object, and OpenAI refuses any other parameters — and returns the
// schema to compile: raw itself, or with "type": "object" added when it
// says so only by object keywords (without a type, JSON Schema would
// allow any non-object value).
func objectRoot(root map[string]json.RawMessage, raw []byte) ([]byte, string) {
	if ty, ok := root["type"]; ok {
		var s string
		if json.Unmarshal(ty, &s) != nil || s != "object" {
			return nil, fmt.Sprintf(`the schema's root must be {"type": "object"} (got "type": %s): a tool's arguments are a JSON object`, bytes.TrimSpace(ty))
		}
		return raw, ""
	}
	for _, k := range objectKeywords {
		if _, ok := root[k]; ok {
			root["type"] = json.RawMessage(`"object"`)
			b, err := json.Marshal(root)
			if err != nil {
				return nil, err.Error()
			}
			return b, ""
		}
	}
	return nil, `the schema's root must be {"type": "object"}: a tool's arguments are a JSON object`
}

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
	params, ok := fields["parameters"]
	if !ok || isNull(params) {
		// No parameters: any object, as OpenAI reads the tool.
		return def, jsonschema.AnyObject, nil
	}
	var root map[string]json.RawMessage
	if err := json.Unmarshal(params, &root); err != nil {
		return def, "", invalid(p+".function.parameters", "%s.function.parameters of tool %q: expected a JSON Schema object", p, def.Name)
	}
	def.Parameters = bytes.TrimSpace(params)
	if len(root) == 0 {
		return def, jsonschema.AnyObject, nil
	}
	schema, fault := objectRoot(root, def.Parameters)
	if fault != "" {
		return def, "", invalid(p+".function.parameters", "%s.function.parameters of tool %q: %s", p, def.Name, fault)
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

// withPreamble puts text in front of the system message, else in front of
// the first user message (templates differ in whether they accept a system
// turn at all), never into an assistant or tool turn; with neither, it is
// a system message of its own.
func withPreamble(msgs []Message, text string) []Message {
	out := append([]Message(nil), msgs...)
	at := -1
	for i, m := range out {
		if (i == 0 && m.Role == "system") || m.Role == "user" {
			at = i
			break
		}
	}
	if at < 0 {
		return append([]Message{{Role: "system", Content: text}}, out...)
	}
	out[at].Content = text + "\n\n" + out[at].Content
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

// applyTools validates the request's tools into j: the tools to render and
// parse for and, when a call is forced, the grammar that forces it.
func (h *Handler) applyTools(in *chatRequest, j *job) *httpError {
	ts, herr := prepareTools(in, h.tmpl.family)
	if herr != nil {
		return herr
	}
	j.tools = ts
	if ts.parses() {
		j.markers = h.markers
	}
	if !ts.forced() {
		return nil
	}
	sp := j.req.Sampling
	if sp.GetGrammar() != "" || sp.GetJsonSchema() != "" {
		return invalid("tool_choice", "tool_choice %q forces a tool call and cannot be combined with response_format or grammar", ts.choice)
	}
	g, err := forcingGrammar(ts)
	if err == nil {
		// Checked here so that a fault is a 400 naming tools, the
		// field the client sent, not grammar, which it did not.
		err = parseGrammar(g)
	}
	if err != nil {
		return invalid("tools", "tools: the call-forcing grammar: %v", err)
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
