package openai_test

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/router-svc/internal/openai"
)

// chat_template_kwargs: the request's extra template variables (as vLLM and
// llama-server accept them), checked like every other field and handed to
// the template through ChatTemplate.RenderVars.

const qwen3NoThink = "<|im_start|>assistant\n<think>\n\n</think>\n\n"

// qwen3Template is Baton's Qwen3 test template (testdata/templates), with
// the test model's tokenizer.
func qwen3Template(t *testing.T, eg *engineGen) *openai.ChatTemplate {
	t.Helper()
	src, err := os.ReadFile(filepath.Join("testdata", "templates", "qwen3.jinja"))
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := openai.ChatTemplateFor(eg.tok, string(src))
	if err != nil {
		t.Fatal(err)
	}
	return tmpl
}

// qwen3Golden is jinja2's rendering of the real Qwen3 template of corpus
// case name ("multi-turn/gen+nothink"), from golden/qwen3.json.
func qwen3Golden(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "templates", "golden", "qwen3.json"))
	if err != nil {
		t.Fatal(err)
	}
	var g map[string]struct {
		Text *string `json:"text"`
	}
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	if g[name].Text == nil {
		t.Fatalf("golden/qwen3.json has no text for %s", name)
	}
	return *g[name].Text
}

// corpusMessages is the messages array of corpus conversation name, as an
// OpenAI request carries it (conversations without tools only).
func corpusMessages(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "templates", "corpus.json"))
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Conversations []struct {
			Name     string `json:"name"`
			Messages []struct {
				Role    string `json:"role"`
				Content string `json:"content"`
			} `json:"messages"`
		} `json:"conversations"`
	}
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	for _, conv := range c.Conversations {
		if conv.Name == name {
			return mustJSON(conv.Messages)
		}
	}
	t.Fatalf("no corpus conversation %q", name)
	return ""
}

// TestChatTemplateKwargs: through the HTTP handler, chat_template_kwargs
// {"enable_thinking": false} makes Qwen3's template close an empty think
// block after the generation prompt; true, an empty object or no field at
// all leave it open. Each prompt the worker gets is jinja2's rendering of
// the real Qwen3 template (the golden files), byte for byte, and the same
// holds with --openai-lenient (the field is known, so it is not dropped).
func TestChatTemplateKwargs(t *testing.T) {
	eg := newEngineGen(t)
	for _, lenient := range []bool{false, true} {
		gen := &scripted{got: make(chan *batonv1.GenerateRequest, 1), pieces: []string{"4"}}
		srv := apiServer(t, eg, gen, func(o *openai.Options) {
			o.Template = qwen3Template(t, eg)
			o.Model.ContextLength = 1 << 14
			o.Lenient = lenient
		})
		for _, conv := range []string{"system-user", "multi-turn", "thinking-history"} {
			for _, c := range []struct {
				kwargs, variant string
				noThink         bool
			}{
				{`,"chat_template_kwargs":{"enable_thinking":false}`, "gen+nothink", true},
				{`,"chat_template_kwargs":{"enable_thinking":true}`, "gen+think", false},
				{`,"chat_template_kwargs":{"enable_thinking":false,"documents_style":"short","n":[1,{"a":null}]}`, "gen+nothink", true},
				{`,"chat_template_kwargs":{}`, "gen", false},
				{`,"chat_template_kwargs":null`, "gen", false},
				{``, "gen", false},
			} {
				name := conv + "/" + c.variant
				t.Run(map[bool]string{false: "strict", true: "lenient"}[lenient]+"/"+name+c.kwargs, func(t *testing.T) {
					body := `{"max_tokens":1,"messages":` + corpusMessages(t, conv) + c.kwargs + `}`
					resp, b := post(t, srv.URL+chatPath, body)
					if resp.StatusCode != http.StatusOK {
						t.Fatalf("%d %s", resp.StatusCode, b)
					}
					req := <-gen.got
					// stories260K's SentencePiece tokenizer puts its space
					// prefix before the text it encodes; Decode shows it.
					prompt, ok := strings.CutPrefix(eg.tok.Decode(toInt32(req.GetPromptTokenIds())), " ")
					if !ok {
						t.Errorf("decoded prompt lacks the tokenizer's space prefix")
					}
					if want := qwen3Golden(t, name); prompt != want {
						t.Errorf("prompt\n%q\nwant jinja2's (golden %s)\n%q", prompt, name, want)
					}
					if got := strings.HasSuffix(prompt, qwen3NoThink); got != c.noThink {
						t.Errorf("prompt ends with an empty think block: %v, want %v\n%q", got, c.noThink, prompt)
					}
				})
			}
		}
	}
}

