package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"

	"github.com/baton-serving/baton/engine/tokenizer"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/svckit/apiconv"
	"google.golang.org/protobuf/proto"
)

// Ranges of the sampling fields, as OpenAI documents them (and Baton's
// SamplingParams enforces).
const (
	maxTopK           = math.MaxInt32
	maxCompletionLogp = apiconv.MaxTopLogprobs
)

func isNull(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || bytes.Equal(t, []byte("null"))
}

// prepareCommon checks the fields both endpoints share and fills the
// request's sampling parameters (all but max_new_tokens).
func (h *Handler) prepareCommon(c *commonRequest, j *job) *httpError {
	if c.Model != "" && c.Model != h.model.ID {
		return h.unknownModel(c.Model)
	}
	j.n = 1
	if c.N != nil {
		// OpenAI refuses n < 1 too ("0 is less than the minimum of 1").
		if *c.N < 1 || *c.N > int64(h.limits.MaxN) {
			return invalid("n", "n = %d: want 1-%d choices (--max-n)", *c.N, h.limits.MaxN)
		}
		j.n = int(*c.N)
	}
	if c.StreamOptions != nil && !c.Stream {
		return invalid("stream_options", "stream_options is only allowed when stream is true")
	}
	j.stream = c.Stream
	j.includeUsage = c.Stream && c.StreamOptions != nil && c.StreamOptions.IncludeUsage
	// The final event's usage is what the response reports, streamed or not.
	j.req.StreamOptions = &batonv1.StreamOptions{IncludeUsage: true}

	sp := &batonv1.SamplingParams{IgnoreEos: c.IgnoreEOS}
	j.req.Sampling = sp
	if j.n > 1 {
		sp.N = proto.Uint32(uint32(j.n))
	}
	bias, herr := h.parseLogitBias(c.LogitBias)
	if herr != nil {
		return herr
	}
	sp.LogitBias = bias
	if herr := h.constrain(c, sp); herr != nil {
		return herr
	}
	if v := c.Temperature; v != nil {
		if *v < 0 || *v > 2 {
			return invalid("temperature", "temperature = %g: want a value in [0, 2]", *v)
		}
		sp.Temperature = proto.Float32(float32(*v))
	}
	if v := c.TopP; v != nil {
		if *v <= 0 || *v > 1 {
			return invalid("top_p", "top_p = %g: want a value in (0, 1]", *v)
		}
		sp.TopP = proto.Float32(float32(*v))
	}
	if v := c.TopK; v != nil {
		// -1 is how vLLM and others spell "disabled".
		if *v < -1 || *v > maxTopK {
			return invalid("top_k", "top_k = %d: want -1 or 0 (disabled) or a positive count", *v)
		}
		sp.TopK = uint32(max(*v, 0))
	}
	if v := c.MinP; v != nil {
		if *v < 0 || *v > 1 {
			return invalid("min_p", "min_p = %g: want a value in [0, 1]", *v)
		}
		sp.MinP = float32(*v)
	}
	if v := c.RepetitionPenalty; v != nil {
		if *v <= 0 || *v > 10 {
			return invalid("repetition_penalty", "repetition_penalty = %g: want a value in (0, 10]", *v)
		}
		sp.RepetitionPenalty = proto.Float32(float32(*v))
	}
	for _, p := range []struct {
		name string
		v    *float64
		dst  *float32
	}{{"presence_penalty", c.PresencePenalty, &sp.PresencePenalty}, {"frequency_penalty", c.FrequencyPenalty, &sp.FrequencyPenalty}} {
		if p.v == nil {
			continue
		}
		if *p.v < -2 || *p.v > 2 {
			return invalid(p.name, "%s = %g: want a value in [-2, 2]", p.name, *p.v)
		}
		*p.dst = float32(*p.v)
	}
	if c.Seed != nil {
		// OpenAI's seed is a signed 64-bit integer; every value is a distinct
		// seed.
		sp.Seed = proto.Uint64(uint64(*c.Seed))
	}
	stops, herr := parseStop(c.Stop)
	if herr != nil {
		return herr
	}
	sp.Stop = stops
	return nil
}

