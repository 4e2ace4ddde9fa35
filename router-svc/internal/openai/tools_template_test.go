package openai

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// weatherTool is the tool the template tests declare.
var weatherTool = ToolDef{Name: "get_weather", Description: ptr("Current weather in a city"),
	Parameters: json.RawMessage(`{"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}`)}

func ptr[T any](v T) *T { return &v }

// toolHistory is a conversation with one tool round: the user asks, the
// assistant calls the tool, the tool answers.
func toolHistory() []Message {
	return []Message{
		{Role: "system", Content: "You help with the weather."},
		{Role: "user", Content: "What is the weather in Paris?"},
		{Role: "assistant", ToolCalls: []ToolCall{{ID: "abcDEF123", Name: "get_weather", Arguments: `{"city": "Paris"}`}}},
		{Role: "tool", Content: `{"temp": 21}`, ToolCallID: "abcDEF123"},
	}
}

// TestToolTemplates renders a tool conversation with test templates in the
// prompt formats of Llama 3.x, Qwen2.5, Qwen3 and Mistral (testdata/templates):
// the prompt shows the tool definition, the assistant's call in the
// family's syntax — which the family's parser reads back as the same call —
// and the tool's answer.
func TestToolTemplates(t *testing.T) {
	cases := []struct {
		file, bos, eos string
		family         toolFamily
		def, call, res string // fragments the prompt must contain
		end            string // what the prompt ends with
	}{
		{"llama3.jinja", "<|begin_of_text|>", "<|eot_id|>", familyLlama3,
			`"description": "Current weather in a city"`,
			`{"name": "get_weather", "parameters": {"city": "Paris"}}`,
			"<|start_header_id|>ipython<|end_header_id|>\n\n",
			"<|start_header_id|>assistant<|end_header_id|>\n\n"},
		{"qwen25.jinja", "", "<|im_end|>", familyHermes,
			`<tools>` + "\n" + `{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}` + "\n</tools>",
			"<tool_call>\n" + `{"name": "get_weather", "arguments": {"city": "Paris"}}` + "\n</tool_call>",
			"<tool_response>\n{\"temp\": 21}\n</tool_response>",
			"<|im_start|>assistant\n"},
		{"qwen3.jinja", "", "<|im_end|>", familyHermes,
			`{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}`,
			"<tool_call>\n" + `{"name": "get_weather", "arguments": {"city": "Paris"}}` + "\n</tool_call>",
			"<tool_response>\n{\"temp\": 21}\n</tool_response>",
			"<|im_start|>assistant\n"},
		{"mistral.jinja", "<s>", "</s>", familyMistral,
			`[AVAILABLE_TOOLS][{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}][/AVAILABLE_TOOLS]`,
			`[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abcDEF123"}]`,
			`[TOOL_RESULTS]{"content": {"temp": 21}, "call_id": "abcDEF123"}[/TOOL_RESULTS]`,
			`[/TOOL_RESULTS]`},
	}
	for _, c := range cases {
		t.Run(c.file, func(t *testing.T) {
			tmpl, err := NewChatTemplate(readTemplate(t, c.file), c.bos, c.eos)
			if err != nil {
				t.Fatal(err)
			}
			if tmpl.family != c.family || !tmpl.tools {
				t.Errorf("family %v (renders tools %v), want %v", tmpl.family, tmpl.tools, c.family)
			}
			got, err := tmpl.RenderTools(toolHistory(), []ToolDef{weatherTool}, true)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s", got)
			for what, frag := range map[string]string{"tool definition": c.def, "tool call": c.call, "tool result": c.res} {
				if !strings.Contains(got, frag) {
					t.Errorf("the prompt lacks the %s %q:\n%s", what, frag, got)
				}
			}
			if !strings.HasSuffix(got, c.end) {
				t.Errorf("the prompt does not end with %q:\n%s", c.end, got)
			}
			// The call as the template wrote it reads back as the call.
			_, calls, ok := parseToolCalls(c.family, c.call, func(string) bool { return true })
			if !ok || len(calls) != 1 || calls[0].Name != "get_weather" || !sameJSON(calls[0].Arguments, `{"city": "Paris"}`) {
				t.Errorf("the rendered call %q parses as %+v %v", c.call, calls, ok)
			}
			// tool_choice "none": the tools stay out of the prompt.
			none, err := tmpl.RenderTools(toolHistory(), nil, true)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(none, "Current weather in a city") {
				t.Errorf("without tools the prompt shows them:\n%s", none)
			}
		})
	}
}

// TestGenericToolsPreamble: a model without a template (or with one that
// cannot show tools) gets the tools as JSON and the answer format in front
// of the conversation, and its tool calls in the generic form.
func TestGenericToolsPreamble(t *testing.T) {
	plain, err := NewChatTemplate("", "<s>", "</s>")
	if err != nil {
		t.Fatal(err)
	}
	got, err := plain.RenderTools(toolHistory(), []ToolDef{weatherTool}, true)
	if err != nil {
		t.Fatal(err)
	}
	want := toolsPreamble([]ToolDef{weatherTool}) + "\n\nYou help with the weather.\nWhat is the weather in Paris?\n" +
		`{"name": "get_weather", "arguments": {"city": "Paris"}}` + "\n" + `{"temp": 21}`
	if got != want {
		t.Errorf("rendered\n%q\nwant\n%q", got, want)
	}
	for _, frag := range []string{"\n" + `{"name": "get_weather", "description": "Current weather in a city", "parameters": {"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}` + "\n",
		`{"name": <name>, "arguments": <JSON object>}`} {
		if !strings.Contains(got, frag) {
			t.Errorf("the preamble lacks %q", frag)
		}
	}
	if _, calls, ok := parseToolCalls(familyGeneric, `{"name": "get_weather", "arguments": {"city": "Paris"}}`, weatherDeclared); !ok || len(calls) != 1 {
		t.Error("the generic form does not parse")
	}
	// A template that never mentions tools: the preamble goes into its
	// first message.
	chatml, err := NewChatTemplate(`{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}`, "", "")
	if err != nil {
		t.Fatal(err)
	}
	got, err = chatml.RenderTools([]Message{{Role: "user", Content: "Hi"}}, []ToolDef{weatherTool}, false)
	if err != nil {
		t.Fatal(err)
	}
	if want := "<|im_start|>user\n" + toolsPreamble([]ToolDef{weatherTool}) + "\n\nHi<|im_end|>\n"; got != want {
		t.Errorf("rendered\n%q\nwant\n%q", got, want)
	}
}

func weatherDeclared(n string) bool { return n == "get_weather" }

func sameJSON(a, b string) bool {
	var x, y any
	return json.Unmarshal([]byte(a), &x) == nil && json.Unmarshal([]byte(b), &y) == nil && reflect.DeepEqual(x, y)
}
