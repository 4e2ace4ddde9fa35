package openai_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/baton-serving/baton/engine/tokenizer"
	"github.com/baton-serving/baton/router-svc/internal/openai"
)

// The chat templates of well-known models, as their tokenizer_config.json
// (and so their GGUF files' tokenizer.chat_template) carry them.
const (
	llama2Template = `{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}`

	llama3Template = `{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}`

	mistralTemplate = `{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}`

	qwen2Template = `{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}`

	smolLMTemplate = `{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}`

	// TinyLlama's spans lines; Hugging Face's trim_blocks drops the newline
	// after each block tag but keeps those after the {{ }} lines.
	tinyLlamaTemplate = "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\\n' + message['content'] + eos_token }}\n{% elif message['role'] == 'system' %}\n{{ '<|system|>\\n' + message['content'] + eos_token }}\n{% elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\\n'  + message['content'] + eos_token }}\n{% endif %}\n{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}"
)

func TestChatTemplates(t *testing.T) {
	sys := openai.Message{Role: "system", Content: "You tell stories."}
	u1 := openai.Message{Role: "user", Content: "Tell me a story."}
	a1 := openai.Message{Role: "assistant", Content: "Once upon a time."}
	u2 := openai.Message{Role: "user", Content: "  More, please! \n"}
	cases := []struct {
		name, src, bos, eos string
		msgs                []openai.Message
		gen                 bool
		want                string
	}{
		{"llama2", llama2Template, "<s>", "</s>", []openai.Message{sys, u1, a1, u2}, true,
			"<s>[INST] <<SYS>>\nYou tell stories.\n<</SYS>>\n\nTell me a story. [/INST] Once upon a time. </s><s>[INST] More, please! [/INST]"},
		{"llama2 without system", llama2Template, "<s>", "</s>", []openai.Message{u1}, true,
			"<s>[INST] Tell me a story. [/INST]"},
		{"llama3", llama3Template, "<|begin_of_text|>", "<|eot_id|>", []openai.Message{sys, u1, a1, u2}, true,
			"<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou tell stories.<|eot_id|>" +
				"<|start_header_id|>user<|end_header_id|>\n\nTell me a story.<|eot_id|>" +
				"<|start_header_id|>assistant<|end_header_id|>\n\nOnce upon a time.<|eot_id|>" +
				"<|start_header_id|>user<|end_header_id|>\n\nMore, please!<|eot_id|>" +
				"<|start_header_id|>assistant<|end_header_id|>\n\n"},
		{"llama3 without generation prompt", llama3Template, "<|begin_of_text|>", "<|eot_id|>", []openai.Message{u1}, false,
			"<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nTell me a story.<|eot_id|>"},
		{"mistral", mistralTemplate, "<s>", "</s>", []openai.Message{u1, a1, u2}, true,
			"<s>[INST] Tell me a story. [/INST]Once upon a time.</s>[INST]   More, please! \n [/INST]"},
		{"qwen2 default system", qwen2Template, "", "<|im_end|>", []openai.Message{u1}, true,
			"<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nTell me a story.<|im_end|>\n<|im_start|>assistant\n"},
		{"qwen2", qwen2Template, "", "<|im_end|>", []openai.Message{sys, u1, a1}, true,
			"<|im_start|>system\nYou tell stories.<|im_end|>\n<|im_start|>user\nTell me a story.<|im_end|>\n" +
				"<|im_start|>assistant\nOnce upon a time.<|im_end|>\n<|im_start|>assistant\n"},
		{"smollm", smolLMTemplate, "<|im_start|>", "<|im_end|>", []openai.Message{sys, u1}, true,
			"<|im_start|>system\nYou tell stories.<|im_end|>\n<|im_start|>user\nTell me a story.<|im_end|>\n<|im_start|>assistant\n"},
		{"smollm without generation prompt", smolLMTemplate, "<|im_start|>", "<|im_end|>", []openai.Message{u1}, false,
			"<|im_start|>user\nTell me a story.<|im_end|>\n"},
		{"tinyllama", tinyLlamaTemplate, "<s>", "</s>", []openai.Message{sys, u1}, true,
			"<|system|>\nYou tell stories.</s>\n<|user|>\nTell me a story.</s>\n<|assistant|>\n"},
		{"tinyllama three turns", tinyLlamaTemplate, "<s>", "</s>", []openai.Message{u1, a1, u2}, true,
			"<|user|>\nTell me a story.</s>\n<|assistant|>\nOnce upon a time.</s>\n<|user|>\n  More, please! \n</s>\n<|assistant|>\n"},
		{"plain default", "", "<s>", "</s>", []openai.Message{sys, u1}, true,
			"You tell stories.\nTell me a story."},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tmpl, err := openai.NewChatTemplate(c.src, c.bos, c.eos)
			if err != nil {
				t.Fatal(err)
			}
			if tmpl.Default() != (c.src == "") {
				t.Errorf("Default() = %v", tmpl.Default())
			}
			got, err := tmpl.Render(c.msgs, c.gen)
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Errorf("rendered\n%q\nwant\n%q", got, c.want)
			}
		})
	}
}