// parseStop reads "stop": null, a string, or an array of strings.
func parseStop(raw json.RawMessage) ([]string, *httpError) {
	if isNull(raw) {
		return nil, nil
	}
	var list []string
	var one string
	if err := json.Unmarshal(raw, &one); err == nil {
		list = []string{one}
	} else if err := json.Unmarshal(raw, &list); err != nil {
		return nil, invalid("stop", "stop: expected a string or an array of strings")
	}
	if len(list) > apiconv.MaxStopStrings {
		return nil, invalid("stop", "stop: %d sequences; at most %d are allowed", len(list), apiconv.MaxStopStrings)
	}
	for i, s := range list {
		if s == "" || len(s) > apiconv.MaxStopBytes {
			return nil, invalid("stop", "stop[%d]: %d bytes; want 1-%d", i, len(s), apiconv.MaxStopBytes)
		}
	}
	return list, nil
}

// prepareCompletion validates a completions request into j.
func (h *Handler) prepareCompletion(in *completionRequest, j *job) *httpError {
	j.promptParam = "prompt"
	if herr := h.prepareCommon(&in.commonRequest, j); herr != nil {
		return herr
	}
	switch {
	case in.BestOf != nil && *in.BestOf != 1:
		return invalid("best_of", "best_of = %d: only 1 is supported (use n for several choices)", *in.BestOf)
	case in.BestOf != nil && j.n > 1:
		// OpenAI: best_of must be at least n; Baton does not rank choices.
		return invalid("best_of", "best_of = 1 with n = %d: best_of must be at least n, and only best_of = 1 is supported; omit best_of", j.n)
	case in.Suffix != nil && *in.Suffix != "":
		return invalid("suffix", "suffix is not supported (Baton does not insert text between a prompt and a suffix)")
	}
	maxTokens := in.MaxTokens
	if in.Echo {
		// The response starts with the prompt's text and, when logprobs
		// are asked for, its tokens' logprobs (from the workers).
		j.echo = true
		j.req.Sampling.PromptLogprobs = in.Logprobs != nil
		if maxTokens != nil && *maxTokens == 0 {
			// Only the prompt is scored (an eval harness's loglikelihood
			// request): one token is generated, which the response drops.
			j.promptOnly = true
			maxTokens = proto.Int64(1)
		}
	} else if maxTokens != nil && *maxTokens == 0 {
		return invalid("max_tokens", "max_tokens = 0: want at least 1 (0 is allowed only with echo: true, which returns the prompt and its logprobs)")
	}
	if v := in.Logprobs; v != nil {
		if *v < 0 || *v > maxCompletionLogp {
			return invalid("logprobs", "logprobs = %d: want a value in [0, %d]", *v, maxCompletionLogp)
		}
		j.req.Sampling.Logprobs = true
		j.req.Sampling.TopLogprobs = uint32(*v)
	}
	prompt, herr := h.completionPrompt(in.Prompt)
	if herr != nil {
		return herr
	}
	j.prepare = func() *httpError { // once admitted (admit.go)
		ids, herr := prompt()
		if herr != nil {
			return herr
		}
		j.req.PromptTokenIds = ids
		return h.budget(j, maxTokens, "max_tokens")
	}
	return nil
}

// promptSource gives a prompt's token ids, tokenizing it if need be: called
// only once the request is admitted (admit.go).
type promptSource func() ([]uint32, *httpError)

// completionPrompt reads "prompt": a string, an array holding one string, an
// array of token ids, or an array holding one array of token ids. Text is
// tokenized as the native API does (BOS added as the model says, special
// tokens recognised) when the source is called; a text too long to fit
// whatever it tokenizes to is refused now; token ids pass unchanged.
func (h *Handler) completionPrompt(raw json.RawMessage) (promptSource, *httpError) {
	const want = "a string or an array of token ids"
	if isNull(raw) {
		return nil, invalid("prompt", "prompt is required")
	}
	var text string
	if err := json.Unmarshal(raw, &text); err == nil {
		return h.encodePrompt(text)
	}
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, invalid("prompt", "prompt: expected %s", want)
	}
	if len(list) == 0 {
		return nil, invalid("prompt", "prompt is empty")
	}
	var ids []int64
	if err := json.Unmarshal(raw, &ids); err == nil {
		return h.promptIDs(ids)
	}
	if len(list) > 1 {
		return nil, invalid("prompt", "prompt: %d prompts in one request; send one prompt per request", len(list))
	}
	if err := json.Unmarshal(list[0], &text); err == nil {
		return h.encodePrompt(text)
	}
	if err := json.Unmarshal(list[0], &ids); err == nil {
		if len(ids) == 0 {
			return nil, invalid("prompt", "prompt is empty")
		}
		return h.promptIDs(ids)
	}
	return nil, invalid("prompt", "prompt: expected %s", want)
}

