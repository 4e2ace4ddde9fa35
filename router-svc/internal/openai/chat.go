package openai

import (
	"fmt"
	"strings"

	"github.com/ardanlabs/jinja"
	"github.com/baton-serving/baton/engine/tokenizer"
)

// Message is one turn of a conversation as a chat template sees it.
type Message struct {
	Role    string
	Content string
	Name    string // optional
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
type ChatTemplate struct {
	tmpl     *jinja.Template // nil: the plain default
	bos, eos string
}

// NewChatTemplate compiles src ("" for the plain default). bos and eos are
// the texts of the model's BOS and EOS tokens ("" when it has none).
func NewChatTemplate(src, bos, eos string) (*ChatTemplate, error) {
	c := &ChatTemplate{bos: bos, eos: eos}
	if strings.TrimSpace(src) == "" {
		return c, nil
	}
	t, err := jinja.Compile(src)
	if err != nil {
		return nil, fmt.Errorf("chat template: %w", err)
	}
	c.tmpl = t
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

// Default reports whether c is the plain default template.
func (c *ChatTemplate) Default() bool { return c.tmpl == nil }

// Render returns the prompt for msgs; with addGenerationPrompt the template
// appends what opens the assistant's reply. An error is the template's own
// complaint (raise_exception) or a failure to evaluate it.
func (c *ChatTemplate) Render(msgs []Message, addGenerationPrompt bool) (out string, err error) {
	if c.tmpl == nil {
		parts := make([]string, len(msgs))
		for i, m := range msgs {
			parts[i] = m.Content
		}
		return strings.Join(parts, "\n"), nil
	}
	list := make([]any, len(msgs))
	for i, m := range msgs {
		mm := map[string]any{"role": m.Role, "content": m.Content}
		if m.Name != "" {
			mm["name"] = m.Name
		}
		list[i] = mm
	}
	// The template comes from the model file, not the client, but a template
	// construct the engine mishandles must fail the request, not the router.
	defer func() {
		if r := recover(); r != nil {
			out, err = "", fmt.Errorf("chat template failed: %v", r)
		}
	}()
	out, err = c.tmpl.Render(map[string]any{
		"messages":              list,
		"add_generation_prompt": addGenerationPrompt,
		"bos_token":             c.bos,
		"eos_token":             c.eos,
	})
	if err != nil {
		return "", fmt.Errorf("chat template: %w", err)
	}
	return out, nil
}
