package openai

import (
	"cmp"
	"encoding/json"
	"strings"

	"github.com/baton-serving/baton/engine/tokenizer"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
)

// output gathers a generation's events.
type output struct {
	promptIDs []uint32
	ids       []uint32
	text      strings.Builder
	logprobs  []*batonv1.TokenLogprob
	// promptLogprobs are the prompt's tokens' after the first (echo).
	promptLogprobs []*batonv1.TokenLogprob
	finish         batonv1.FinishReason
	evUsage        *batonv1.Usage
	// choices are each choice's events when n > 1 (this output gathers
	// them all); nil for n = 1.
	choices []*output
}

// newOutput gathers the events of a request for n choices.
func newOutput(n int) *output {
	o := &output{}
	if n > 1 {
		o.choices = make([]*output, n)
		for k := range o.choices {
			o.choices[k] = &output{}
		}
	}
	return o
}

func (o *output) add(ev *batonv1.GenerateEvent) {
	if k := int(ev.GetIndex()); o.choices != nil && k < len(o.choices) {
		o.choices[k].add(ev)
	}
	if len(ev.GetPromptTokenIds()) > 0 {
		o.promptIDs = ev.GetPromptTokenIds()
	}
	o.ids = append(o.ids, ev.GetTokenIds()...)
	o.text.WriteString(ev.GetText())
	o.logprobs = append(o.logprobs, ev.GetLogprobs()...)
	o.promptLogprobs = append(o.promptLogprobs, ev.GetPromptLogprobs()...)
	if f := ev.GetFinishReason(); f != batonv1.FinishReason_FINISH_REASON_UNSPECIFIED {
		o.finish = f
		// n > 1: the stream's last event carries the request's usage.
		if u := ev.GetUsage(); u != nil || o.choices == nil {
			o.evUsage = u
		}
	}
}