func (h *Handler) encodePrompt(text string) (promptSource, *httpError) {
	if text == "" {
		return nil, invalid("prompt", "prompt is empty")
	}
	if herr := h.checkPromptBytes("prompt", len(text)); herr != nil {
		return nil, herr // never tokenized
	}
	return func() ([]uint32, *httpError) {
		return apiconv.WireIDs(h.encode(text, tokenizer.EncodeOptions{AddSpecial: true, ParseSpecial: true})), nil
	}, nil
}

func (h *Handler) promptIDs(ids []int64) (promptSource, *httpError) {
	vocab := int64(h.model.Tokenizer.VocabSize())
	out := make([]uint32, len(ids))
	for i, id := range ids {
		if id < 0 || id >= vocab {
			return nil, invalid("prompt", "prompt[%d] = %d: want a token id in [0, %d)", i, id, vocab)
		}
		out[i] = uint32(id)
	}
	return func() ([]uint32, *httpError) { return out, nil }, nil
}

// prepareChat validates a chat completions request into j.
func (h *Handler) prepareChat(in *chatRequest, j *job) *httpError {
	j.promptParam = "messages"
	if herr := h.prepareCommon(&in.commonRequest, j); herr != nil {
		return herr
	}
	if herr := chatExtras(in); herr != nil {
		return herr
	}
	vars, herr := parseTemplateKwargs(in.ChatTemplateKwargs)
	if herr != nil {
		return herr
	}
	if herr := h.applyTools(in, j); herr != nil {
		return herr
	}
	logprobs := in.Logprobs != nil && *in.Logprobs
	if v := in.TopLogprobs; v != nil {
		switch {
		case *v < 0 || *v > apiconv.MaxTopLogprobs:
			return invalid("top_logprobs", "top_logprobs = %d: want a value in [0, %d]", *v, apiconv.MaxTopLogprobs)
		case *v > 0 && !logprobs:
			return invalid("top_logprobs", "top_logprobs requires logprobs to be true")
		}
		j.req.Sampling.TopLogprobs = uint32(*v)
	}
	j.req.Sampling.Logprobs = logprobs

	msgs, herr := parseMessages(in.Messages)
	if herr != nil {
		return herr
	}
	maxTokens, param := in.MaxTokens, "max_tokens"
	if in.MaxCompletionTokens != nil {
		maxTokens, param = in.MaxCompletionTokens, "max_completion_tokens"
	}
	j.prepare = func() *httpError { // once admitted (admit.go)
		text, err := h.tmpl.RenderVars(msgs, j.tools.rendered(), true, vars)
		if err != nil {
			return templateError(err)
		}
		if herr := h.checkPromptBytes("messages", len(text)); herr != nil {
			return herr // never tokenized
		}
		ids := h.encode(text, tokenizer.EncodeOptions{ParseSpecial: true})
		// Templates usually write the BOS text themselves; add the token only
		// when the model wants one and the template did not, never twice.
		if tok := h.model.Tokenizer; tok.AddBOS() && tok.BOS() != tokenizer.NoToken && (len(ids) == 0 || ids[0] != tok.BOS()) {
			ids = append([]int32{tok.BOS()}, ids...)
		}
		if len(ids) == 0 {
			return invalid("messages", "messages: the conversation renders to an empty prompt")
		}
		j.req.PromptTokenIds = apiconv.WireIDs(ids)
		return h.budget(j, maxTokens, param)
	}
	return nil
}

// Roles a message may have; "developer" is OpenAI's newer name for
// "system", and templates know only the latter.
var roles = map[string]string{
	"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool",
}

