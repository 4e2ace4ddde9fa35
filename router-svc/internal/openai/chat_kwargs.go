package openai

import (
	"bytes"
	"encoding/json"
	"regexp"
)

// Bounds of chat_template_kwargs: the variables reach every render of the
// request's prompt, so a client cannot make that arbitrarily costly.
const (
	maxTemplateKwargs      = 64
	maxTemplateKwargsBytes = 16 << 10
)

// templateVarName is what a template can refer to by name: a Jinja (and
// Python) identifier, ASCII only.
var templateVarName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// parseTemplateKwargs reads chat_template_kwargs: null, or an object of at
// most maxTemplateKwargs variables (maxTemplateKwargsBytes of JSON) whose
// keys are identifiers other than the router's own variables
// (reservedVars) and whose values are any JSON, handed to the template as
// they are (RenderVars). enable_thinking, the variable Qwen3's template
// reads, must be a boolean: a string "false" would silently leave thinking
// on, and llama-server refuses it too. Every fault names the field, and a
// key's fault the key (chat_template_kwargs.KEY), the first in body order.
func parseTemplateKwargs(raw json.RawMessage) (map[string]any, *httpError) {
	const param = "chat_template_kwargs"
	if isNull(raw) {
		return nil, nil
	}
	raw = bytes.TrimSpace(raw)
	if raw[0] != '{' {
		return nil, invalid(param, `%s: expected an object of template variables, such as {"enable_thinking": false}`, param)
	}
	if len(raw) > maxTemplateKwargsBytes {
		return nil, invalid(param, "%s: %d bytes; at most %d are allowed", param, len(raw), maxTemplateKwargsBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if _, err := dec.Token(); err != nil {
		return nil, invalid(param, "%s: %v", param, err)
	}
	vars := map[string]any{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, invalid(param, "%s: %v", param, err)
		}
		key, _ := tok.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, invalid(param, "%s: %v", param, err)
		}
		p := param + "." + key
		switch {
		case !templateVarName.MatchString(key):
			return nil, invalid(p, "%s: %q is not a template variable name (an ASCII identifier: a letter or _, then letters, digits or _)", p, key)
		case reservedVar(key):
			return nil, invalid(p, "%s: %q is a variable the router sets itself or a template global; it cannot be replaced", p, key)
		case vars[key] != nil:
			return nil, invalid(p, "%s is given twice", p)
		case key == "enable_thinking" && !isNull(v) && !isBool(v):
			return nil, invalid(p, "%s: expected a boolean", p)
		}
		if len(vars) == maxTemplateKwargs {
			return nil, invalid(param, "%s: more than %d variables; at most %d are allowed", param, maxTemplateKwargs, maxTemplateKwargs)
		}
		vars[key] = v
	}
	return vars, nil
}

func isBool(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return bytes.Equal(t, []byte("true")) || bytes.Equal(t, []byte("false"))
}