// usage is the Generator's count, or one made from the events when it sent
// none.
func (o *output) usage(req *batonv1.GenerateRequest) *usageObject {
	var u usageObject
	if o.evUsage != nil {
		u.PromptTokens, u.CompletionTokens = int(o.evUsage.GetPromptTokens()), int(o.evUsage.GetCompletionTokens())
		u.PromptTokensDetails.CachedTokens = int(o.evUsage.GetCachedTokens())
	} else {
		u.PromptTokens, u.CompletionTokens = len(o.promptIDs), len(o.ids)
		if u.PromptTokens == 0 {
			u.PromptTokens = len(req.GetPromptTokenIds())
		}
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	return &u
}

type usageObject struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// finishReason is OpenAI's name for f; nil (JSON null) while unfinished.
func finishReason(f batonv1.FinishReason) *string {
	var s string
	switch f {
	case batonv1.FinishReason_FINISH_REASON_STOP:
		s = "stop"
	case batonv1.FinishReason_FINISH_REASON_LENGTH:
		s = "length"
	default:
		return nil
	}
	return &s
}

// nullUsage is the usage of every chunk but the last when the client asked
// for usage: present and null, as OpenAI sends it.
var nullUsage = json.RawMessage("null")

func streamUsage(j *job) any {
	if j.includeUsage {
		return nullUsage
	}
	return nil
}

// responseObject is the envelope OpenAI wraps choices in, for completions
// and chat completions alike (C is the choice type).
type responseObject[C any] struct {
	ID                string `json:"id"`
	Object            string `json:"object"`
	Created           int64  `json:"created"`
	Model             string `json:"model"`
	SystemFingerprint string `json:"system_fingerprint"`
	Choices           []C    `json:"choices"`
	Usage             any    `json:"usage,omitempty"`
}

// completionObject is a text completion or one chunk of a streamed one.
type completionObject = responseObject[completionChoice]

type completionChoice struct {
	Text         string              `json:"text"`
	Index        int                 `json:"index"`
	Logprobs     *completionLogprobs `json:"logprobs"`
	FinishReason *string             `json:"finish_reason"`
}

// completionLogprobs is the legacy completions log-probability object.
// An echoed prompt's first token has a null token_logprobs and top_logprobs
// entry, as OpenAI answers: nothing comes before it.
type completionLogprobs struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []*float64           `json:"token_logprobs"`
	TopLogprobs   []map[string]float64 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

func newCompletionLogprobs() *completionLogprobs {
	return &completionLogprobs{Tokens: []string{}, TokenLogprobs: []*float64{}, TopLogprobs: []map[string]float64{}, TextOffset: []int{}}
}

// join appends b's entries to a's; either may be nil (no logprobs asked).
func (a *completionLogprobs) join(b *completionLogprobs) *completionLogprobs {
	if a == nil || b == nil {
		return cmp.Or(a, b)
	}
	a.Tokens = append(a.Tokens, b.Tokens...)
	a.TokenLogprobs = append(a.TokenLogprobs, b.TokenLogprobs...)
	a.TopLogprobs = append(a.TopLogprobs, b.TopLogprobs...)
	a.TextOffset = append(a.TextOffset, b.TextOffset...)
	return a
}

func (a *completionLogprobs) empty() bool { return a == nil || len(a.Tokens) == 0 }

type completionFormat struct {
	h        *Handler
	j        *job
	logprobs bool
	// chars counts the text before the next token, the prompt's included:
	// OpenAI's text_offset counts characters from the prompt's start, echoed
	// or not (see charCounter).
	chars charCounter
	// begun: the prompt has been counted (and, with echo, rendered).
	begun bool
}

func (f *completionFormat) object(choices []completionChoice) *completionObject {
	return &completionObject{ID: "cmpl-" + f.j.req.GetRequestId(), Object: "text_completion", Created: f.j.created,
		Model: f.h.model.ID, SystemFingerprint: f.h.fingerprint, Choices: choices}
}

// entry adds one token's logprobs to out, at the current text offset.
func (f *completionFormat) entry(out *completionLogprobs, v tokenView, lp *batonv1.TokenLogprob) {
	out.Tokens = append(out.Tokens, v.completion())
	out.TextOffset = append(out.TextOffset, f.chars.n)
	f.chars.add(v.bytes)
	if lp == nil {
		out.TokenLogprobs = append(out.TokenLogprobs, nil)
		out.TopLogprobs = append(out.TopLogprobs, nil)
		return
	}
	l := float64(lp.GetLogprob())
	out.TokenLogprobs = append(out.TokenLogprobs, &l)
	top := make(map[string]float64, len(lp.GetTopLogprobs()))
	for _, t := range lp.GetTopLogprobs() {
		// Two ids can show as one text (a byte token and a normal one,
		// a control token's name and its text): the map keeps the most
		// likely, which comes first.
		k := viewOf(f.h.model.Tokenizer, t.GetTokenId()).completion()
		if _, dup := top[k]; !dup {
			top[k] = float64(t.GetLogprob())
		}
	}
	out.TopLogprobs = append(out.TopLogprobs, top)
}

// convert renders generated tokens' logprobs; nil when none were asked.
func (f *completionFormat) convert(lps []*batonv1.TokenLogprob) *completionLogprobs {
	if !f.logprobs {
		return nil
	}
	out := newCompletionLogprobs()
	for _, lp := range lps {
		f.entry(out, viewOf(f.h.model.Tokenizer, lp.GetTokenId()), lp)
	}
	return out
}

// begin counts the prompt's characters and, with echo, renders its part:
// its text (the prompt's tokens' bytes, which give back a text prompt) and
// one logprob entry per prompt token, the first null, the others from lps,
// the workers' prompt_logprobs (one per token after the first; an entry
// they did not send is null too).
func (f *completionFormat) begin(lps []*batonv1.TokenLogprob) (string, *completionLogprobs) {
	f.begun = true
	if !f.j.echo && !f.logprobs {
		return "", nil // the prompt's characters count only for text_offset
	}
	ids := f.j.req.GetPromptTokenIds()
	ints := make([]int32, len(ids))
	for i, id := range ids {
		ints[i] = int32(min(id, 1<<31-1))
	}
	pieces := f.h.model.Tokenizer.PromptBytes(ints)
	if !f.j.echo {
		for _, b := range pieces {
			f.chars.add(b)
		}
		return "", nil
	}
	var text []byte
	var out *completionLogprobs
	if f.logprobs {
		out = newCompletionLogprobs()
	}
	for i, b := range pieces {
		text = append(text, b...)
		if out == nil {
			continue
		}
		v := viewOf(f.h.model.Tokenizer, ids[i])
		if v.bytes != nil {
			v.bytes = b // the first token's space prefix is not the prompt's
		}
		var lp *batonv1.TokenLogprob
		if i > 0 && i-1 < len(lps) {
			lp = lps[i-1]
		}
		f.entry(out, v, lp)
	}
	return tokenizer.ValidText(text), out
}

// generated is what the response shows of the generated part: nothing for
// a prompt-only request (max_tokens 0 with echo), whose one token the
// workers generate only because they must.
func (f *completionFormat) generated(text string, lps []*batonv1.TokenLogprob) (string, []*batonv1.TokenLogprob) {
	if f.j.promptOnly {
		return "", nil
	}
	return text, lps
}

func (f *completionFormat) finishReason(fr batonv1.FinishReason) *string {
	if f.j.promptOnly && fr != batonv1.FinishReason_FINISH_REASON_UNSPECIFIED {
		fr = batonv1.FinishReason_FINISH_REASON_LENGTH
	}
	return finishReason(fr)
}

// usageOf is u as the response counts it: a prompt-only request completed
// nothing.
func (f *completionFormat) usageOf(u *usageObject) *usageObject {
	if f.j.promptOnly {
		c := *u
		c.CompletionTokens, c.TotalTokens = 0, c.PromptTokens
		return &c
	}
	return u
}

func (f *completionFormat) whole(o *output) any {
	prefix, lp := f.begin(o.promptLogprobs)
	text, lps := f.generated(o.text.String(), o.logprobs)
	obj := f.object([]completionChoice{{Text: prefix + text, Logprobs: lp.join(f.convert(lps)), FinishReason: f.finishReason(o.finish)}})
	obj.Usage = f.usageOf(o.usage(f.j.req))
	return obj
}

func (f *completionFormat) opening() []any { return nil }

func (f *completionFormat) chunks(ev *batonv1.GenerateEvent) []any {
	var out []any
	var prefix string
	var lp *completionLogprobs
	done := ev.GetFinishReason() != batonv1.FinishReason_FINISH_REASON_UNSPECIFIED
	// The prompt's part goes in the first chunk, with the prompt's logprobs
	// when they were asked (they come in the first event).
	if !f.begun && (!(f.j.echo && f.logprobs) || len(ev.GetPromptLogprobs()) > 0 || len(ev.GetTokenIds()) > 0 || done) {
		prefix, lp = f.begin(ev.GetPromptLogprobs())
	}
	text, lps := f.generated(ev.GetText(), ev.GetLogprobs())
	text = prefix + text
	lp = lp.join(f.convert(lps))
	if text != "" || !lp.empty() {
		c := f.object([]completionChoice{{Text: text, Logprobs: lp}})
		c.Usage = streamUsage(f.j)
		out = append(out, c)
	}
	if fr := f.finishReason(ev.GetFinishReason()); fr != nil {
		c := f.object([]completionChoice{{FinishReason: fr}})
		c.Usage = streamUsage(f.j)
		out = append(out, c)
	}
	return out
}

func (f *completionFormat) usage(u *usageObject) any {
	c := f.object([]completionChoice{})
	c.Usage = f.usageOf(u)
	return c
}

// chatObject is a chat completion or one chunk of a streamed one.
type chatObject = responseObject[chatChoice]

// chatChoice is a choice of a completion (Message) or of a chunk (Delta).
type chatChoice struct {
	Index        int             `json:"index"`
	Message      *chatMessageOut `json:"message,omitempty"`
	Delta        *chatDelta      `json:"delta,omitempty"`
	Logprobs     *chatLogprobs   `json:"logprobs"`
	FinishReason *string         `json:"finish_reason"`
}

type chatMessageOut struct {
	Role string `json:"role"`
	// Content is null when the reply is only tool calls.
	Content   *string       `json:"content"`
	Refusal   *string       `json:"refusal"`
	ToolCalls []toolCallOut `json:"tool_calls,omitempty"`
}

type chatDelta struct {
	Role      string          `json:"role,omitempty"`
	Content   *string         `json:"content,omitempty"`
	ToolCalls []toolCallDelta `json:"tool_calls,omitempty"`
}

// toolCallOut is one call of message.tool_calls.
type toolCallOut struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"`
	Function functionCall `json:"function"`
}

