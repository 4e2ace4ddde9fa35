package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/ardanlabs/jinja"
	"github.com/baton-serving/baton/engine/tokenizer"
)

// Message is one turn of a conversation as a chat template sees it.
type Message struct {
	Role    string
	Content string
	Name    string // optional
	// ToolCalls are the calls an assistant turn made (role "assistant").
	ToolCalls []ToolCall
	// ToolCallID is the call a tool turn answers (role "tool").
	ToolCallID string
}

// ToolCall is one function call of an assistant turn.
type ToolCall struct {
	ID   string
	Name string
	// Arguments is the arguments' JSON text, as OpenAI's API carries it.
	Arguments string
}

// ToolDef is a function the model may call, as the request declared it.
type ToolDef struct {
	Name        string
	Description *string         // nil: not given
	Parameters  json.RawMessage // nil: not given
}

// ChatTemplate turns a conversation into the prompt text of a model.
//
// A model's template is the Jinja source in its tokenizer.chat_template
// metadata, rendered as Hugging Face's apply_chat_template does (blocks
// trimmed, with messages, add_generation_prompt, bos_token and eos_token
// defined and raise_exception available). A model without a template gets
// the plain default: the messages' contents in order, joined by "\n", with
// no role markers and nothing added for the reply, so that a base model
// simply continues the text.
//
// Tools reach the template as Hugging Face passes them (see RenderTools).
// A template that never mentions tools — the plain default included — gets
// Baton's generic tools preamble instead (toolsPreamble), prepended to the
// system message (or the first message when there is none).
type ChatTemplate struct {
	tmpl     *jinja.Template // nil: the plain default
	bos, eos string
	// family is how the model writes tool calls, told by the markers
	// its template contains.
	family toolFamily
	// tools: the template renders a tools list itself.
	tools bool
	// warning: what the load found that can make a prompt differ from
	// jinja2's ("" when nothing).
	warning string
	// now is the clock strftime_now reads (time.Now; tests fix it so that
	// a template's date is the oracle's).
	now func() time.Time
}

// NewChatTemplate compiles src ("" for the plain default). bos and eos are
// the texts of the model's BOS and EOS tokens ("" when it has none).
func NewChatTemplate(src, bos, eos string) (*ChatTemplate, error) {
	c := &ChatTemplate{bos: bos, eos: eos, family: detectFamily(src), tools: strings.Contains(src, "tools"), now: time.Now}
	if strings.TrimSpace(src) == "" {
		return c, nil
	}
	pre := prepass(src)
	if len(pre.formatLines) > 0 {
		return nil, fmt.Errorf("chat template: line %d uses Python's %% formatting (\"...\" %% value), which the Jinja engine does not support: it would print a wrong prompt", pre.formatLines[0])
	}
	if len(pre.filterLines) > 0 {
		return nil, fmt.Errorf("chat template: line %d uses a filter block ({%% filter ... %%}) of tojson, string or join, where the Jinja engine would apply its own version, not Python's: write the filter as value | filter", pre.filterLines[0])
	}
	var warnings []string
	if len(pre.tildeLines) > 0 {
		warnings = append(warnings, fmt.Sprintf("line %d concatenates with ~, which prints a float, None or a list operand as the Jinja engine does, not as Python (2.0 as 2, None as an empty string)", pre.tildeLines[0]))
	}
	if len(pre.safeAddLines) > 0 {
		warnings = append(warnings, fmt.Sprintf("line %d adds to a value marked safe, where Python's jinja2 escapes the HTML characters of the other operand and the Jinja engine does not", pre.safeAddLines[0]))
	}
	if len(warnings) > 0 {
		c.warning = "chat template: " + strings.Join(warnings, "; ") + ": a prompt with such a value can differ from the model's own"
		slog.Warn(c.warning)
	}
	t, err := jinja.Compile(pre.src)
	if err != nil {
		return nil, fmt.Errorf("chat template: %w", err)
	}
	c.tmpl = t
	if err := c.selfCheck(); err != nil {
		return nil, err
	}
	return c, nil
}

// ChatTemplateFor compiles the chat template of the model whose tokenizer is
// tok, or override when it is not "".
func ChatTemplateFor(tok *tokenizer.Tokenizer, override string) (*ChatTemplate, error) {
	src := override
	if src == "" {
		src = tok.ChatTemplate()
	}
	return NewChatTemplate(src, tokenText(tok, tok.BOS()), tokenText(tok, tok.EOS()))
}

