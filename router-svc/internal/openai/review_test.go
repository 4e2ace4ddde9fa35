package openai_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/baton-serving/baton/engine/jsonschema"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/router-svc/internal/openai"
)

// Tests for the review findings of issue 20 (tools, strict fields, finish
// reasons).

// wholeChat is a non-streamed chat reply's first choice.
type wholeChat struct {
	content *string
	calls   []map[string]any
	finish  any
}

// scriptedChat posts body to a server whose worker answers with pieces
// (finishing with finish), whole and streamed, and returns both replies.
func scriptedChat(t *testing.T, pieces []string, finish batonv1.FinishReason, body string) (wholeChat, streamedChat) {
	t.Helper()
	eg := newEngineGen(t)
	gen := &scripted{got: make(chan *batonv1.GenerateRequest, 1), pieces: pieces, finish: finish}
	srv := apiServer(t, eg, gen, func(o *openai.Options) {
		o.Template = qwenTemplate(t, eg)
		o.Model.ContextLength = 1 << 14
	})
	resp, b := post(t, srv.URL+chatPath, body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	var out struct {
		Choices []struct {
			Message struct {
				Content   *string          `json:"content"`
				ToolCalls []map[string]any `json:"tool_calls"`
			} `json:"message"`
			FinishReason any `json:"finish_reason"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	w := wholeChat{content: out.Choices[0].Message.Content, calls: out.Choices[0].Message.ToolCalls, finish: out.Choices[0].FinishReason}
	resp, sb := post(t, srv.URL+chatPath, strings.Replace(body, `{`, `{"stream": true, `, 1))
	return w, reassemble(t, sseEvents(t, resp, sb))
}

const (
	weatherCall = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>"
	timeCall    = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"CET\"}}\n</tool_call>"
)

// TestToolParametersObjectRoot: a tool's parameters must describe an
// object (OpenAI answers 400 otherwise), naming the tool; {} and a schema
// with object keywords but no type are objects.
func TestToolParametersObjectRoot(t *testing.T) {
	eg := newEngineGen(t)
	srv := apiServer(t, eg, &scripted{pieces: []string{"ok"}}, func(o *openai.Options) { o.Model.ContextLength = 1 << 14 })
	fn := func(params string) string {
		return `{"max_tokens":2,` + userMsg + `,"tools":[{"type":"function","function":{"name":"lookup","parameters":` + params + `}}]}`
	}
	for _, params := range []string{`{"type":"string"}`, `{"type":"integer"}`, `{"enum":[1,2]}`, `{"type":["object","null"]}`} {
		t.Run(params, func(t *testing.T) {
			resp, b := post(t, srv.URL+chatPath, fn(params))
			e := checkError(t, resp.StatusCode, object(t, b), http.StatusBadRequest, "invalid_request_error", "tools[0].function.parameters")
			if msg, _ := e["message"].(string); !strings.Contains(msg, `"lookup"`) || !strings.Contains(msg, "object") {
				t.Errorf("message %q does not name the tool and say object", msg)
			}
		})
	}
	for _, params := range []string{`{}`, `{"properties":{"q":{"type":"string"}}}`, `{"type":"object"}`} {
		if resp, b := post(t, srv.URL+chatPath, fn(params)); resp.StatusCode != 200 {
			t.Errorf("%s: %d %s", params, resp.StatusCode, b)
		}
	}
}

// TestParallelToolCallsFalseAuto: with parallel_tool_calls false, tool_choice
// auto keeps only the first call, whole and streamed.
func TestParallelToolCallsFalseAuto(t *testing.T) {
	body := `{` + askWeather + `,` + weatherTools + `,"parallel_tool_calls":false}`
	w, s := scriptedChat(t, []string{weatherCall[:20], weatherCall[20:] + "\n", timeCall}, 0, body)
	if len(w.calls) != 1 || w.finish != "tool_calls" {
		t.Errorf("whole: %d calls, finish %v", len(w.calls), w.finish)
	}
	if len(s.calls) != 1 || s.finish != "tool_calls" {
		t.Errorf("stream: %d calls, finish %v", len(s.calls), s.finish)
	}
}

// TestToolCallsLengthFinish: a reply the worker cut at max_tokens says
// finish_reason "length", even when a call parsed, whole and streamed,
// auto and forced alike.
func TestToolCallsLengthFinish(t *testing.T) {
	for _, c := range []struct{ name, body string }{
		{"auto", `{` + askWeather + `,` + weatherTools + `}`},
		{"forced", `{` + askWeather + `,` + weatherTools + `,"tool_choice":"required"}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			w, s := scriptedChat(t, []string{weatherCall[:30], weatherCall[30:]}, batonv1.FinishReason_FINISH_REASON_LENGTH, c.body)
			if w.finish != "length" || len(w.calls) != 1 {
				t.Errorf("whole: finish %v, %d calls", w.finish, len(w.calls))
			}
			if s.finish != "length" || len(s.calls) != 1 {
				t.Errorf("stream: finish %v, %d calls", s.finish, len(s.calls))
			}
		})
	}
}

// TestHermesTrailingText: text after the last <tool_call> block is content,
// whole and streamed.
func TestHermesTrailingText(t *testing.T) {
	body := `{` + askWeather + `,` + weatherTools + `}`
	w, s := scriptedChat(t, []string{"Checking.\n", weatherCall, "\nI asked for ", "the weather."}, 0, body)
	want := "Checking.\nI asked for the weather."
	if w.content == nil || *w.content != want || len(w.calls) != 1 {
		t.Errorf("whole: content %v, %d calls; want %q", w.content, len(w.calls), want)
	}
	if s.content != want || len(s.calls) != 1 {
		t.Errorf("stream: content %q, %d calls; want %q", s.content, len(s.calls), want)
	}
}

// TestSchemaWithoutSchemaIsAnObject: response_format json_schema without
// a schema constrains the output to a JSON object, not to any value.
func TestSchemaWithoutSchemaIsAnObject(t *testing.T) {
	eg := newEngineGen(t)
	cap := &capture{eg: eg}
	srv := apiServer(t, eg, cap, nil)
	resp, b := post(t, srv.URL+chatPath, `{`+userMsg+`,"max_tokens":2,"response_format":{"type":"json_schema","json_schema":{"name":"a"}}}`)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	if g := cap.request().GetSampling().GetGrammar(); g != jsonschema.AnyObject {
		t.Errorf("grammar = %q, want jsonschema.AnyObject", g)
	}
}

// TestToolFieldsWithoutTools: tool_choice and parallel_tool_calls without
// tools (tools: [] counts as none) are a 400, as OpenAI answers.
func TestToolFieldsWithoutTools(t *testing.T) {
	eg := newEngineGen(t)
	srv := apiServer(t, eg, nil, nil)
	for _, c := range []struct{ name, extra, param string }{
		{"tool_choice auto", `"tool_choice":"auto"`, "tool_choice"},
		{"tool_choice none", `"tool_choice":"none"`, "tool_choice"},
		{"tool_choice with tools []", `"tools":[],"tool_choice":"auto"`, "tool_choice"},
		{"parallel_tool_calls", `"parallel_tool_calls":true`, "parallel_tool_calls"},
	} {
		t.Run(c.name, func(t *testing.T) {
			resp, b := post(t, srv.URL+chatPath, `{`+userMsg+`,"max_tokens":2,`+c.extra+`}`)
			e := checkError(t, resp.StatusCode, object(t, b), http.StatusBadRequest, "invalid_request_error", c.param)
			if msg, _ := e["message"].(string); !strings.Contains(msg, "only allowed when 'tools' are specified") {
				t.Errorf("message %q", msg)
			}
		})
	}
	if resp, b := post(t, srv.URL+chatPath, `{`+userMsg+`,"max_tokens":2,"tools":[]}`); resp.StatusCode != 200 {
		t.Errorf("tools []: %d %s", resp.StatusCode, b)
	}
}

// nestedUnknown are unknown keys inside the objects of tools, tool_choice,
// tool calls and content parts.
var nestedUnknown = []struct{ name, body, param string }{
	{"tool", `{` + userMsg + `,"tools":[{"type":"function","function":{"name":"f"},"strict":true}]}`, "tools[0].strict"},
	{"function typo", `{` + userMsg + `,"tools":[{"type":"function","function":{"name":"f","parameter":{"type":"object"}}}]}`, "tools[0].function.parameter"},
	{"tool_choice", `{` + userMsg + `,"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"f"},"x":1}}`, "tool_choice.x"},
	{"tool_choice.function", `{` + userMsg + `,"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"f","args":1}}}`, "tool_choice.function.args"},
	{"tool call", `{"messages":[{"role":"user","content":"a"},{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"},"index":0,"weight":1}]},{"role":"tool","tool_call_id":"c","content":"1"}]}`, "messages[1].tool_calls[0].weight"},
	{"tool call function", `{"messages":[{"role":"user","content":"a"},{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}","x":2}}]},{"role":"tool","tool_call_id":"c","content":"1"}]}`, "messages[1].tool_calls[0].function.x"},
	{"content part", `{"messages":[{"role":"user","content":[{"type":"text","text":"a","cache_control":{}}]}]}`, "messages[0].content[0].cache_control"},
}

// TestNestedUnknownFields: unknown keys inside tools, tool_choice, tool
// calls and content parts are refused as unknown top-level ones are, and
// ignored with --openai-lenient.
func TestNestedUnknownFields(t *testing.T) {
	eg := newEngineGen(t)
	srv := apiServer(t, eg, nil, nil)
	lenient := apiServer(t, eg, nil, func(o *openai.Options) { o.Lenient = true })
	for _, c := range nestedUnknown {
		t.Run(c.name, func(t *testing.T) {
			body := strings.Replace(c.body, `{`, `{"max_tokens":2,`, 1)
			resp, b := post(t, srv.URL+chatPath, body)
			obj := checkError(t, resp.StatusCode, object(t, b), 400, "invalid_request_error", c.param)
			if want := "Unrecognized request argument supplied: " + c.param; obj["message"] != want {
				t.Errorf("message = %q, want %q", obj["message"], want)
			}
			if resp, b := post(t, lenient.URL+chatPath, body); resp.StatusCode != 200 {
				t.Errorf("lenient: %d %s", resp.StatusCode, b)
			}
		})
	}
}

// TestNoOpFieldsAccepted: the fields newer SDKs send that Baton has no use
// for are accepted; a wrong type is still a 400 naming them.
func TestNoOpFieldsAccepted(t *testing.T) {
	eg := newEngineGen(t)
	srv := apiServer(t, eg, nil, nil)
	body := `{` + userMsg + `,"max_tokens":2,"reasoning_effort":"low","prompt_cache_key":"k","safety_identifier":"s","verbosity":"medium"}`
	if resp, b := post(t, srv.URL+chatPath, body); resp.StatusCode != 200 {
		t.Errorf("%d %s", resp.StatusCode, b)
	}
	for _, f := range []string{"reasoning_effort", "prompt_cache_key", "safety_identifier", "verbosity"} {
		resp, b := post(t, srv.URL+chatPath, `{`+userMsg+`,"max_tokens":2,"`+f+`":3}`)
		checkError(t, resp.StatusCode, object(t, b), 400, "invalid_request_error", f)
	}
}

// TestChatTemplateToolInfo: what the router logs at startup about tool
// calls — the family the template's markers tell and whether it shows the
// tools itself.
func TestChatTemplateToolInfo(t *testing.T) {
	eg := newEngineGen(t)
	q := qwenTemplate(t, eg)
	if q.ToolFamily() != "hermes" || !q.RendersTools() {
		t.Errorf("qwen2.5: %q %v", q.ToolFamily(), q.RendersTools())
	}
	plain, err := openai.NewChatTemplate("", "", "")
	if err != nil {
		t.Fatal(err)
	}
	if plain.ToolFamily() != "generic" || plain.RendersTools() {
		t.Errorf("plain default: %q %v", plain.ToolFamily(), plain.RendersTools())
	}
}

// TestCaseMismatchedKeys: keys match the documented names exactly, as
// OpenAI matches them: "Max_Tokens" is unrecognized in strict mode, and
// with --openai-lenient it is ignored — not honoured as max_tokens, as
// encoding/json's case-insensitive matching would.
func TestCaseMismatchedKeys(t *testing.T) {
	eg := newEngineGen(t)
	srv := apiServer(t, eg, nil, nil)
	for _, c := range []struct{ path, body, param string }{
		{cmplPath, `{"prompt":"x","Max_Tokens":1}`, "Max_Tokens"},
		{chatPath, `{"messages":[{"Role":"user","role":"user","content":"x"}]}`, "messages[0].Role"},
	} {
		resp, b := post(t, srv.URL+c.path, c.body)
		checkError(t, resp.StatusCode, object(t, b), 400, "invalid_request_error", c.param)
	}
	cap := &capture{eg: eg}
	lenient := apiServer(t, eg, cap, func(o *openai.Options) { o.Lenient = true })
	resp, b := post(t, lenient.URL+cmplPath, `{"prompt":"x","Max_Tokens":1,"stream_options":null,"Stream_Options":{"Include_Usage":true}}`)
	if resp.StatusCode != 200 {
		t.Fatalf("lenient: %d %s", resp.StatusCode, b)
	}
	if n := cap.request().GetSampling().GetMaxNewTokens(); n == 1 {
		t.Errorf("lenient: Max_Tokens was honoured as max_tokens (max_new_tokens %d)", n)
	}
}

// TestMaxTokenBytesOption: Options.MaxTokenBytes, computed once by the
// router, is the byte bound the handler checks prompts with.
func TestMaxTokenBytesOption(t *testing.T) {
	eg := newEngineGen(t)
	srv := apiServer(t, eg, nil, func(o *openai.Options) { o.MaxTokenBytes = 1 })
	// 200 bytes: more than stories260K's 127 prompt tokens of 1 byte.
	resp, b := post(t, srv.URL+cmplPath, `{"prompt":"`+strings.Repeat("a", 200)+`","max_tokens":1}`)
	e := checkError(t, resp.StatusCode, object(t, b), 400, "invalid_request_error", "prompt")
	if msg, _ := e["message"].(string); !strings.Contains(msg, "(1 bytes at most per token") {
		t.Errorf("message %q", msg)
	}
}

// TestChatPrecheck: chat messages whose contents' JSON strings together
// are past six times the prompt byte bound are refused before the body is
// decoded (a 3 MB message costs no decoding), as completions' prompt is;
// other strings (a name) do not count, and contents within it pass on.
func TestChatPrecheck(t *testing.T) {
	eg := newEngineGen(t)
	// A byte bound of 127 (the context window less one, 1 byte a token).
	srv := apiServer(t, eg, nil, func(o *openai.Options) { o.MaxTokenBytes = 1 })
	half := strings.Repeat("a", 6*127/2+1)
	// max_tokens "x" would be the decoder's 400: the precheck answers first.
	over := `{"messages":[{"role":"user","content":"` + half + `"},{"role":"user","content":[{"type":"text","text":"` + half + `"}]}],"max_tokens":"x"}`
	resp, b := post(t, srv.URL+chatPath, over)
	e := checkError(t, resp.StatusCode, object(t, b), 400, "invalid_request_error", "messages")
	if e["code"] != "context_length_exceeded" {
		t.Errorf("code %v: %s", e["code"], b)
	}
	named := `{"messages":[{"role":"user","content":"hi","name":"` + strings.Repeat("n", 2000) + `"}],"max_tokens":"x"}`
	resp, b = post(t, srv.URL+chatPath, named)
	checkError(t, resp.StatusCode, object(t, b), 400, "invalid_request_error", "max_tokens")
}
