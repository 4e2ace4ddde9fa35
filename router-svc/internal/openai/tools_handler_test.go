package openai_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/router-svc/internal/openai"
	santhosh "github.com/santhosh-tekuri/jsonschema/v6"
)

const (
	weatherParams = `{"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]}, "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"], "additionalProperties": false}`
	timeParams    = `{"type": "object", "properties": {"zone": {"enum": ["CET", "UTC"]}}, "required": ["zone"], "additionalProperties": false}`
	weatherTools  = `"tools": [{"type": "function", "function": {"name": "get_weather", "description": "Current weather", "parameters": ` + weatherParams + `}},` +
		`{"type": "function", "function": {"name": "get_time", "parameters": ` + timeParams + `}}]`
	askWeather = `"messages": [{"role": "user", "content": "What is the weather in Paris?"}]`
)

// TestToolsBadRequests: every wrong tools, tool_choice and
// parallel_tool_calls, and every wrong tool message, is a 400 naming the
// field.
func TestToolsBadRequests(t *testing.T) {
	eg := newEngineGen(t)
	srv := apiServer(t, eg, nil, nil)
	user := `"messages":[{"role":"user","content":"Hi"}]`
	fn := func(def string) string { return `{` + user + `,"tools":[{"type":"function","function":` + def + `}]}` }
	cases := []struct {
		name, body, param, inMessage string
	}{
		{"tools not an array", `{` + user + `,"tools":{"type":"function"}}`, "tools", "array"},
		{"tool type", `{` + user + `,"tools":[{"type":"retrieval"}]}`, "tools[0].type", `"retrieval"`},
		{"tool without function", `{` + user + `,"tools":[{"type":"function"}]}`, "tools[0].function", "required"},
		{"function name missing", fn(`{"description":"x"}`), "tools[0].function.name", "string"},
		{"function name with a space", fn(`{"name":"get weather"}`), "tools[0].function.name", "1-64"},
		{"function name too long", fn(`{"name":"` + strings.Repeat("a", 65) + `"}`), "tools[0].function.name", "1-64"},
		{"description not a string", fn(`{"name":"f","description":3}`), "tools[0].function.description", "string"},
		{"strict not a boolean", fn(`{"name":"f","strict":"yes"}`), "tools[0].function.strict", "boolean"},
		{"parameters not an object", fn(`{"name":"f","parameters":[1]}`), "tools[0].function.parameters", `"f"`},
		{"parameters unsupported keyword", fn(`{"name":"lookup","parameters":{"type":"object","patternProperties":{"^a":{"type":"string"}}}}`),
			"tools[0].function.parameters", "patternProperties"},
		{"parameters invalid schema", fn(`{"name":"lookup","parameters":{"type":"objekt"}}`), "tools[0].function.parameters", `"lookup"`},
		{"duplicate name", `{` + user + `,"tools":[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"f"}}]}`,
			"tools[1].function.name", "tools[0]"},
		{"tool_choice word", `{` + user + `,` + weatherTools + `,"tool_choice":"always"}`, "tool_choice", `"always"`},
		{"tool_choice type", `{` + user + `,` + weatherTools + `,"tool_choice":{"type":"tool","function":{"name":"get_time"}}}`, "tool_choice.type", `"tool"`},
		{"tool_choice without name", `{` + user + `,` + weatherTools + `,"tool_choice":{"type":"function"}}`, "tool_choice.function.name", "required"},
		{"tool_choice undeclared", `{` + user + `,` + weatherTools + `,"tool_choice":{"type":"function","function":{"name":"launch"}}}`, "tool_choice.function.name", `"launch"`},
		{"tool_choice not a string or object", `{` + user + `,` + weatherTools + `,"tool_choice":3}`, "tool_choice", "expected"},
		{"required with response_format", `{` + user + `,` + weatherTools + `,"tool_choice":"required","response_format":{"type":"json_object"}}`, "tool_choice", "response_format"},
		{"named with a grammar", `{` + user + `,` + weatherTools + `,"tool_choice":{"type":"function","function":{"name":"get_time"}},"grammar":"root ::= \"x\""}`, "tool_choice", "grammar"},
		{"required without tools", `{` + user + `,"tool_choice":"required"}`, "tool_choice", "only allowed when"},
		{"parallel_tool_calls type", `{` + user + `,` + weatherTools + `,"parallel_tool_calls":"yes"}`, "parallel_tool_calls", "boolean"},
		{"functions", `{` + user + `,"functions":[{"name":"f"}]}`, "functions", "tools"},
		{"tool message without tool_call_id", `{"messages":[{"role":"user","content":"Hi"},{"role":"tool","content":"21"}]}`, "messages[1].tool_call_id", "required"},
		{"tool_calls on a user message", `{"messages":[{"role":"user","content":"Hi","tool_calls":[]}]}`, "messages[0].tool_calls", "assistant"},
		{"tool_calls not an array", `{"messages":[{"role":"user","content":"Hi"},{"role":"assistant","tool_calls":{}}]}`, "messages[1].tool_calls", "array"},
		{"tool call without id", `{"messages":[{"role":"user","content":"Hi"},{"role":"assistant","tool_calls":[{"type":"function","function":{"name":"f","arguments":"{}"}}]}]}`,
			"messages[1].tool_calls[0].id", "required"},
		{"tool call arguments an object", `{"messages":[{"role":"user","content":"Hi"},{"role":"assistant","tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":{}}}]}]}`,
			"messages[1].tool_calls[0].function.arguments", "string"},
		{"tool call without name", `{"messages":[{"role":"user","content":"Hi"},{"role":"assistant","tool_calls":[{"id":"c1","type":"function","function":{"arguments":"{}"}}]}]}`,
			"messages[1].tool_calls[0].function.name", "required"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, b := post(t, srv.URL+"/v1/chat/completions", c.body)
			e := checkError(t, resp.StatusCode, object(t, b), http.StatusBadRequest, "invalid_request_error", c.param)
			if msg, _ := e["message"].(string); !strings.Contains(msg, c.inMessage) {
				t.Errorf("message %q does not say %q", msg, c.inMessage)
			}
		})
	}
}