type functionCall struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"`
}

// toolCallDelta is one call's part of a chunk, as OpenAI streams them: the
// first carries index, id, type and name (arguments ""), the next ones
// index and argument fragments.
type toolCallDelta struct {
	Index    int          `json:"index"`
	ID       string       `json:"id,omitempty"`
	Type     string       `json:"type,omitempty"`
	Function functionCall `json:"function"`
}

// toolCallsFinish is the finish reason of a reply that may have called
// tools, one rule for whole replies and streams: "length" whenever the
// worker stopped at the length limit (a call may be cut short, or more were
// to come), else "tool_calls" when a call parsed.
func toolCallsFinish(f batonv1.FinishReason, calls int) *string {
	if calls > 0 && f != batonv1.FinishReason_FINISH_REASON_LENGTH {
		s := "tool_calls"
		return &s
	}
	return finishReason(f)
}

type chatLogprobs struct {
	Content []chatTokenLogprob `json:"content"`
	Refusal []chatTokenLogprob `json:"refusal"`
}

type chatTokenLogprob struct {
	Token       string           `json:"token"`
	Logprob     float64          `json:"logprob"`
	Bytes       []int            `json:"bytes"`
	TopLogprobs []chatTopLogprob `json:"top_logprobs"`
}

type chatTopLogprob struct {
	Token   string  `json:"token"`
	Logprob float64 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

type chatFormat struct {
	h        *Handler
	j        *job
	logprobs bool
	// calls splits a streamed reply into content and tool calls (nil: the
	// request has no tools to parse for); forced streams forced calls.
	calls  *toolStream
	forced *forcedStream
	sent   int // tool calls streamed
}

func (f *chatFormat) object(object string, choices []chatChoice) *chatObject {
	return &chatObject{ID: "chatcmpl-" + f.j.req.GetRequestId(), Object: object, Created: f.j.created,
		Model: f.h.model.ID, SystemFingerprint: f.h.fingerprint, Choices: choices}
}

func (f *chatFormat) convert(lps []*batonv1.TokenLogprob) *chatLogprobs {
	if !f.logprobs {
		return nil
	}
	out := &chatLogprobs{Content: []chatTokenLogprob{}}
	for _, lp := range lps {
		v := viewOf(f.h.model.Tokenizer, lp.GetTokenId())
		t := chatTokenLogprob{Token: v.chat(), Logprob: float64(lp.GetLogprob()), Bytes: v.chatBytes(),
			TopLogprobs: []chatTopLogprob{}}
		for _, top := range lp.GetTopLogprobs() {
			v := viewOf(f.h.model.Tokenizer, top.GetTokenId())
			t.TopLogprobs = append(t.TopLogprobs, chatTopLogprob{Token: v.chat(), Logprob: float64(top.GetLogprob()), Bytes: v.chatBytes()})
		}
		out.Content = append(out.Content, t)
	}
	return out
}

func (f *chatFormat) whole(o *output) any {
	content, calls, dropped := f.j.tools.parse(o.text.String())
	f.logDropped(dropped)
	msg := &chatMessageOut{Role: "assistant", Content: content}
	for _, c := range calls {
		msg.ToolCalls = append(msg.ToolCalls, toolCallOut{ID: callID(f.j.tools.family), Type: "function",
			Function: functionCall{Name: c.Name, Arguments: c.Arguments}})
	}
	obj := f.object("chat.completion", []chatChoice{{
		Message:  msg,
		Logprobs: f.convert(o.logprobs), FinishReason: toolCallsFinish(o.finish, len(calls))}})
	obj.Usage = o.usage(f.j.req)
	return obj
}

func (f *chatFormat) chunk(c chatChoice) *chatObject {
	obj := f.object("chat.completion.chunk", []chatChoice{c})
	obj.Usage = streamUsage(f.j)
	return obj
}

// opening announces the assistant's turn, as OpenAI's first chunk does.
func (f *chatFormat) opening() []any {
	empty := ""
	return []any{f.chunk(chatChoice{Delta: &chatDelta{Role: "assistant", Content: &empty}})}
}

func (f *chatFormat) chunks(ev *batonv1.GenerateEvent) []any {
	if f.j.tools.forced() {
		return f.forcedChunks(ev)
	}
	var out []any
	text := ev.GetText()
	if f.calls == nil && f.j.tools.parses() {
		f.calls = newToolStream(f.j.tools)
	}
	var calls []parsedCall
	if f.calls != nil {
		text, calls = f.calls.push(text)
	}
	if text != "" || (f.logprobs && len(ev.GetLogprobs()) > 0) {
		d := &chatDelta{}
		if text != "" || f.calls == nil {
			d.Content = &text
		}
		out = append(out, f.chunk(chatChoice{Delta: d, Logprobs: f.convert(ev.GetLogprobs())}))
	}
	out = f.callChunks(out, calls)
	fr := finishReason(ev.GetFinishReason())
	if fr == nil {
		return out
	}
	if f.calls != nil {
		rest, calls := f.calls.finish()
		if rest != "" {
			out = append(out, f.chunk(chatChoice{Delta: &chatDelta{Content: &rest}}))
		}
		out = f.callChunks(out, calls)
		f.logDropped(f.calls.dropped)
		fr = toolCallsFinish(ev.GetFinishReason(), f.sent)
	}
	return append(out, f.chunk(chatChoice{Delta: &chatDelta{}, FinishReason: fr}))
}

// logDropped logs the malformed tool-call text after a reply's calls that
// was neither a call nor content, so that a model's broken second call is
// visible in the log rather than silently gone.
func (f *chatFormat) logDropped(dropped string) {
	if dropped == "" {
		return
	}
	const show = 200
	head := dropped
	if len(head) > show {
		head = head[:show]
	}
	f.h.log.Info("openai chat: dropped a malformed tool call after the calls", "request_id", f.j.req.GetRequestId(),
		"bytes", len(dropped), "text", head)
}

// callChunks appends the chunks of whole calls: for each, one delta with
// index, id, type and name (arguments ""), then one with its arguments.
func (f *chatFormat) callChunks(out []any, calls []parsedCall) []any {
	for _, c := range calls {
		i := f.sent
		f.sent++
		out = append(out,
			f.chunk(chatChoice{Delta: &chatDelta{ToolCalls: []toolCallDelta{{Index: i, ID: callID(f.j.tools.family), Type: "function",
				Function: functionCall{Name: c.Name}}}}}),
			f.chunk(chatChoice{Delta: &chatDelta{ToolCalls: []toolCallDelta{{Index: i, Function: functionCall{Arguments: c.Arguments}}}}}))
	}
	return out
}

func (f *chatFormat) usage(u *usageObject) any {
	c := f.object("chat.completion.chunk", []chatChoice{})
	c.Usage = u
	return c
}

// forcedChunks are the chunks of a reply whose calls are forced: tool_calls
// deltas as the calls are generated.
func (f *chatFormat) forcedChunks(ev *batonv1.GenerateEvent) []any {
	if f.forced == nil {
		f.forced = &forcedStream{ts: f.j.tools}
	}
	var out []any
	// One call's part a chunk, as OpenAI sends them; the event's logprobs
	// ride on the first.
	deltas := f.forced.push(ev.GetText())
	lp := f.convert(ev.GetLogprobs())
	if len(deltas) == 0 && f.logprobs && len(ev.GetLogprobs()) > 0 {
		out = append(out, f.chunk(chatChoice{Delta: &chatDelta{}, Logprobs: lp}))
	}
	for i, d := range deltas {
		c := chatChoice{Delta: &chatDelta{ToolCalls: []toolCallDelta{d}}}
		if i == 0 {
			c.Logprobs = lp
		}
		out = append(out, f.chunk(c))
	}
	if finishReason(ev.GetFinishReason()) == nil {
		return out
	}
	content, deltas, calls, complete := f.forced.finish()
	if content != "" {
		out = append(out, f.chunk(chatChoice{Delta: &chatDelta{Content: &content}}))
	}
	for _, d := range deltas {
		out = append(out, f.chunk(chatChoice{Delta: &chatDelta{ToolCalls: []toolCallDelta{d}}}))
	}
	fr := finishReason(ev.GetFinishReason())
	if calls > 0 && complete {
		fr = toolCallsFinish(ev.GetFinishReason(), calls)
	}
	return append(out, f.chunk(chatChoice{Delta: &chatDelta{}, FinishReason: fr}))
}
