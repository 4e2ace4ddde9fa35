package openai

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestPathAt(t *testing.T) {
	cases := []struct {
		body string
		at   string // the offset is that of the first occurrence of at
		plus int
		want string
	}{
		{`{"model":"x","prompt":"abc"}`, `abc`, 1, "prompt"},
		{`{"messages":[{"role":"user"},{"role":"bad"}]}`, `bad`, 0, "messages[1].role"},
		{`{"messages":[{"role":"user"},{"content":[{"type":"text","text":"zz"}]}]}`, `zz`, 1, "messages[1].content[0].text"},
		{`{"a":{"b":[1,[2,3]]}}`, `3`, 1, "a.b[1][1]"},
		{`{"stream_options":{"include_usage":"y"}}`, `"y"`, 3, "stream_options.include_usage"},
		{`{"x":1}`, `{`, 0, ""},
		{`{"x":1}`, `1`, 1, "x"},
		{` [ 1 ]`, `[`, 1, ""},
	}
	for _, c := range cases {
		off := int64(strings.Index(c.body, c.at) + c.plus)
		if got := pathAt([]byte(c.body), off); got != c.want {
			t.Errorf("pathAt(%s, %d) = %q, want %q", c.body, off, got, c.want)
		}
	}
}

func TestDecodeJSONNamesTheField(t *testing.T) {
	cases := []struct{ body, param string }{
		{`{"temperature":"x"}`, "temperature"},
		{`{"messages":[{"role":"user","content":"a"},{"role":true}]}`, "messages[1].role"},
		{`{"messages":{"role":"user"}}`, "messages"},
		{`{"stream_options":{"include_usage":1}}`, "stream_options.include_usage"},
		{`{"stream_options":[]}`, "stream_options"},
		{`{"n":"1"}`, "n"},
		{`{"seed":1e30}`, "seed"},
		{"{\"model\":\"a\x80\"}", "model"},
		{"{\"messages\":[{\"role\":\"user\",\"name\":\"\xff\"}]}", "messages[0].name"},
		{`[]`, ""},
		{`{`, ""},
	}
	for _, c := range cases {
		var in chatRequest
		herr := decodeJSON([]byte(c.body), &in)
		if herr == nil {
			t.Errorf("%s: decoded", c.body)
			continue
		}
		if herr.status != http.StatusBadRequest || herr.param != c.param {
			t.Errorf("%s: %d param %q (%s), want 400 %q", c.body, herr.status, herr.param, herr.message, c.param)
		}
	}
}

func TestFromStatus(t *testing.T) {
	cases := []struct {
		code              codes.Code
		msg, prompt       string
		status            int
		typ, param, code2 string
	}{
		{codes.InvalidArgument, "sampling.top_p = 0: want a value in (0, 1]", "prompt", 400, typeInvalidRequest, "top_p", ""},
		{codes.InvalidArgument, "prompt: 200 tokens; the context window is 128", "messages", 400, typeInvalidRequest, "messages", ""},
		{codes.InvalidArgument, "sampling.stop[3] = 300 bytes: want 1-256 bytes", "prompt", 400, typeInvalidRequest, "stop", ""},
		{codes.InvalidArgument, "sampling: temperature is bad", "prompt", 400, typeInvalidRequest, "", ""},
		{codes.NotFound, `model "m" is not served here`, "prompt", 404, typeInvalidRequest, "model", "model_not_found"},
		{codes.NotFound, `request_id "r": no such in-flight request`, "prompt", 404, typeInvalidRequest, "X-Request-Id", "not_found"},
		{codes.ResourceExhausted, "KV cache full", "prompt", 429, typeRateLimit, "", "rate_limit_exceeded"},
		{codes.Code(99), "?", "prompt", 500, typeServer, "", ""},
	}
	for _, c := range cases {
		e := fromStatus(status.Error(c.code, c.msg), c.prompt)
		if e.status != c.status || e.typ != c.typ || e.param != c.param || e.code != c.code2 || e.message != c.msg {
			t.Errorf("%v %q: %+v", c.code, c.msg, e)
		}
	}
	for code := range codes.Code(17) {
		if code == codes.OK {
			continue
		}
		if _, ok := codeTable[code]; !ok {
			t.Errorf("%v is not in the code table", code)
		}
	}
}

func TestLoadKeys(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	k, err := LoadKeys(write("keys", "# team a\nsk-alpha\n\n  sk-beta  \r\n"))
	if err != nil {
		t.Fatal(err)
	}
	if k.Len() != 2 || !k.Authorized("Bearer sk-alpha") || !k.Authorized("Bearer sk-beta") || k.Authorized("Bearer # team a") {
		t.Errorf("keys = %v", k)
	}
	if s := k.String(); strings.Contains(s, "sk-") {
		t.Errorf("String() = %q shows a key", s)
	}
	for name, content := range map[string]string{"empty": "\n# nothing\n", "spaces": "sk-a sk-b\n"} {
		_, err := LoadKeys(write(name, content))
		if err == nil {
			t.Errorf("%s: loaded", name)
		} else if strings.Contains(err.Error(), "sk-") {
			t.Errorf("%s: error %q quotes a key", name, err)
		}
	}
	if _, err := LoadKeys(filepath.Join(dir, "absent")); err == nil {
		t.Error("absent file loaded")
	}
	var none *Keys
	if !none.Authorized("") || none.Len() != 0 {
		t.Error("nil Keys must authorize everything")
	}
}

// FuzzDecodeChat feeds arbitrary bodies through decoding and validation:
// nothing may panic, and every refusal must be a 4xx.
func FuzzDecodeChat(f *testing.F) {
	for _, s := range []string{
		`{"messages":[{"role":"user","content":"hi"}],"temperature":0.5,"stop":["a"]}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"a"}]}],"max_tokens":3}`,
		`{"prompt":[1,2,3],"logprobs":2}`, `{"prompt":["x"]}`, `{"prompt":[[1,2]]}`,
		"{\"messages\":[{\"role\":\"\xff\"}]}", `{"a":[[[{"b":1}]]]}`, `[`, `"x"`, `{"n":1e400}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var in chatRequest
		if herr := decodeJSON(body, &in); herr != nil {
			if herr.status != http.StatusBadRequest {
				t.Fatalf("status %d", herr.status)
			}
			return
		}
		if _, herr := parseMessages(in.Messages); herr != nil && herr.status != http.StatusBadRequest {
			t.Fatalf("status %d", herr.status)
		}
		if _, herr := parseStop(in.Stop); herr != nil && herr.status != http.StatusBadRequest {
			t.Fatalf("status %d", herr.status)
		}
	})
}