// scripted is a Generator that answers every request with the given text
// pieces, one event each, as a worker streams a generation, and records the
// request it got.
type scripted struct {
	pieces []string
	got    chan *batonv1.GenerateRequest
	// finish is the last event's finish reason (unset: STOP).
	finish batonv1.FinishReason
}

func (s *scripted) Generate(_ context.Context, req *batonv1.GenerateRequest, send func(*batonv1.GenerateEvent) error) error {
	select {
	case s.got <- req:
	default:
	}
	if err := send(&batonv1.GenerateEvent{RequestId: req.GetRequestId(), PromptTokenIds: req.GetPromptTokenIds()}); err != nil {
		return err
	}
	for i, p := range s.pieces {
		ev := &batonv1.GenerateEvent{RequestId: req.GetRequestId(), TokenIds: []uint32{uint32(i + 3)}, Text: p}
		if i == len(s.pieces)-1 {
			ev.FinishReason = batonv1.FinishReason_FINISH_REASON_STOP
			if s.finish != batonv1.FinishReason_FINISH_REASON_UNSPECIFIED {
				ev.FinishReason = s.finish
			}
			ev.Usage = &batonv1.Usage{PromptTokens: uint32(len(req.GetPromptTokenIds())), CompletionTokens: uint32(len(s.pieces))}
		}
		if err := send(ev); err != nil {
			return err
		}
	}
	return nil
}

// qwenTemplate is the test template in Qwen2.5-Instruct's prompt format
// (Hermes tool calls).
func qwenTemplate(t *testing.T, eg *engineGen) *openai.ChatTemplate {
	t.Helper()
	src, err := os.ReadFile(filepath.Join("testdata", "templates", "qwen25.jinja"))
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := openai.ChatTemplateFor(eg.tok, string(src))
	if err != nil {
		t.Fatal(err)
	}
	return tmpl
}

// streamedChat is a chat stream's reply put back together.
type streamedChat struct {
	content string
	calls   []map[string]any // {id, type, function: {name, arguments}}
	finish  any
}