func tokenText(tok *tokenizer.Tokenizer, id int32) string {
	if id == tokenizer.NoToken {
		return ""
	}
	return tok.Token(id)
}

// ToolFamily names how the model writes tool calls, as the template's
// markers tell it: "llama3", "hermes", "mistral" or "generic" (none
// recognised: the generic JSON form).
func (c *ChatTemplate) ToolFamily() string { return c.family.String() }

// RendersTools reports whether the template shows tools itself; otherwise
// Baton puts a generic tools preamble in front of the prompt.
func (c *ChatTemplate) RendersTools() bool { return c.tools }

// Warning is what loading the template found that can make a prompt
// differ from the one Python's jinja2 renders ("" when nothing); it is
// also logged at load.
func (c *ChatTemplate) Warning() string { return c.warning }

// Default reports whether c is the plain default template.
func (c *ChatTemplate) Default() bool { return c.tmpl == nil }

// Render returns the prompt for msgs; with addGenerationPrompt the template
// appends what opens the assistant's reply. An error is the template's own
// complaint (raise_exception) or a failure to evaluate it.
func (c *ChatTemplate) Render(msgs []Message, addGenerationPrompt bool) (string, error) {
	return c.RenderTools(msgs, nil, addGenerationPrompt)
}

// RenderTools is Render with the functions the model may call (none: nil).
// The template gets them as Hugging Face's apply_chat_template passes them,
// "tools": [{"type": "function", "function": {name, description,
// parameters}}] with the request's key order kept; assistant turns carry
// "tool_calls": [{id, type, function: {name, arguments}}] with arguments a
// mapping (what the Llama 3.x, Qwen and Mistral templates expect; text that
// is not a JSON object stays a string), and tool turns "tool_call_id".
func (c *ChatTemplate) RenderTools(msgs []Message, tools []ToolDef, addGenerationPrompt bool) (string, error) {
	return c.RenderVars(msgs, tools, addGenerationPrompt, nil)
}

// RenderVars is RenderTools with extra template variables, as Hugging
// Face's chat_template_kwargs pass them (e.g. "enable_thinking": false for
// Qwen3); the values are JSON-like Go values (bool, string, float64,
// []any, map[string]any) or json.RawMessage (valid JSON, which keeps its
// key order and its integers). A variable named as one Render sets, or as
// a template global, is an error (see reservedVars).
func (c *ChatTemplate) RenderVars(msgs []Message, tools []ToolDef, addGenerationPrompt bool, vars map[string]any) (out string, err error) {
	for k := range vars {
		if reservedVar(k) {
			return "", fmt.Errorf("chat template: the variable %q is the router's own and cannot be replaced", k)
		}
	}
	if len(tools) > 0 && !c.tools {
		msgs = withPreamble(msgs, toolsPreamble(tools))
	}
	if c.tmpl == nil {
		parts := make([]string, len(msgs))
		for i, m := range msgs {
			parts[i] = m.Content
			if len(m.ToolCalls) > 0 {
				parts[i] = strings.TrimSpace(m.Content + "\n" + genericCallsText(m.ToolCalls))
			}
		}
		return strings.Join(parts, "\n"), nil
	}
	list := make([]jinja.Value, len(msgs))
	for i, m := range msgs {
		mm := jinja.NewDict()
		d := mm.AsDict()
		d.Set("role", jinja.NewString(m.Role))
		d.Set("content", jinja.NewString(m.Content))
		if m.Name != "" {
			d.Set("name", jinja.NewString(m.Name))
		}
		if len(m.ToolCalls) > 0 {
			calls := make([]jinja.Value, len(m.ToolCalls))
			for k, tc := range m.ToolCalls {
				fn := jinja.NewDict()
				fn.AsDict().Set("name", jinja.NewString(tc.Name))
				fn.AsDict().Set("arguments", argumentsValue(tc.Arguments))
				call := jinja.NewDict()
				call.AsDict().Set("id", jinja.NewString(tc.ID))
				call.AsDict().Set("type", jinja.NewString("function"))
				call.AsDict().Set("function", fn)
				calls[k] = call
			}
			d.Set("tool_calls", jinja.NewList(calls))
		}
		if m.ToolCallID != "" {
			d.Set("tool_call_id", jinja.NewString(m.ToolCallID))
		}
		list[i] = mm
	}
	data := make(map[string]jinja.Value, len(vars)+8)
	for k, v := range vars {
		if raw, ok := v.(json.RawMessage); ok {
			data[k] = jsonValue(raw)
			continue
		}
		data[k] = jinja.FromGoValue(v)
	}
	data["messages"] = jinja.NewList(list)
	data["add_generation_prompt"] = jinja.NewBool(addGenerationPrompt)
	data["bos_token"] = jinja.NewString(c.bos)
	data["eos_token"] = jinja.NewString(c.eos)
	data["strftime_now"] = strftimeNow(c.now)
	data["raise_exception"] = raiseException()
	// Baton's filters under the names the pre-pass gave them.
	data[replacedFilters["tojson"]] = tojsonFilter()
	data[replacedFilters["string"]] = stringFilter()
	data[replacedFilters["join"]] = joinFilter()
	data[printFunc] = printValue()
	if len(tools) > 0 && c.tools {
		data["tools"] = templateTools(tools)
	}
	// The template comes from the model file, not the client, but a template
	// construct the engine mishandles must fail the request, not the router.
	defer func() {
		if r := recover(); r != nil {
			out, err = "", fmt.Errorf("chat template failed: %v", r)
		}
	}()
	out, err = c.tmpl.RenderValues(data)
	if err != nil {
		return "", fmt.Errorf("chat template: %w", err)
	}
	return out, nil
}

