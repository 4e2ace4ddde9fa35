package openai_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/baton-serving/baton/router-svc/internal/openai"
)

// TestChatTemplateFailureStatus: at a request, the template's own refusal
// of the conversation (raise_exception) is the client's 400 naming
// messages, with the template's message; a failure of the engine to
// evaluate the template (here an unknown filter on a path the load's
// self-check does not take) is the server's 500, not the client's fault.
func TestChatTemplateFailureStatus(t *testing.T) {
	eg := newEngineGen(t)
	const src = `{% for m in messages %}{% if m.content == 'raise' %}{{ raise_exception('no raising here') }}` +
		`{% elif m.content == 'boom' %}{{ m.content | frobnicate }}{% else %}{{ m.content }}{% endif %}{% endfor %}`
	tmpl, err := openai.ChatTemplateFor(eg.tok, src)
	if err != nil {
		t.Fatal(err)
	}
	srv := apiServer(t, eg, nil, func(o *openai.Options) { o.Template = tmpl })
	resp, b := post(t, srv.URL+"/v1/chat/completions", `{"max_tokens":1,"messages":[{"role":"user","content":"raise"}]}`)
	e := checkError(t, resp.StatusCode, object(t, b), http.StatusBadRequest, "invalid_request_error", "messages")
	if !strings.Contains(e["message"].(string), "no raising here") {
		t.Errorf("message = %v", e["message"])
	}
	resp, b = post(t, srv.URL+"/v1/chat/completions", `{"max_tokens":1,"messages":[{"role":"user","content":"boom"}]}`)
	e = checkError(t, resp.StatusCode, object(t, b), http.StatusInternalServerError, "server_error", nil)
	if !strings.Contains(e["message"].(string), "frobnicate") {
		t.Errorf("message = %v", e["message"])
	}
	resp, b = post(t, srv.URL+"/v1/chat/completions", `{"max_tokens":1,"messages":[{"role":"user","content":"Once upon a time"}]}`)
	if resp.StatusCode != http.StatusOK {
		t.Errorf("a plain request: %d %s", resp.StatusCode, b)
	}
}
