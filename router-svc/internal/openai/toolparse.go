package openai

import (
	"bytes"
	"encoding/json"
	"strings"
)

// The tool-call parsers, one per family (see tools.go).

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
		if calls, before, ok := parseHermes(text, declared); ok {
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

// parseHermes reads <tool_call>{json}</tool_call> blocks from the first
// <tool_call> on; the last may lack its closing tag (the generation ended
// at it). The calls end at the first thing that is not a block holding a
// call to a declared tool; the output has calls when its first block does.
func parseHermes(text string, declared func(string) bool) ([]parsedCall, string, bool) {
	i := strings.Index(text, hermesOpen)
	if i < 0 {
		return nil, "", false
	}
	before, rest := text[:i], text[i:]
	var calls []parsedCall
	for len(calls) < maxToolCalls {
		c, r, st := hermesNext(rest, declared, true)
		if st != hermesCall {
			break
		}
		calls, rest = append(calls, c), r
	}
	return calls, before, len(calls) > 0
}

// What hermesNext found.
const (
	hermesCall = iota // a block holding a call
	hermesMore        // maybe a block: more text will tell
	hermesEnd         // no block, or one that holds no call
)

// hermesNext reads the <tool_call> block at the start of rest (after
// whitespace): the call and what follows the block. Unless final (the
// output has ended), an unclosed block or a prefix of <tool_call> is
// hermesMore.
func hermesNext(rest string, declared func(string) bool, final bool) (parsedCall, string, int) {
	t := strings.TrimLeft(rest, " \t\r\n")
	if !strings.HasPrefix(t, hermesOpen) {
		if !final && strings.HasPrefix(hermesOpen, t) {
			return parsedCall{}, rest, hermesMore
		}
		return parsedCall{}, rest, hermesEnd
	}
	body, after := t[len(hermesOpen):], ""
	if j := strings.Index(body, hermesClose); j >= 0 {
		body, after = body[:j], body[j+len(hermesClose):]
	} else if !final {
		return parsedCall{}, rest, hermesMore
	}
	c, ok := decodeCall([]byte(strings.TrimSpace(body)))
	if !ok || (declared != nil && !declared(c.Name)) {
		return parsedCall{}, rest, hermesEnd
	}
	return c, after, hermesCall
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