// TestChatTemplateKwargsBad: a chat_template_kwargs that is not an object,
// is too large, has a key that is not an identifier or that would replace
// a variable the router sets (or a template global), or an enable_thinking
// that is not a boolean, is a 400 naming the field; so is the field on
// /v1/completions, which renders no template.
func TestChatTemplateKwargsBad(t *testing.T) {
	eg := newEngineGen(t)
	srv := apiServer(t, eg, nil, func(o *openai.Options) { o.Limits.MaxBodyBytes = 1 << 20 })
	chat := func(kw string) string { return `{` + userMsg + `,"chat_template_kwargs":` + kw + `}` }
	many := make([]string, 65)
	for i := range many {
		many[i] = `"k` + strings.Repeat("x", i) + `":1`
	}
	cases := []struct {
		name, path, body, param, inMessage string
	}{
		{"array", chatPath, chat(`[{"enable_thinking":false}]`), "chat_template_kwargs", "object"},
		{"string", chatPath, chat(`"enable_thinking=false"`), "chat_template_kwargs", "object"},
		{"number", chatPath, chat(`1`), "chat_template_kwargs", "object"},
		{"boolean", chatPath, chat(`false`), "chat_template_kwargs", "object"},
		{"key with a dash", chatPath, chat(`{"enable-thinking":false}`), "chat_template_kwargs.enable-thinking", "identifier"},
		{"key starting with a digit", chatPath, chat(`{"1st":true}`), "chat_template_kwargs.1st", "identifier"},
		{"empty key", chatPath, chat(`{"":true}`), "chat_template_kwargs.", "identifier"},
		{"non-ASCII key", chatPath, chat(`{"dénk":true}`), "chat_template_kwargs.dénk", "identifier"},
		{"first bad key in body order", chatPath, chat(`{"ok":1,"b-d":2,"a-c":3}`), "chat_template_kwargs.b-d", "identifier"},
		{"messages", chatPath, chat(`{"messages":[]}`), "chat_template_kwargs.messages", "router"},
		{"tools", chatPath, chat(`{"tools":[{"type":"function","function":{"name":"f"}}]}`), "chat_template_kwargs.tools", "router"},
		{"add_generation_prompt", chatPath, chat(`{"add_generation_prompt":false}`), "chat_template_kwargs.add_generation_prompt", "router"},
		{"bos_token", chatPath, chat(`{"bos_token":"<s>"}`), "chat_template_kwargs.bos_token", "router"},
		{"eos_token", chatPath, chat(`{"eos_token":""}`), "chat_template_kwargs.eos_token", "router"},
		{"raise_exception", chatPath, chat(`{"raise_exception":1}`), "chat_template_kwargs.raise_exception", "router"},
		{"strftime_now", chatPath, chat(`{"strftime_now":"2024"}`), "chat_template_kwargs.strftime_now", "router"},
		{"tojson filter", chatPath, chat(`{"__baton_tojson":1}`), "chat_template_kwargs.__baton_tojson", "router"},
		{"namespace global", chatPath, chat(`{"namespace":1}`), "chat_template_kwargs.namespace", "router"},
		{"range global", chatPath, chat(`{"range":[1]}`), "chat_template_kwargs.range", "router"},
		{"given twice", chatPath, chat(`{"enable_thinking":true,"enable_thinking":false}`), "chat_template_kwargs.enable_thinking", "twice"},
		{"enable_thinking a string", chatPath, chat(`{"enable_thinking":"false"}`), "chat_template_kwargs.enable_thinking", "boolean"},
		{"enable_thinking a number", chatPath, chat(`{"enable_thinking":0}`), "chat_template_kwargs.enable_thinking", "boolean"},
		{"65 keys", chatPath, chat(`{` + strings.Join(many, ",") + `}`), "chat_template_kwargs", "64"},
		{"over 16 KiB", chatPath, chat(`{"doc":"` + strings.Repeat("x", 16<<10) + `"}`), "chat_template_kwargs", "16384"},
		{"on completions", cmplPath, `{"prompt":"x","chat_template_kwargs":{"enable_thinking":false}}`, "chat_template_kwargs", "Unrecognized"},
		// llama-server reads enable_thinking only inside chat_template_kwargs.
		{"top-level enable_thinking", chatPath, `{` + userMsg + `,"enable_thinking":false}`, "enable_thinking", "Unrecognized"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, b := post(t, srv.URL+c.path, c.body)
			e := checkError(t, resp.StatusCode, object(t, b), http.StatusBadRequest, "invalid_request_error", c.param)
			if msg, _ := e["message"].(string); !strings.Contains(msg, c.inMessage) {
				t.Errorf("message %q does not say %q", msg, c.inMessage)
			}
		})
	}
	// The bounds themselves are allowed: 64 keys, and 16 KiB.
	for name, kw := range map[string]string{
		"64 keys": `{` + strings.Join(many[:64], ",") + `}`,
		"16 KiB":  `{"doc":"` + strings.Repeat("x", 16<<10-len(`{"doc":""}`)) + `"}`,
		"null":    `{"enable_thinking":null}`,
		"nested":  `{"enable_thinking":true,"opts":{"a":[1,2.5,"x",null,{"b":false}]}}`,
	} {
		t.Run("allowed "+name, func(t *testing.T) {
			if resp, b := post(t, srv.URL+chatPath, `{`+userMsg+`,"max_tokens":1,"chat_template_kwargs":`+kw+`}`); resp.StatusCode != http.StatusOK {
				t.Errorf("%d %s", resp.StatusCode, b)
			}
		})
	}
}

