package openai

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/ardanlabs/jinja"
)

// TemplateRaised is a chat template's own refusal of a conversation (its
// raise_exception call, e.g. Gemma 2's "System role not supported"), as
// opposed to a failure of the engine to evaluate the template.
type TemplateRaised struct{ Message string }

func (e *TemplateRaised) Error() string { return e.Message }

// raiseException is the template function raise_exception(message).
func raiseException() jinja.Value {
	return jinja.NewCallable("raise_exception", func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		if len(args) == 0 {
			return jinja.Undefined(), &TemplateRaised{Message: "raise_exception called without a message"}
		}
		msg := args[0].String()
		if args[0].IsString() {
			msg = args[0].AsString()
		}
		return jinja.Undefined(), &TemplateRaised{Message: msg}
	})
}

// probeCall is the tool call of the self-check's conversations: an id of
// 9 letters and digits, as Mistral's templates demand.
var probeCall = ToolCall{ID: "probe0001", Name: "get_weather", Arguments: `{"city": "Paris"}`}

// probes are the conversations a template is rendered with when it is
// loaded: the shapes every request has (a user turn, a system turn,
// several turns, the generation prompt) and, when the template shows
// tools, a tool round.
var probes = []struct {
	what  string
	msgs  []Message
	tools bool
}{
	{"one user message", []Message{{Role: "user", Content: "Hello"}}, false},
	{"a system and a user message", []Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Hello"}}, false},
	{"user, assistant, user", []Message{{Role: "user", Content: "Hi"}, {Role: "assistant", Content: "Hello!"}, {Role: "user", Content: "Bye"}}, false},
	{"tools and a tool round", []Message{{Role: "user", Content: "Weather in Paris?"},
		{Role: "assistant", ToolCalls: []ToolCall{probeCall}}, {Role: "tool", Content: `{"temp": 21}`, ToolCallID: probeCall.ID}}, true},
}

// selfCheck renders the probes, with and without the generation prompt,
// and fails when the engine cannot evaluate the template (an unknown
// filter, method or test, a construct it does not implement): at startup,
// with the engine's message, which names the construct — rather than at
// each request. A template's own refusal (raise_exception) is its choice
// and passes.
func (c *ChatTemplate) selfCheck() error {
	tool := []ToolDef{{Name: "get_weather", Description: ptrTo("Current weather"),
		Parameters: []byte(`{"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}`)}}
	for _, p := range probes {
		if p.tools && !c.tools {
			continue
		}
		var tools []ToolDef
		if p.tools {
			tools = tool
		}
		for _, agp := range []bool{true, false} {
			_, err := c.RenderTools(p.msgs, tools, agp)
			var raised *TemplateRaised
			if err != nil && !errors.As(err, &raised) {
				return fmt.Errorf("chat template: the Jinja engine cannot render it (%s): %w", p.what, err)
			}
		}
	}
	return nil
}

func ptrTo(s string) *string { return &s }

// lineOf is the 1-based line of src's byte offset off.
func lineOf(src string, off int) int { return strings.Count(src[:off], "\n") + 1 }

// templateError is the answer to a request whose conversation the
// template did not render: the template's own refusal (TemplateRaised) is
// the client's 400 naming messages; any other failure is the engine's
// (a construct the load's self-check did not reach), the server's 500.
func templateError(err error) *httpError {
	var raised *TemplateRaised
	if errors.As(err, &raised) {
		return invalid("messages", "messages: %v", err)
	}
	return &httpError{status: http.StatusInternalServerError, typ: typeServer, message: "rendering the chat template: " + err.Error()}
}