// reservedVars are the variables RenderVars sets itself — tools also when
// it sets none, since a template must not show a tool list the request did
// not declare — and the template engine's global functions, which a
// variable of the same name would hide (Qwen3's template calls namespace).
var reservedVars = func() map[string]bool {
	m := map[string]bool{}
	for _, n := range []string{"messages", "tools", "add_generation_prompt", "bos_token", "eos_token",
		"strftime_now", "raise_exception", "namespace", "range", "dict", "joiner", "cycler", "lipsum", "loop"} {
		m[n] = true
	}
	for _, n := range replacedFilters {
		m[n] = true
	}
	m[printFunc] = true
	return m
}()

// reservedVar reports whether name cannot be an extra template variable
// of RenderVars.
func reservedVar(name string) bool { return reservedVars[name] }

// templateTools is the tools list as Hugging Face hands it to templates.
func templateTools(tools []ToolDef) jinja.Value {
	list := make([]jinja.Value, len(tools))
	for i, t := range tools {
		fn := jinja.NewDict()
		fn.AsDict().Set("name", jinja.NewString(t.Name))
		if t.Description != nil {
			fn.AsDict().Set("description", jinja.NewString(*t.Description))
		}
		if t.Parameters != nil {
			fn.AsDict().Set("parameters", jsonValue(t.Parameters))
		}
		v := jinja.NewDict()
		v.AsDict().Set("type", jinja.NewString("function"))
		v.AsDict().Set("function", fn)
		list[i] = v
	}
	return jinja.NewList(list)
}

// argumentsValue is a call's arguments as templates expect them: the JSON
// object as a mapping, or the text itself when it is not one.
func argumentsValue(args string) jinja.Value {
	t := bytes.TrimSpace([]byte(args))
	if len(t) > 0 && t[0] == '{' && json.Valid(t) {
		return jsonValue(t)
	}
	return jinja.NewString(args)
}

// jsonValue converts valid JSON to a template value, keeping the order of
// object keys (Python's dicts keep it, so Hugging Face's tojson does).
func jsonValue(raw []byte) jinja.Value {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	v, err := decodeValue(dec)
	if err != nil {
		return jinja.NewString(string(raw))
	}
	return v
}

func decodeValue(dec *json.Decoder) (jinja.Value, error) {
	tok, err := dec.Token()
	if err != nil {
		return jinja.Undefined(), err
	}
	switch t := tok.(type) {
	case json.Delim:
		if t == '[' {
			var items []jinja.Value
			for dec.More() {
				v, err := decodeValue(dec)
				if err != nil {
					return v, err
				}
				items = append(items, v)
			}
			_, err := dec.Token()
			return jinja.NewList(items), err
		}
		d := jinja.NewDict()
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				return d, err
			}
			v, err := decodeValue(dec)
			if err != nil {
				return v, err
			}
			key, _ := k.(string)
			d.AsDict().Set(key, v)
		}
		_, err := dec.Token()
		return d, err
	default:
		return jinja.FromGoValue(t), nil
	}
}
