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
	content, calls, _, ok = parseToolCallsDropped(fam, text, declared)
	return content, calls, ok
}

// parseToolCallsDropped is parseToolCalls that also returns the text it
// dropped: a malformed <tool_call> block after the calls (Hermes) and what
// follows it.
func parseToolCallsDropped(fam toolFamily, text string, declared func(string) bool) (content string, calls []parsedCall, dropped string, ok bool) {
	switch fam {
	case familyHermes:
		if calls, before, after, dropped, ok := parseHermes(text, declared); ok {
			content := strings.TrimRight(before, " \t\r\n")
			if after != "" && content != "" {
				content += "\n"
			}
			return content + after, calls, dropped, true
		}
		return text, nil, "", false
	case familyMistral:
		if calls, ok := parseMistral(text); ok && allDeclared(calls, declared) {
			return "", calls, "", true
		}
	}
	if calls, ok := parseJSONCalls(text); ok && allDeclared(calls, declared) {
		return "", calls, "", true
	}
	return text, nil, "", false
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
// What follows the calls is more content (after, leading space trimmed)
// unless it is a malformed block, which is dropped with all after it.
func parseHermes(text string, declared func(string) bool) (calls []parsedCall, before, after, dropped string, ok bool) {
	i := strings.Index(text, hermesOpen)
	if i < 0 {
		return nil, "", "", "", false
	}
	before, rest := text[:i], text[i:]
	for len(calls) < maxToolCalls {
		c, r, st := hermesNext(rest, declared, true)
		if st != hermesCall {
			break
		}
		calls, rest = append(calls, c), r
	}
	after, dropped = hermesAfter(rest, len(calls) == maxToolCalls)
	return calls, before, after, dropped, len(calls) > 0
}

// hermesAfter splits what follows the last call (full: the call limit was
// reached) into content and dropped text: a block that held no call, or
// the start of one cut off by the end of the output, is dropped.
func hermesAfter(rest string, full bool) (after, dropped string) {
	t := strings.TrimLeft(rest, " \t\r\n")
	if full || strings.HasPrefix(t, hermesOpen) || (t != "" && strings.HasPrefix(hermesOpen, t)) {
		return "", t
	}
	return t, ""
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

// callKeys are the keys a call object may have; an object with any other
// (say {"name": "search", "query": "x"}, an answer that happens to name a
// tool) is not a call.
var callKeys = map[string]bool{"name": true, "arguments": true, "parameters": true, "type": true, "id": true}

// decodeCall reads {"name": ..., "arguments"|"parameters": {...}} (and
// optionally "type" and "id"); the arguments may also be a JSON string
// holding the object, as some models write them.
func decodeCall(raw []byte) (parsedCall, bool) {
	var keys map[string]json.RawMessage
	if !isObject(raw) || json.Unmarshal(raw, &keys) != nil {
		return parsedCall{}, false
	}
	for k := range keys {
		if !callKeys[k] {
			return parsedCall{}, false
		}
	}
	_, hasArgs := keys["arguments"]
	_, hasParams := keys["parameters"]
	if hasArgs && hasParams {
		return parsedCall{}, false
	}
	var name string
	if json.Unmarshal(keys["name"], &name) != nil || !toolNameRE.MatchString(name) {
		return parsedCall{}, false
	}
	args := keys["arguments"]
	if args == nil {
		args = keys["parameters"]
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
	return parsedCall{Name: name, Arguments: string(args)}, true
}

func isObject(raw []byte) bool {
	t := bytes.TrimSpace(raw)
	return len(t) > 0 && t[0] == '{' && json.Valid(t)
}
