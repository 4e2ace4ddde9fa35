package openai_test

// Logprobs through the real router in front of a decode worker running the
// real engine, which, as a decode worker does, sends token ids and
// log-probabilities without text: the router adds the text for the native
// API and the OpenAI layer renders it.

import (
	"io"
	"strings"
	"testing"
	"unicode/utf8"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// The native API's events carry each token's text and bytes beside its id:
// the bytes of the generated tokens join to the text exactly, and every
// alternative is named.
func TestRouterNativeTokenText(t *testing.T) {
	tr := startRouter(t)
	c := client(tr)
	for _, g := range goldens(t)[:2] {
		req := &batonv1.GenerateRequest{Prompt: g.Prompt, Sampling: &batonv1.SamplingParams{Temperature: proto.Float32(0),
			MaxNewTokens: uint32(len(g.GeneratedIDs)), Logprobs: true, TopLogprobs: 3}}
		resp, err := c.Complete(tr.authed(), &batonv1.CompleteRequest{Request: req})
		if err != nil {
			t.Fatal(err)
		}
		var joined []byte
		for i, lp := range resp.GetLogprobs() {
			if lp.GetTokenId() != resp.GetTokenIds()[i] || lp.GetToken() == "" || len(lp.GetBytes()) == 0 || !utf8.ValidString(lp.GetToken()) {
				t.Errorf("logprob %d: id %d token %q bytes %q", i, lp.GetTokenId(), lp.GetToken(), lp.GetBytes())
			}
			joined = append(joined, lp.GetBytes()...)
			if len(lp.GetTopLogprobs()) != 3 {
				t.Errorf("logprob %d: %d alternatives", i, len(lp.GetTopLogprobs()))
			}
			for _, top := range lp.GetTopLogprobs() {
				if top.GetToken() == "" {
					t.Errorf("logprob %d: alternative %d has no text", i, top.GetTokenId())
				}
			}
		}
		if string(joined) != resp.GetText() || resp.GetText() != g.Text {
			t.Errorf("bytes join to %q, text %q, golden %q", joined, resp.GetText(), g.Text)
		}

		// The stream's events too.
		stream, err := c.Generate(tr.authed(), req)
		if err != nil {
			t.Fatal(err)
		}
		joined = joined[:0]
		var text strings.Builder
		for {
			resp, err := stream.Recv()
			ev := resp.GetEvent()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			text.WriteString(ev.GetText())
			for _, lp := range ev.GetLogprobs() {
				joined = append(joined, lp.GetBytes()...)
			}
		}
		if string(joined) != text.String() {
			t.Errorf("streamed bytes join to %q, text %q", joined, text.String())
		}
	}
	tr.idle(t)
}

// Through the router the OpenAI formats show the token text: chat's bytes
// join to the content and completions' tokens to the text, with
// text_offset counting from the prompt's start and top_logprobs keyed by
// text (the greedy token's own logprob among them).
func TestRouterOpenAILogprobs(t *testing.T) {
	tr := startRouter(t)
	auth := []string{"Authorization", "Bearer " + testKey}
	g := goldens(t)[1]
	for _, stream := range []bool{false, true} {
		body := mustJSON(map[string]any{"prompt": g.Prompt, "max_tokens": 12, "temperature": 0, "logprobs": 3, "stream": stream})
		resp, b := post(t, tr.http+"/v1/completions", body, auth...)
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		var objs []map[string]any
		if stream {
			objs = sseEvents(t, resp, b)
		} else {
			objs = []map[string]any{object(t, b)}
		}
		var text, joined strings.Builder
		n := 0
		for _, o := range objs {
			ch := o["choices"].([]any)
			if len(ch) == 0 {
				continue
			}
			c := ch[0].(map[string]any)
			text.WriteString(c["text"].(string))
			lp, _ := c["logprobs"].(map[string]any)
			if lp == nil {
				continue
			}
			tokens, tlp, top, off := lp["tokens"].([]any), lp["token_logprobs"].([]any), lp["top_logprobs"].([]any), lp["text_offset"].([]any)
			for i, tk := range tokens {
				want := utf8.RuneCountInString(g.Prompt) + utf8.RuneCountInString(joined.String())
				if int(off[i].(float64)) != want {
					t.Errorf("stream %v: text_offset of %q = %v, want %d", stream, tk, off[i], want)
				}
				joined.WriteString(tk.(string))
				m := top[i].(map[string]any)
				if m[tk.(string)] != tlp[i] || len(m) < 2 {
					t.Errorf("stream %v: top_logprobs %v for %q (%v)", stream, m, tk, tlp[i])
				}
				n++
			}
		}
		if n != 12 || joined.String() != text.String() || text.String() == "" {
			t.Errorf("stream %v: %d tokens join to %q, text %q", stream, n, joined.String(), text.String())
		}
	}

	body := mustJSON(map[string]any{"max_tokens": 12, "temperature": 0, "logprobs": true, "top_logprobs": 2,
		"messages": []any{map[string]any{"role": "user", "content": g.Prompt}}})
	resp, b := post(t, tr.http+"/v1/chat/completions", body, auth...)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	c := only(t, "choices", object(t, b)["choices"])
	var joined []byte
	var tokens strings.Builder
	for _, e := range c["logprobs"].(map[string]any)["content"].([]any) {
		e := e.(map[string]any)
		tokens.WriteString(e["token"].(string))
		for _, v := range e["bytes"].([]any) {
			joined = append(joined, byte(v.(float64)))
		}
	}
	content := c["message"].(map[string]any)["content"].(string)
	if content == "" || string(joined) != content || tokens.String() != content {
		t.Errorf("bytes join to %q, tokens to %q, content %q", joined, tokens.String(), content)
	}
	tr.idle(t)
}

// A request asking for the prompt's logprobs (echo) fails rather than
// answer without them when the workers send none: this decode worker
// predates SamplingParams.prompt_logprobs.
func TestRouterPromptLogprobsMissing(t *testing.T) {
	tr := startRouter(t)
	c := client(tr)
	req := &batonv1.GenerateRequest{Prompt: "Once upon a time", Sampling: &batonv1.SamplingParams{Temperature: proto.Float32(0),
		MaxNewTokens: 4, Logprobs: true, PromptLogprobs: true}}
	_, err := c.Complete(tr.authed(), &batonv1.CompleteRequest{Request: req})
	if status.Code(err) != codes.Unimplemented || !strings.Contains(err.Error(), "prompt's logprobs") {
		t.Errorf("Complete = %v, want UNIMPLEMENTED naming the prompt's logprobs", err)
	}
	stream, err := c.Generate(tr.authed(), req)
	if err == nil {
		var resp *batonv1.GenerateResponse
		for resp, err = stream.Recv(); err == nil; resp, err = stream.Recv() {
			if len(resp.GetEvent().GetTokenIds()) > 0 {
				t.Errorf("a token reached the client: %v", resp)
			}
		}
	}
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("Generate = %v, want UNIMPLEMENTED", err)
	}
	tr.idle(t)
}