// reassemble concatenates a chat stream's deltas as the OpenAI SDKs do,
// checking that tool calls arrive as OpenAI streams them: the first delta
// of a call has index, id, type and name with arguments "", the next ones
// index and argument fragments only.
func reassemble(t *testing.T, events []map[string]any) streamedChat {
	t.Helper()
	var out streamedChat
	var content strings.Builder
	for _, ev := range events {
		choices := ev["choices"].([]any)
		if len(choices) == 0 {
			continue
		}
		c := choices[0].(map[string]any)
		if fr := c["finish_reason"]; fr != nil {
			out.finish = fr
		}
		d := c["delta"].(map[string]any)
		if s, ok := d["content"].(string); ok {
			content.WriteString(s)
		}
		tcs, _ := d["tool_calls"].([]any)
		for _, x := range tcs {
			tc := x.(map[string]any)
			i := int(tc["index"].(float64))
			f := tc["function"].(map[string]any)
			if i == len(out.calls) {
				if tc["id"] == nil || tc["type"] != "function" || f["name"] == nil || f["arguments"] != "" {
					t.Errorf("first delta of call %d = %v", i, tc)
				}
				out.calls = append(out.calls, map[string]any{"id": tc["id"], "type": tc["type"],
					"function": map[string]any{"name": f["name"], "arguments": ""}})
				continue
			}
			if i != len(out.calls)-1 || tc["id"] != nil || f["name"] != nil {
				t.Errorf("later delta of call %d = %v", i, tc)
				continue
			}
			fn := out.calls[i]["function"].(map[string]any)
			fn["arguments"] = fn["arguments"].(string) + f["arguments"].(string)
		}
	}
	out.content = content.String()
	return out
}