func parseMessages(in []chatMessage) ([]Message, *httpError) {
	if len(in) == 0 {
		return nil, invalid("messages", "messages is empty; at least one message is required")
	}
	out := make([]Message, len(in))
	for i, m := range in {
		role, ok := roles[m.Role]
		if !ok {
			return nil, invalid(fmt.Sprintf("messages[%d].role", i), "messages[%d].role = %q: want one of system, developer, user, assistant, tool", i, m.Role)
		}
		content, herr := messageContent(i, m.Content)
		if herr != nil {
			return nil, herr
		}
		switch {
		case !isNull(m.Audio):
			return nil, invalid(fmt.Sprintf("messages[%d].audio", i), "messages[%d].audio: audio is not supported", i)
		case !isNull(m.FunctionCall):
			return nil, invalid(fmt.Sprintf("messages[%d].function_call", i), "messages[%d].function_call: functions are not supported", i)
		}
		if content == nil {
			if role != "assistant" {
				return nil, invalid(fmt.Sprintf("messages[%d].content", i), "messages[%d].content is required for a %s message", i, m.Role)
			}
			content = new(string)
		}
		out[i] = Message{Role: role, Content: *content, Name: m.Name}
		if herr := messageTools(i, m, &out[i]); herr != nil {
			return nil, herr
		}
	}
	return out, nil
}

// messageContent reads a message's content: a string, or an array of text
// parts that are joined with "\n" (nil when absent or null).
func messageContent(i int, raw json.RawMessage) (*string, *httpError) {
	param := fmt.Sprintf("messages[%d].content", i)
	if isNull(raw) {
		return nil, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return &s, nil
	}
	var parts []struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return nil, invalid(param, "%s: expected a string or an array of content parts", param)
	}
	var b bytes.Buffer
	for k, p := range parts {
		if p.Type != "text" {
			return nil, invalid(fmt.Sprintf("%s[%d].type", param, k), "%s[%d].type = %q: only text parts are supported", param, k, p.Type)
		}
		if p.Text == nil {
			return nil, invalid(fmt.Sprintf("%s[%d].text", param, k), "%s[%d].text is required", param, k)
		}
		if k > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(*p.Text)
	}
	s = b.String()
	return &s, nil
}

// budget checks the prompt's length and the requested number of new tokens
// against the limits and the context window, and sets max_new_tokens.
func (h *Handler) budget(j *job, maxTokens *int64, param string) *httpError {
	n, ctxLen := len(j.req.GetPromptTokenIds()), h.model.ContextLength
	if lim := h.limits.MaxPromptTokens; lim > 0 && n > lim {
		return invalid(j.promptParam, "the prompt has %d tokens; this server accepts at most %d (--max-prompt-tokens)", n, lim).withCode("prompt_too_long")
	}
	if n >= ctxLen {
		return invalid(j.promptParam, "the prompt has %d tokens; this model's context window is %d tokens and at least one must be left to generate", n, ctxLen).withCode("context_length_exceeded")
	}
	if maxTokens == nil {
		m := min(h.limits.DefaultMaxTokens, ctxLen-n)
		if lim := h.limits.MaxNewTokens; lim > 0 {
			m = min(m, lim)
		}
		j.req.Sampling.MaxNewTokens = uint32(m)
		return nil
	}
	m := *maxTokens
	switch {
	case m < 1:
		return invalid(param, "%s = %d: want at least 1", param, m)
	case h.limits.MaxNewTokens > 0 && m > int64(h.limits.MaxNewTokens):
		return invalid(param, "%s = %d: this server generates at most %d tokens per request (--max-new-tokens-limit)", param, m, h.limits.MaxNewTokens)
	case m >= int64(ctxLen):
		return invalid(param, "%s = %d: beyond this model's context window of %d tokens", param, m, ctxLen).withCode("context_length_exceeded")
	case int64(n)+m > int64(ctxLen):
		return invalid(j.promptParam, "this model's context window is %d tokens; the prompt has %d and %s asks for %d more", ctxLen, n, param, m).withCode("context_length_exceeded")
	}
	j.req.Sampling.MaxNewTokens = uint32(m)
	return nil
}
