package openai_test

import (
	"strings"
	"testing"

	"github.com/baton-serving/baton/engine/jsonschema"
)

// TestStructuredOutputSent: response_format json_object and json_schema,
// and the grammar field, reach the workers as SamplingParams.grammar (GBNF,
// compiled at the router).
func TestStructuredOutputSent(t *testing.T) {
	eg := newEngineGen(t)
	cap := &capture{eg: eg}
	srv := apiServer(t, eg, cap, nil)
	run := func(path, body string) string {
		t.Helper()
		resp, b := post(t, srv.URL+path, body)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", body, resp.StatusCode, b)
		}
		return cap.request().GetSampling().GetGrammar()
	}
	schema := `{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"}},"required":["name","age"],"additionalProperties":false}`
	want, err := jsonschema.ToGrammar([]byte(schema))
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{chatPath, cmplPath} {
		prompt := `"prompt":"x"`
		if path == chatPath {
			prompt = userMsg
		}
		if g := run(path, `{`+prompt+`,"max_tokens":2,"response_format":{"type":"json_object"}}`); g != jsonschema.AnyObject {
			t.Errorf("%s json_object: grammar %q", path, g)
		}
		if g := run(path, `{`+prompt+`,"max_tokens":2,"response_format":{"type":"json_schema","json_schema":{"name":"person","description":"d","strict":true,"schema":`+schema+`}}}`); g != want {
			t.Errorf("%s json_schema: grammar %q, want %q", path, g, want)
		}
		const gbnf = `root ::= "yes" | "no"`
		if g := run(path, `{`+prompt+`,"max_tokens":2,"grammar":`+mustJSON(gbnf)+`}`); g != gbnf {
			t.Errorf("%s grammar: %q", path, g)
		}
		if g := run(path, `{`+prompt+`,"max_tokens":2,"grammar":`+mustJSON(gbnf)+`,"response_format":{"type":"text"}}`); g != gbnf {
			t.Errorf("%s grammar with text: %q", path, g)
		}
	}
	// A json_schema without a schema is any JSON object (not any JSON
	// value, which the schema {} allows).
	anyObj := jsonschema.AnyObject
	if g := run(chatPath, `{`+userMsg+`,"max_tokens":2,"response_format":{"type":"json_schema","json_schema":{"name":"x"}}}`); g != anyObj {
		t.Errorf("no schema: %q", g)
	}
}

// TestStructuredOutputRefused: a schema Baton cannot compile names the
// keyword; a bad grammar names grammar; both constraints at once are
// refused.
func TestStructuredOutputRefused(t *testing.T) {
	eg := newEngineGen(t)
	srv := apiServer(t, eg, nil, nil)
	for _, c := range []struct {
		name, path, body, param, want string
	}{
		{"unsupported keyword", chatPath, `{` + userMsg + `,"response_format":{"type":"json_schema","json_schema":{"name":"a","schema":{"type":"object","properties":{"a":{"type":"object","patternProperties":{"^x":{"type":"string"}}}}}}}}`,
			"response_format.json_schema.schema", "patternProperties"},
		{"unsupported keyword's path", cmplPath, `{"prompt":"x","response_format":{"type":"json_schema","json_schema":{"name":"a","schema":{"type":"object","properties":{"a":{"type":"object","patternProperties":{"^x":{"type":"string"}}}}}}}}`,
			"response_format.json_schema.schema", "#/properties/a"},
		{"bad grammar", cmplPath, `{"prompt":"x","grammar":"root ::= ("}`, "grammar", "grammar"},
		{"grammar without root", chatPath, `{` + userMsg + `,"grammar":"a ::= \"x\""}`, "grammar", "grammar"},
		{"grammar and json_object", cmplPath, `{"prompt":"x","grammar":"root ::= \"x\"","response_format":{"type":"json_object"}}`, "grammar", "response_format"},
		{"grammar and json_schema", chatPath, `{` + userMsg + `,"grammar":"root ::= \"x\"","response_format":{"type":"json_schema","json_schema":{"name":"a","schema":{}}}}`, "grammar", "response_format"},
	} {
		t.Run(c.name, func(t *testing.T) {
			resp, b := post(t, srv.URL+c.path, c.body)
			obj := checkError(t, resp.StatusCode, object(t, b), 400, "invalid_request_error", c.param)
			if msg, _ := obj["message"].(string); !strings.Contains(msg, c.want) {
				t.Errorf("message %q does not name %s", msg, c.want)
			}
		})
	}
	if n := eg.inFlight(); n != 0 {
		t.Errorf("%d requests still in flight", n)
	}
}