// TestRenderVarsReserved: RenderVars refuses an extra variable that would
// replace one the router sets — tools included, also when the request has
// no tools (the template would otherwise show a tool list no one checked).
func TestRenderVarsReserved(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("testdata", "templates", "qwen3.jinja"))
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := openai.NewChatTemplate(string(src), "<|endoftext|>", "<|im_end|>")
	if err != nil {
		t.Fatal(err)
	}
	msgs := []openai.Message{{Role: "user", Content: "Hi"}}
	for _, name := range []string{"tools", "messages", "add_generation_prompt", "bos_token", "eos_token", "namespace"} {
		vars := map[string]any{name: []any{map[string]any{"type": "function", "function": map[string]any{"name": "launch"}}}}
		out, err := tmpl.RenderVars(msgs, nil, true, vars)
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: err = %v, want one naming it; rendered\n%q", name, err, out)
		}
	}
}

// TestRenderVarsRawJSON: a json.RawMessage value reaches the template as
// the JSON value it holds, with its key order and its integers kept, as
// Hugging Face's tojson shows them.
func TestRenderVarsRawJSON(t *testing.T) {
	tmpl, err := openai.NewChatTemplate(`{% if opts is defined %}{{ opts | tojson }}|{{ opts.z + 1 }}|{{ flag is false }}{% endif %}`, "", "")
	if err != nil {
		t.Fatal(err)
	}
	out, err := tmpl.RenderVars([]openai.Message{{Role: "user", Content: "Hi"}}, nil, true, map[string]any{
		"opts": json.RawMessage(`{"z": 1, "b": [2.0, "x", null], "a": {"k": true}}`),
		"flag": json.RawMessage(`false`),
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"z": 1, "b": [2.0, "x", null], "a": {"k": true}}|2|True`; out != want {
		t.Errorf("rendered %q, want %q", out, want)
	}
}