// TestToolCallsAuto: with tool_choice auto, a reply in the model's call
// syntax becomes message.tool_calls (the text before it content) with
// finish_reason tool_calls, streamed as tool_calls deltas that reassemble
// to the same calls; the prompt shows the tools, and nothing is forced.
func TestToolCallsAuto(t *testing.T) {
	eg := newEngineGen(t)
	gen := &scripted{got: make(chan *batonv1.GenerateRequest, 1), pieces: []string{
		"Let me check", ".\n<tool", "_call>\n{\"name\": \"get_weather\", ", "\"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>\n",
		"<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"CET\"}}\n</tool_call>",
	}}
	srv := apiServer(t, eg, gen, func(o *openai.Options) {
		o.Template = qwenTemplate(t, eg)
		// The scripted generator has no context window; stories260K's
		// 128 tokens cannot hold a tools prompt.
		o.Model.ContextLength = 1 << 14
	})
	body := `{` + askWeather + `,` + weatherTools + `}`
	resp, b := post(t, srv.URL+"/v1/chat/completions", body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	req := <-gen.got
	if g := req.GetSampling().GetGrammar(); g != "" {
		t.Errorf("auto forces a grammar: %s", g)
	}
	prompt := eg.tok.Decode(toInt32(req.GetPromptTokenIds()))
	if !strings.Contains(prompt, `"name": "get_weather", "description": "Current weather"`) || !strings.Contains(prompt, "<tools>") {
		t.Errorf("the prompt does not show the tools:\n%s", prompt)
	}
	var out struct {
		Choices []struct {
			Message struct {
				Content   *string `json:"content"`
				ToolCalls []struct {
					ID       string `json:"id"`
					Type     string `json:"type"`
					Function struct {
						Name      string `json:"name"`
						Arguments string `json:"arguments"`
					} `json:"function"`
				} `json:"tool_calls"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	ch := out.Choices[0]
	if ch.FinishReason != "tool_calls" || ch.Message.Content == nil || *ch.Message.Content != "Let me check." || len(ch.Message.ToolCalls) != 2 {
		t.Fatalf("reply %s", b)
	}
	want := [][2]string{{"get_weather", `{"city": "Paris", "unit": "celsius"}`}, {"get_time", `{"zone": "CET"}`}}
	for i, tc := range ch.Message.ToolCalls {
		if !strings.HasPrefix(tc.ID, "call_") || tc.Type != "function" || tc.Function.Name != want[i][0] || tc.Function.Arguments != want[i][1] {
			t.Errorf("tool_calls[%d] = %+v, want %v", i, tc, want[i])
		}
	}

	stream := strings.Replace(body, `{`, `{"stream": true, `, 1)
	resp, b = post(t, srv.URL+"/v1/chat/completions", stream)
	got := reassemble(t, sseEvents(t, resp, b))
	if got.content != "Let me check." || got.finish != "tool_calls" || len(got.calls) != 2 {
		t.Fatalf("stream reassembled to %+v\n%s", got, b)
	}
	for i, c := range got.calls {
		f := c["function"].(map[string]any)
		if f["name"] != want[i][0] || f["arguments"] != want[i][1] || !strings.HasPrefix(c["id"].(string), "call_") {
			t.Errorf("streamed call %d = %v, want %v", i, c, want[i])
		}
	}
	if strings.Contains(string(b), "<tool") {
		t.Errorf("the stream shows the call syntax as content:\n%s", b)
	}
}

// TestToolChoiceNone: with tool_choice none the tools stay out of the
// prompt and the reply is content, whatever it looks like.
func TestToolChoiceNone(t *testing.T) {
	eg := newEngineGen(t)
	text := "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>"
	gen := &scripted{got: make(chan *batonv1.GenerateRequest, 1), pieces: []string{text[:9], text[9:]}}
	srv := apiServer(t, eg, gen, func(o *openai.Options) {
		o.Template = qwenTemplate(t, eg)
		// The scripted generator has no context window; stories260K's
		// 128 tokens cannot hold a tools prompt.
		o.Model.ContextLength = 1 << 14
	})
	for _, stream := range []bool{false, true} {
		body := `{"stream": ` + map[bool]string{false: "false", true: "true"}[stream] + `,` + askWeather + `,` + weatherTools + `,"tool_choice":"none"}`
		resp, b := post(t, srv.URL+"/v1/chat/completions", body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		req := <-gen.got
		if prompt := eg.tok.Decode(toInt32(req.GetPromptTokenIds())); strings.Contains(prompt, "Current weather") {
			t.Errorf("tool_choice none shows the tools:\n%s", prompt)
		}
		if stream {
			got := reassemble(t, sseEvents(t, resp, b))
			if got.content != text || got.calls != nil || got.finish != "stop" {
				t.Errorf("stream %+v", got)
			}
			continue
		}
		m := object(t, b)["choices"].([]any)[0].(map[string]any)
		msg := m["message"].(map[string]any)
		if msg["content"] != text || msg["tool_calls"] != nil || m["finish_reason"] != "stop" {
			t.Errorf("reply %s", b)
		}
	}
}

// TestToolHistoryRendered: assistant tool_calls and tool messages in the
// request reach the template, which renders them in the family's syntax.
func TestToolHistoryRendered(t *testing.T) {
	eg := newEngineGen(t)
	gen := &scripted{got: make(chan *batonv1.GenerateRequest, 1), pieces: []string{"It is 21 degrees."}}
	srv := apiServer(t, eg, gen, func(o *openai.Options) {
		o.Template = qwenTemplate(t, eg)
		// The scripted generator has no context window; stories260K's
		// 128 tokens cannot hold a tools prompt.
		o.Model.ContextLength = 1 << 14
	})
	body := `{"messages": [{"role": "user", "content": "What is the weather in Paris?"},` +
		`{"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}}]},` +
		`{"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"}],` + weatherTools + `}`
	resp, b := post(t, srv.URL+"/v1/chat/completions", body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	prompt := eg.tok.Decode(toInt32((<-gen.got).GetPromptTokenIds()))
	for _, frag := range []string{
		"<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call><|im_end|>",
		"<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response><|im_end|>",
	} {
		if !strings.Contains(prompt, frag) {
			t.Errorf("the prompt lacks %q:\n%s", frag, prompt)
		}
	}
	m := object(t, b)["choices"].([]any)[0].(map[string]any)
	if msg := m["message"].(map[string]any); msg["content"] != "It is 21 degrees." || m["finish_reason"] != "stop" {
		t.Errorf("reply %s", b)
	}
}

func toInt32(ids []uint32) []int32 {
	out := make([]int32, len(ids))
	for i, id := range ids {
		out[i] = int32(id)
	}
	return out
}

// validator compiles a JSON Schema with a standard validator.
func validator(t *testing.T, schema string) *santhosh.Schema {
	t.Helper()
	doc, err := santhosh.UnmarshalJSON(strings.NewReader(schema))
	if err != nil {
		t.Fatal(err)
	}
	c := santhosh.NewCompiler()
	if err := c.AddResource("params.json", doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile("params.json")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestToolChoiceRequiredEngine: with the real stories260K engine, which
// knows nothing of tools, tool_choice "required" (and a named function)
// makes the constrained decoder produce a call: the reply is tool_calls
// whose arguments parse and validate against the tool's schema, and the
// stream's deltas reassemble to the same call. (With parallel_tool_calls
// true the grammar lets the model decide how many calls to make, and this
// toy model goes on calling to max_tokens; TestForcingGrammar covers
// several calls.)
func TestToolChoiceRequiredEngine(t *testing.T) {
	// The plain default template: the tools reach the model through the
	// generic preamble, in a 512-token window as the e2e clusters run it.
	eg := newEngineGenCtx(t, 512)
	srv := apiServer(t, eg, nil, nil)
	schemas := map[string]*santhosh.Schema{"get_weather": validator(t, weatherParams), "get_time": validator(t, timeParams)}
	// The tool the SDK acceptance test (tests/sdk/tools.test.mjs) declares.
	sdkParams := `{"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city", "unit"], "additionalProperties": false}`
	schemas["sdk_weather"] = validator(t, sdkParams)
	sdkTools := `"tools": [{"type": "function", "function": {"name": "sdk_weather", "description": "The weather in a city", "parameters": ` + sdkParams + `, "strict": true}}]`
	for _, c := range []struct {
		name, tools, choice, want string
		maxTokens                 int
		parallel                  bool
	}{
		{"required", weatherTools, `"required"`, "", 80, false},
		{"named", weatherTools, `{"type": "function", "function": {"name": "get_time"}}`, "get_time", 80, false},
		{"as the SDK test asks", sdkTools, `"required"`, "sdk_weather", 160, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			body := `{"temperature": 0, "max_tokens": ` + strconv.Itoa(c.maxTokens) + `, ` + askWeather + `,` + c.tools + `,"tool_choice": ` + c.choice
			if !c.parallel {
				body += `,"parallel_tool_calls": false`
			}
			body += `}`
			resp, b := post(t, srv.URL+"/v1/chat/completions", body)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%d %s", resp.StatusCode, b)
			}
			choice := object(t, b)["choices"].([]any)[0].(map[string]any)
			msg := choice["message"].(map[string]any)
			calls, _ := msg["tool_calls"].([]any)
			if choice["finish_reason"] != "tool_calls" || msg["content"] != nil || len(calls) == 0 || (!c.parallel && len(calls) != 1) {
				t.Fatalf("reply %s", b)
			}
			for _, x := range calls {
				call := x.(map[string]any)
				f := call["function"].(map[string]any)
				name, _ := f["name"].(string)
				if c.want != "" && name != c.want {
					t.Errorf("called %q, want %q", name, c.want)
				}
				sch := schemas[name]
				if sch == nil || !strings.HasPrefix(call["id"].(string), "call_") {
					t.Fatalf("call %v", call)
				}
				args, err := santhosh.UnmarshalJSON(strings.NewReader(f["arguments"].(string)))
				if err != nil {
					t.Fatalf("arguments %q: %v", f["arguments"], err)
				}
				if err := sch.Validate(args); err != nil {
					t.Errorf("arguments %q do not match the schema: %v", f["arguments"], err)
				}
			}

			resp, sb := post(t, srv.URL+"/v1/chat/completions", strings.Replace(body, `{`, `{"stream": true, `, 1))
			got := reassemble(t, sseEvents(t, resp, sb))
			if got.finish != "tool_calls" || got.content != "" || len(got.calls) != len(calls) {
				t.Fatalf("stream reassembled to %+v\n%s", got, sb)
			}
			for i, sc := range got.calls {
				want := calls[i].(map[string]any)["function"].(map[string]any)
				if f := sc["function"].(map[string]any); f["name"] != want["name"] || f["arguments"] != want["arguments"] {
					t.Errorf("streamed call %d %v, want %v", i, f, want)
				}
			}
		})
	}
}