func TestChatTemplateErrors(t *testing.T) {
	if _, err := openai.NewChatTemplate("{% for m in messages %}", "", ""); err == nil {
		t.Error("an unclosed for loop compiled")
	}
	for _, src := range []string{mistralTemplate, llama2Template} {
		tmpl, err := openai.NewChatTemplate(src, "<s>", "</s>")
		if err != nil {
			t.Fatal(err)
		}
		// Two user turns in a row break the alternation both templates demand.
		_, err = tmpl.Render([]openai.Message{{Role: "user", Content: "a"}, {Role: "user", Content: "b"}}, true)
		if err == nil || !strings.Contains(err.Error(), "alternate") {
			t.Errorf("Render = %v, want the template's own complaint", err)
		}
	}
}

// TestChatTemplateInHandler: the handler renders with the template it is
// given, tokenizes special-token text as the tokens themselves, adds BOS once,
// and answers a template's refusal with 400 naming messages.
func TestChatTemplateInHandler(t *testing.T) {
	eg := newEngineGen(t)
	for _, c := range []struct {
		src, name string
	}{{llama2Template, "llama2"}, {smolLMTemplate, "smollm"}, {mistralTemplate, "mistral"}} {
		tmpl, err := openai.ChatTemplateFor(eg.tok, c.src)
		if err != nil {
			t.Fatal(err)
		}
		srv := apiServer(t, eg, nil, func(o *openai.Options) { o.Template = tmpl })
		msgs := []openai.Message{{Role: "user", Content: "Once upon a time"}}
		rendered, err := tmpl.Render(msgs, true)
		if err != nil {
			t.Fatal(err)
		}
		ids := eg.tok.Encode(rendered, tokenizer.EncodeOptions{ParseSpecial: true})
		if ids[0] != eg.tok.BOS() {
			ids = append([]int32{eg.tok.BOS()}, ids...)
		}
		resp, b := post(t, srv.URL+"/v1/chat/completions", `{"max_tokens":3,"temperature":0,"messages":[{"role":"user","content":"Once upon a time"}]}`)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %s", c.name, resp.StatusCode, b)
		}
		var out struct {
			Usage struct {
				PromptTokens int `json:"prompt_tokens"`
			}
		}
		if err := json.Unmarshal(b, &out); err != nil || out.Usage.PromptTokens != len(ids) {
			t.Errorf("%s: prompt_tokens %d, want %d (%q)", c.name, out.Usage.PromptTokens, len(ids), rendered)
		}
		if c.name == "llama2" && (ids[0] != 1 || ids[1] == 1) {
			t.Errorf("llama2: BOS not exactly once: %v", ids[:3])
		}
		if c.name == "mistral" {
			resp, b := post(t, srv.URL+"/v1/chat/completions", `{"messages":[{"role":"user","content":"Hi"},{"role":"system","content":"Be brief."}]}`)
			e := checkError(t, resp.StatusCode, object(t, b), http.StatusBadRequest, "invalid_request_error", "messages")
			if !strings.Contains(e["message"].(string), "Only user and assistant roles") {
				t.Errorf("message = %v", e["message"])
			}
		}
	}
}
