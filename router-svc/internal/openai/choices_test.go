package openai_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/router-svc/internal/openai"
)

// choicesGen answers a request for n choices as a decode worker does: the
// prompt, then tokens of the choices interleaved (choice k's text is "k"
// repeated), each choice's last event with its finish, and the usage of
// the whole request on the stream's last event. It records the n asked.
type choicesGen struct{ asked []uint32 }

func (g *choicesGen) Generate(_ context.Context, req *batonv1.GenerateRequest, send func(*batonv1.GenerateEvent) error) error {
	n := max(int(req.GetSampling().GetN()), 1)
	g.asked = append(g.asked, req.GetSampling().GetN())
	id := req.GetRequestId()
	if err := send(&batonv1.GenerateEvent{RequestId: id, PromptTokenIds: req.GetPromptTokenIds()}); err != nil {
		return err
	}
	const tokens = 3
	for i := range tokens {
		for k := range n {
			if err := send(&batonv1.GenerateEvent{RequestId: id, Index: uint32(k), TokenIds: []uint32{uint32(300 + k)}, Text: fmt.Sprint(k)}); err != nil {
				return err
			}
			if i < tokens-1 {
				continue
			}
			ev := &batonv1.GenerateEvent{RequestId: id, Index: uint32(k), FinishReason: batonv1.FinishReason_FINISH_REASON_LENGTH}
			if k == n-1 {
				p := uint32(len(req.GetPromptTokenIds()))
				ev.Usage = &batonv1.Usage{PromptTokens: p, CompletionTokens: uint32(n * tokens), TotalTokens: p + uint32(n*tokens), CachedTokens: 4}
			}
			if err := send(ev); err != nil {
				return err
			}
		}
	}
	return nil
}

// TestChoices: n = 2 asks the Generator for 2 choices, and the responses
// show both, by index — whole (choices[0] and [1], each its own text and
// finish) and streamed (each chunk one choice, interleaved, each choice
// with its finish chunk) — with usage counting the prompt once and both
// choices' tokens; echo starts every choice with the prompt; n = 1 and an
// absent n send no n (1) to the Generator.
func TestChoices(t *testing.T) {
	eg := newEngineGen(t)
	gen := &choicesGen{}
	srv := apiServer(t, eg, gen, nil)
	for _, c := range []struct{ path, body string }{
		{"/v1/completions", `{"model":"` + modelID + `","prompt":"Once upon a time","max_tokens":3,"n":2}`},
		{"/v1/chat/completions", `{"model":"` + modelID + `","messages":[{"role":"user","content":"Hi"}],"max_tokens":3,"n":2}`},
	} {
		chat := strings.Contains(c.path, "chat")
		text := func(ch map[string]any) string {
			if chat {
				if m, ok := ch["message"].(map[string]any); ok {
					s, _ := m["content"].(string)
					return s
				}
				d, _ := ch["delta"].(map[string]any)
				s, _ := d["content"].(string)
				return s
			}
			s, _ := ch["text"].(string)
			return s
		}
		resp, body := post(t, srv.URL+c.path, c.body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %s", c.path, resp.StatusCode, body)
		}
		obj := object(t, body)
		choices, _ := obj["choices"].([]any)
		if len(choices) != 2 {
			t.Fatalf("%s: %d choices: %s", c.path, len(choices), body)
		}
		for k, ch := range choices {
			m := ch.(map[string]any)
			if m["index"] != float64(k) || text(m) != strings.Repeat(fmt.Sprint(k), 3) || m["finish_reason"] != "length" {
				t.Errorf("%s: choice %d = %v", c.path, k, m)
			}
		}
		u := obj["usage"].(map[string]any)
		if u["completion_tokens"] != float64(6) || u["total_tokens"] != u["prompt_tokens"].(float64)+6 {
			t.Errorf("%s: usage %v", c.path, u)
		}

		stream := c.body[:len(c.body)-1] + `,"stream":true,"stream_options":{"include_usage":true}}`
		resp, body = post(t, srv.URL+c.path, stream)
		evs := sseEvents(t, resp, body)
		got := map[int]string{}
		finished := map[int]int{}
		var order []int
		for _, ev := range evs[:len(evs)-1] {
			chs := ev["choices"].([]any)
			if len(chs) != 1 {
				t.Fatalf("%s: a chunk of %d choices: %v", c.path, len(chs), ev)
			}
			m := chs[0].(map[string]any)
			k := int(m["index"].(float64))
			if finished[k] > 0 {
				t.Errorf("%s: choice %d: a chunk after its finish", c.path, k)
			}
			if m["finish_reason"] != nil {
				finished[k]++
			}
			if s := text(m); s != "" {
				got[k] += s
				order = append(order, k)
			}
		}
		if got[0] != "000" || got[1] != "111" || finished[0] != 1 || finished[1] != 1 {
			t.Errorf("%s streamed: texts %v, finishes %v", c.path, got, finished)
		}
		if fmt.Sprint(order) != "[0 1 0 1 0 1]" {
			t.Errorf("%s streamed: choices in order %v, want interleaved as generated", c.path, order)
		}
		if u := evs[len(evs)-1]["usage"].(map[string]any); u["completion_tokens"] != float64(6) {
			t.Errorf("%s streamed: usage %v", c.path, u)
		}
	}

	// echo: every choice starts with the prompt.
	resp, body := post(t, srv.URL+"/v1/completions", `{"model":"`+modelID+`","prompt":"Once upon a time","max_tokens":3,"n":3,"echo":true}`)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("echo: %d %s", resp.StatusCode, body)
	}
	for k, ch := range object(t, body)["choices"].([]any) {
		if s := ch.(map[string]any)["text"].(string); s != "Once upon a time"+strings.Repeat(fmt.Sprint(k), 3) {
			t.Errorf("echo: choice %d text %q", k, s)
		}
	}
	for _, body := range []string{`{"prompt":"x","max_tokens":3,"n":1}`, `{"prompt":"x","max_tokens":3}`} {
		if resp, b := post(t, srv.URL+"/v1/completions", body); resp.StatusCode != http.StatusOK || len(object(t, b)["choices"].([]any)) != 1 {
			t.Errorf("%s: %d %s", body, resp.StatusCode, b)
		}
	}
	if want := "[2 2 2 2 3 0 0]"; fmt.Sprint(gen.asked) != want {
		t.Errorf("the Generator was asked for n %v, want %s", gen.asked, want)
	}
}

// TestChoicesMaxN: Limits.MaxN (the router's --max-n) bounds n.
func TestChoicesMaxN(t *testing.T) {
	eg := newEngineGen(t)
	srv := apiServer(t, eg, &choicesGen{}, func(o *openai.Options) { o.Limits.MaxN = 4 })
	if resp, b := post(t, srv.URL+"/v1/completions", `{"prompt":"x","max_tokens":3,"n":4}`); resp.StatusCode != http.StatusOK {
		t.Errorf("n = 4: %d %s", resp.StatusCode, b)
	}
	resp, b := post(t, srv.URL+"/v1/completions", `{"prompt":"x","max_tokens":3,"n":5}`)
	checkError(t, resp.StatusCode, object(t, b), 400, "invalid_request_error", "n")
	if !strings.Contains(string(b), "1-4") {
		t.Errorf("n = 5: %s does not say the limit", b)
	}
}
