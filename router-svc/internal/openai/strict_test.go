package openai_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/router-svc/internal/openai"
	"google.golang.org/protobuf/proto"
)

const (
	cmplPath = "/v1/completions"
	chatPath = "/v1/chat/completions"
	userMsg  = `"messages":[{"role":"user","content":"Once upon a time"}]`
)

// TestUnknownFields: a field Baton does not know is refused with OpenAI's
// message, naming it, at the top level and inside the objects Baton reads;
// the fields clients commonly send are accepted.
func TestUnknownFields(t *testing.T) {
	eg := newEngineGen(t)
	srv := apiServer(t, eg, nil, nil)
	for _, c := range []struct {
		name, path, body, param string
	}{
		{"typo", cmplPath, `{"prompt":"x","max_token":4}`, "max_token"},
		{"typo chat", chatPath, `{` + userMsg + `,"max_token":4}`, "max_token"},
		{"vLLM guided_json", chatPath, `{` + userMsg + `,"guided_json":{"type":"object"}}`, "guided_json"},
		{"first of two, in body order", cmplPath, `{"zeta":1,"prompt":"x","alpha":2}`, "zeta"},
		{"chat-only field on completions", cmplPath, `{"prompt":"x","messages":[]}`, "messages"},
		{"completions-only field on chat", chatPath, `{` + userMsg + `,"echo":true}`, "echo"},
		{"stream_options", cmplPath, `{"prompt":"x","stream":true,"stream_options":{"include_usage":true,"continuous":true}}`, "stream_options.continuous"},
		{"response_format", chatPath, `{` + userMsg + `,"response_format":{"type":"text","strict":true}}`, "response_format.strict"},
		{"response_format.json_schema", cmplPath, `{"prompt":"x","response_format":{"type":"json_schema","json_schema":{"name":"a","schema":{},"additionalProperties":false}}}`, "response_format.json_schema.additionalProperties"},
		{"a message", chatPath, `{"messages":[{"role":"user","content":"x"},{"role":"user","content":"y","weight":1}]}`, "messages[1].weight"},
	} {
		t.Run(c.name, func(t *testing.T) {
			resp, b := post(t, srv.URL+c.path, c.body)
			obj := checkError(t, resp.StatusCode, object(t, b), 400, "invalid_request_error", c.param)
			if want := "Unrecognized request argument supplied: " + c.param; obj["message"] != want {
				t.Errorf("message = %q, want %q", obj["message"], want)
			}
			if obj["code"] != nil {
				t.Errorf("code = %v, want null", obj["code"])
			}
		})
	}
	// What clients commonly send, and assistant messages as the SDKs
	// return them (refusal, annotations, tool_calls and audio null).
	for _, c := range []struct{ name, path, body string }{
		{"user", cmplPath, `{"prompt":"x","max_tokens":2,"user":"u-1"}`},
		{"chat extras", chatPath, `{` + userMsg + `,"max_tokens":2,"user":"u","metadata":{"k":"v"},"store":false,"service_tier":"auto","modalities":["text"],"logprobs":false}`},
		{"returned assistant message", chatPath, `{"max_tokens":2,"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b","refusal":null,"annotations":[],"tool_calls":null,"audio":null,"function_call":null},{"role":"user","content":"c","name":"n"}]}`},
		{"response_format text", cmplPath, `{"prompt":"x","max_tokens":2,"response_format":{"type":"text"}}`},
		{"nulls", cmplPath, `{"prompt":"x","max_tokens":2,"logit_bias":null,"suffix":null,"echo":false,"stream_options":null}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			if resp, b := post(t, srv.URL+c.path, c.body); resp.StatusCode != 200 {
				t.Errorf("%d %s", resp.StatusCode, b)
			}
		})
	}
	if n := eg.inFlight(); n != 0 {
		t.Errorf("%d requests still in flight", n)
	}
}

// TestLenient: with Options.Lenient (--openai-lenient) unknown fields are
// ignored, top level and nested, and the request runs.
func TestLenient(t *testing.T) {
	eg := newEngineGen(t)
	srv := apiServer(t, eg, nil, func(o *openai.Options) { o.Lenient = true })
	for _, c := range []struct{ path, body string }{
		{cmplPath, `{"prompt":"x","max_tokens":2,"max_token":4,"guided_json":{}}`},
		{chatPath, `{"messages":[{"role":"user","content":"x","weight":1}],"max_tokens":2,"stream":true,"stream_options":{"include_usage":true,"x":1}}`},
	} {
		if resp, b := post(t, srv.URL+c.path, c.body); resp.StatusCode != 200 {
			t.Errorf("%s: %d %s", c.body, resp.StatusCode, b)
		}
	}
	// Known fields are still checked.
	resp, b := post(t, srv.URL+cmplPath, `{"prompt":"x","max_token":4,"temperature":9}`)
	checkError(t, resp.StatusCode, object(t, b), 400, "invalid_request_error", "temperature")
}

// TestNewFieldsRefused: every wrong type and value of the fields issue 20
// adds is a 400 naming the field.
func TestNewFieldsRefused(t *testing.T) {
	eg := newEngineGen(t)
	srv := apiServer(t, eg, nil, nil)
	cases := []struct {
		name, path, body string
		param            any
	}{
		{"logit_bias not an object", cmplPath, `{"prompt":"x","logit_bias":[1]}`, "logit_bias"},
		{"logit_bias value a string", chatPath, `{` + userMsg + `,"logit_bias":{"5":"up"}}`, "logit_bias"},
		{"logit_bias above 100", cmplPath, `{"prompt":"x","logit_bias":{"5":100.5}}`, "logit_bias"},
		{"logit_bias below -100", chatPath, `{` + userMsg + `,"logit_bias":{"5":-101}}`, "logit_bias"},
		{"logit_bias id beyond vocabulary", cmplPath, `{"prompt":"x","logit_bias":{"512":1}}`, "logit_bias"},
		{"logit_bias key not an id", cmplPath, `{"prompt":"x","logit_bias":{"hello":1}}`, "logit_bias"},
		{"logit_bias negative id", cmplPath, `{"prompt":"x","logit_bias":{"-1":1}}`, "logit_bias"},
		{"logit_bias too many", cmplPath, `{"prompt":"x","logit_bias":` + manyBiases(1025) + `}`, "logit_bias"},
		{"suffix", cmplPath, `{"prompt":"x","suffix":"end"}`, "suffix"},
		{"suffix wrong type", cmplPath, `{"prompt":"x","suffix":5}`, "suffix"},
		{"echo wrong type", cmplPath, `{"prompt":"x","echo":"yes"}`, "echo"},
		{"max_tokens 0 without echo", cmplPath, `{"prompt":"x","max_tokens":0}`, "max_tokens"},
		{"max_tokens 0 chat", chatPath, `{` + userMsg + `,"max_tokens":0}`, "max_tokens"},
		{"best_of with echo", cmplPath, `{"prompt":"x","echo":true,"best_of":2}`, "best_of"},
		{"response_format wrong type", chatPath, `{` + userMsg + `,"response_format":"json"}`, "response_format"},
		{"response_format unknown type", cmplPath, `{"prompt":"x","response_format":{"type":"xml"}}`, "response_format.type"},
		{"response_format type missing", chatPath, `{` + userMsg + `,"response_format":{}}`, "response_format.type"},
		{"json_schema missing", chatPath, `{` + userMsg + `,"response_format":{"type":"json_schema"}}`, "response_format.json_schema"},
		{"json_schema with type text", chatPath, `{` + userMsg + `,"response_format":{"type":"text","json_schema":{"name":"a"}}}`, "response_format.json_schema"},
		{"json_schema name missing", cmplPath, `{"prompt":"x","response_format":{"type":"json_schema","json_schema":{"schema":{}}}}`, "response_format.json_schema.name"},
		{"json_schema name invalid", chatPath, `{` + userMsg + `,"response_format":{"type":"json_schema","json_schema":{"name":"a b","schema":{}}}}`, "response_format.json_schema.name"},
		{"json_schema name too long", chatPath, `{` + userMsg + `,"response_format":{"type":"json_schema","json_schema":{"name":"` + strings.Repeat("a", 65) + `","schema":{}}}}`, "response_format.json_schema.name"},
		{"json_schema schema not an object", chatPath, `{` + userMsg + `,"response_format":{"type":"json_schema","json_schema":{"name":"a","schema":"{}"}}}`, "response_format.json_schema.schema"},
		{"json_schema strict wrong type", chatPath, `{` + userMsg + `,"response_format":{"type":"json_schema","json_schema":{"name":"a","schema":{},"strict":"yes"}}}`, "response_format.json_schema.strict"},
		{"grammar wrong type", cmplPath, `{"prompt":"x","grammar":{"root":"a"}}`, "grammar"},
		{"grammar empty", cmplPath, `{"prompt":"x","grammar":""}`, "grammar"},
		{"store true", chatPath, `{` + userMsg + `,"store":true}`, "store"},
		{"service_tier flex", chatPath, `{` + userMsg + `,"service_tier":"flex"}`, "service_tier"},
		{"modalities audio", chatPath, `{` + userMsg + `,"modalities":["text","audio"]}`, "modalities"},
		{"audio", chatPath, `{` + userMsg + `,"audio":{"voice":"alloy","format":"mp3"}}`, "audio"},
		{"metadata wrong type", chatPath, `{` + userMsg + `,"metadata":{"k":5}}`, "metadata"},
		{"metadata too many", chatPath, `{` + userMsg + `,"metadata":` + manyMetadata(17) + `}`, "metadata"},
		{"function_call", chatPath, `{` + userMsg + `,"function_call":{"name":"f"}}`, "function_call"},
		{"message audio", chatPath, `{"messages":[{"role":"user","content":"a"},{"role":"assistant","audio":{"id":"x"}}]}`, "messages[1].audio"},
		{"message function_call", chatPath, `{"messages":[{"role":"user","content":"a"},{"role":"assistant","function_call":{"name":"f","arguments":"{}"}}]}`, "messages[1].function_call"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, b := post(t, srv.URL+c.path, c.body)
			param, _ := c.param.(string)
			obj := checkError(t, resp.StatusCode, object(t, b), 400, "invalid_request_error", c.param)
			if msg, _ := obj["message"].(string); strings.HasPrefix(msg, "Unrecognized") || !strings.Contains(msg, strings.SplitN(param, ".", 2)[0]) {
				t.Errorf("message %q does not name %s", msg, param)
			}
		})
	}
	if n := eg.inFlight(); n != 0 {
		t.Errorf("%d requests still in flight", n)
	}
}

func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }

// manyBiases is a logit_bias object with n distinct keys (ids below 512
// written with leading zeros to tell them apart as keys).
func manyBiases(n int) string {
	var b strings.Builder
	b.WriteString("{")
	for i := range n {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString(`"` + strings.Repeat("0", i/512) + itoa(i%512) + `":1`)
	}
	b.WriteString("}")
	return b.String()
}

func manyMetadata(n int) string {
	m := map[string]string{}
	for i := range n {
		m["k"+itoa(i)] = "v"
	}
	return mustJSON(m)
}

// capture is a Generator that records the requests it is given and runs
// them on the engine.
type capture struct {
	eg   *engineGen
	mu   sync.Mutex
	last *batonv1.GenerateRequest
}

func (c *capture) Generate(ctx context.Context, req *batonv1.GenerateRequest, send func(*batonv1.GenerateEvent) error) error {
	c.mu.Lock()
	c.last = proto.Clone(req).(*batonv1.GenerateRequest)
	c.mu.Unlock()
	return c.eg.Generate(ctx, req, send)
}

func (c *capture) request() *batonv1.GenerateRequest {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last
}

// TestNewFieldsSent: the new fields reach the workers' SamplingParams.
func TestNewFieldsSent(t *testing.T) {
	eg := newEngineGen(t)
	cap := &capture{eg: eg}
	srv := apiServer(t, eg, cap, nil)
	run := func(path, body string) *batonv1.GenerateRequest {
		t.Helper()
		resp, b := post(t, srv.URL+path, body)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", body, resp.StatusCode, b)
		}
		return cap.request()
	}

	req := run(cmplPath, `{"prompt":"x","max_tokens":2,"logit_bias":{"5":-100,"0007":2.5,"511":100}}`)
	if got, want := req.GetSampling().GetLogitBias(), map[uint32]float32{5: -100, 7: 2.5, 511: 100}; !mapsEqual(got, want) {
		t.Errorf("logit_bias = %v, want %v", got, want)
	}
	req = run(chatPath, `{`+userMsg+`,"max_tokens":2,"logit_bias":{"3":1}}`)
	if got := req.GetSampling().GetLogitBias(); !mapsEqual(got, map[uint32]float32{3: 1}) {
		t.Errorf("chat logit_bias = %v", got)
	}

	// echo: the prompt's logprobs are asked for when logprobs are.
	req = run(cmplPath, `{"prompt":"Once upon","max_tokens":2,"echo":true}`)
	if sp := req.GetSampling(); sp.GetPromptLogprobs() || sp.GetMaxNewTokens() != 2 {
		t.Errorf("echo without logprobs: %v", sp)
	}
	req = run(cmplPath, `{"prompt":"Once upon","max_tokens":2,"echo":true,"logprobs":2}`)
	if sp := req.GetSampling(); !sp.GetPromptLogprobs() || !sp.GetLogprobs() || sp.GetTopLogprobs() != 2 {
		t.Errorf("echo with logprobs: %v", sp)
	}
	// max_tokens 0 with echo: one token is generated (and dropped).
	req = run(cmplPath, `{"prompt":"Once upon","max_tokens":0,"echo":true,"logprobs":0}`)
	if sp := req.GetSampling(); !sp.GetPromptLogprobs() || sp.GetMaxNewTokens() != 1 {
		t.Errorf("echo with max_tokens 0: %v", sp)
	}
	// Without response_format or grammar nothing constrains the output.
	req = run(cmplPath, `{"prompt":"x","max_tokens":2,"response_format":{"type":"text"}}`)
	if sp := req.GetSampling(); sp.GetGrammar() != "" || sp.GetJsonSchema() != "" {
		t.Errorf("text: grammar %q json_schema %q", sp.GetGrammar(), sp.GetJsonSchema())
	}
}

func mapsEqual(a, b map[uint32]float32) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestRouterStrictFields: through the real router, unknown fields are
// refused unless --openai-lenient, and the native API's new sampling fields
// are checked by the router (the REST gateway names the wire field).
func TestRouterStrictFields(t *testing.T) {
	auth := []string{"Authorization", "Bearer " + testKey}
	body := `{"prompt":"x","max_tokens":2,"max_token":4}`
	strict := startRouter(t)
	resp, b := post(t, strict.http+cmplPath, body, auth...)
	checkError(t, resp.StatusCode, object(t, b), 400, "invalid_request_error", "max_token")
	for _, c := range []struct{ body, param string }{
		{`{"prompt":"x","sampling":{"logit_bias":{"512":1}}}`, "sampling.logit_bias"},
		{`{"prompt":"x","sampling":{"logit_bias":{"5":101}}}`, "sampling.logit_bias"},
		{`{"prompt":"x","sampling":{"grammar":"root ::= ("}}`, "sampling.grammar"},
		{`{"prompt":"x","sampling":{"json_schema":"{\"type\":\"object\",\"patternProperties\":{}}"}}`, "sampling.json_schema"},
	} {
		resp, b := post(t, strict.http+"/v1/generate", c.body, auth...)
		checkError(t, resp.StatusCode, object(t, b), 400, "invalid_request_error", c.param)
	}
	resp, b = post(t, strict.http+"/v1/generate", `{"prompt":"x","sampling":{"max_new_tokens":2,"logit_bias":{"5":-100}}}`, auth...)
	if resp.StatusCode != 200 {
		t.Errorf("native logit_bias: %d %s", resp.StatusCode, b)
	}
	// Structured output passes the router's own checks of the grammar.
	for _, body := range []string{
		`{"prompt":"x","max_tokens":2,"response_format":{"type":"json_object"}}`,
		`{"prompt":"x","max_tokens":2,"response_format":{"type":"json_schema","json_schema":{"name":"a","schema":{"type":"object","properties":{"a":{"type":"boolean"}},"required":["a"],"additionalProperties":false}}}}`,
		`{"prompt":"x","max_tokens":2,"grammar":"root ::= \"a\"+"}`,
	} {
		if resp, b := post(t, strict.http+cmplPath, body, auth...); resp.StatusCode != 200 {
			t.Errorf("%s: %d %s", body, resp.StatusCode, b)
		}
	}
	strict.idle(t)

	lenient := startRouter(t, "--openai-lenient")
	if resp, b := post(t, lenient.http+cmplPath, body, auth...); resp.StatusCode != 200 {
		t.Errorf("--openai-lenient: %d %s", resp.StatusCode, b)
	}
	lenient.idle(t)
}
