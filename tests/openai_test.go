//go:build e2e

package tests

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/baton-serving/baton/engine/sample"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"google.golang.org/protobuf/proto"
)

// post sends a JSON body and returns the response (the caller closes it).
func post(ctx context.Context, t testing.TB, url, body string, header ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// sseData reads an SSE stream and returns the data payloads, checking the
// framing: every event is one "data: " line followed by a blank line, and
// the stream ends with [DONE].
func sseData(t testing.TB, r io.Reader) []string {
	t.Helper()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var out []string
	expectBlank := false
	for sc.Scan() {
		line := sc.Text()
		if expectBlank {
			if line != "" {
				t.Fatalf("SSE: want a blank line after each data line, got %q", line)
			}
			expectBlank = false
			continue
		}
		if !strings.HasPrefix(line, "data: ") {
			t.Fatalf("SSE: want a data line, got %q", line)
		}
		out = append(out, strings.TrimPrefix(line, "data: "))
		expectBlank = true
	}
	if len(out) == 0 || out[len(out)-1] != "[DONE]" {
		t.Fatalf("SSE stream does not end with [DONE]: %v", out)
	}
	return out[:len(out)-1]
}

// TestOpenAICompletions: against the real binaries in PD mode, completions
// and chat completions return the golden greedy text, whole and streamed,
// and the streamed deltas concatenate to the whole text.
func TestOpenAICompletions(t *testing.T) {
	g := loadGolden(t)
	c := startCluster(t, workerFlags)
	base := "http://" + c.router.http
	for _, gen := range g.Generations {
		if gen.Prompt == "" {
			continue // the OpenAI API refuses empty prompts
		}
		want := gen.GeneratedText
		n := len(gen.GeneratedIDs)
		t.Run(gen.Prompt, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			body := fmt.Sprintf(`{"model":"stories260K","prompt":%q,"max_tokens":%d,"temperature":0}`, gen.Prompt, n)
			resp := post(ctx, t, base+"/v1/completions", body)
			var whole struct {
				ID      string `json:"id"`
				Object  string `json:"object"`
				Created int64  `json:"created"`
				Model   string `json:"model"`
				Choices []struct {
					Text         string `json:"text"`
					FinishReason string `json:"finish_reason"`
				} `json:"choices"`
				Usage struct{ PromptTokens, CompletionTokens, TotalTokens int } `json:"usage"`
			}
			if resp.StatusCode != 200 {
				b, _ := io.ReadAll(resp.Body)
				t.Fatalf("completions: %s %s", resp.Status, b)
			}
			if err := json.NewDecoder(resp.Body).Decode(&whole); err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if whole.Object != "text_completion" || whole.ID == "" || whole.Created == 0 || len(whole.Choices) != 1 {
				t.Errorf("completion object: %+v", whole)
			}
			if got := whole.Choices[0].Text; got != want {
				t.Errorf("text %q\nwant %q", got, want)
			}
			if whole.Choices[0].FinishReason != "length" {
				t.Errorf("finish_reason %q", whole.Choices[0].FinishReason)
			}

			resp = post(ctx, t, base+"/v1/completions", strings.TrimSuffix(body, "}")+`,"stream":true}`)
			if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
				t.Errorf("stream content type %q", ct)
			}
			var text strings.Builder
			for _, d := range sseData(t, resp.Body) {
				var chunk struct {
					Choices []struct{ Text string } `json:"choices"`
				}
				if err := json.Unmarshal([]byte(d), &chunk); err != nil {
					t.Fatalf("chunk %q: %v", d, err)
				}
				for _, ch := range chunk.Choices {
					text.WriteString(ch.Text)
				}
			}
			resp.Body.Close()
			if text.String() != want {
				t.Errorf("streamed text %q\nwant %q", text.String(), want)
			}

			chat := fmt.Sprintf(`{"model":"stories260K","messages":[{"role":"user","content":%q}],"max_tokens":%d,"temperature":0,"stream":true}`, gen.Prompt, n)
			resp = post(ctx, t, base+"/v1/chat/completions", chat)
			text.Reset()
			for _, d := range sseData(t, resp.Body) {
				var chunk struct {
					Object  string `json:"object"`
					Choices []struct {
						Delta struct{ Content string } `json:"delta"`
					} `json:"choices"`
				}
				if err := json.Unmarshal([]byte(d), &chunk); err != nil {
					t.Fatal(err)
				}
				if chunk.Object != "chat.completion.chunk" {
					t.Errorf("chunk object %q", chunk.Object)
				}
				for _, ch := range chunk.Choices {
					text.WriteString(ch.Delta.Content)
				}
			}
			resp.Body.Close()
			// Without a chat template the user message is the prompt as is.
			if text.String() != want {
				t.Errorf("chat text %q\nwant %q", text.String(), want)
			}
		})
	}
	c.waitIdle(t, 2*time.Second)
}

// TestOpenAIErrors: bad inputs get the right status, error type and param
// from the real router, and nothing is left in flight afterwards.
func TestOpenAIErrors(t *testing.T) {
	c := startCluster(t, workerFlags)
	base := "http://" + c.router.http
	cases := []struct {
		path, body string
		status     int
		typ, param string
	}{
		{"/v1/completions", `{"model":"stories260K","prompt":`, 400, "invalid_request_error", ""},
		{"/v1/completions", `{"model":"stories260K","prompt":"x","temperature":"hot"}`, 400, "invalid_request_error", "temperature"},
		{"/v1/completions", `{"model":"gpt-9","prompt":"x"}`, 404, "invalid_request_error", "model"},
		{"/v1/completions", `{"model":"stories260K","prompt":""}`, 400, "invalid_request_error", "prompt"},
		{"/v1/chat/completions", `{"model":"stories260K","messages":[]}`, 400, "invalid_request_error", "messages"},
		{"/v1/chat/completions", `{"model":"stories260K","messages":[{"role":"wizard","content":"x"}]}`, 400, "invalid_request_error", "messages[0].role"},
		{"/v1/completions", `{"model":"stories260K","prompt":"x","temperature":2.5}`, 400, "invalid_request_error", "temperature"},
		{"/v1/completions", `{"model":"stories260K","prompt":"x","top_p":0}`, 400, "invalid_request_error", "top_p"},
		{"/v1/completions", `{"model":"stories260K","prompt":"x","max_tokens":0}`, 400, "invalid_request_error", "max_tokens"},
		{"/v1/completions", `{"model":"stories260K","prompt":"x","max_tokens":100000}`, 400, "invalid_request_error", "max_tokens"},
		{"/v1/completions", `{"model":"stories260K","prompt":"x","n":17}`, 400, "invalid_request_error", "n"},
		{"/v1/completions", `{"model":"stories260K","prompt":"x","n":0}`, 400, "invalid_request_error", "n"},
		{"/v1/chat/completions", `{"model":"stories260K","messages":[{"role":"user","content":"x"}],"n":-1}`, 400, "invalid_request_error", "n"},
		{"/v1/completions", `{"model":"stories260K","prompt":"x","n":2,"best_of":1}`, 400, "invalid_request_error", "best_of"},
	}
	for _, cs := range cases {
		resp := post(context.Background(), t, base+cs.path, cs.body)
		var e struct {
			Error struct {
				Message, Type string
				Param         *string
			} `json:"error"`
		}
		err := json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		param := ""
		if e.Error.Param != nil {
			param = *e.Error.Param
		}
		if err != nil || resp.StatusCode != cs.status || e.Error.Type != cs.typ || param != cs.param || e.Error.Message == "" {
			t.Errorf("%s %s: %d %+v (param %q), want %d %s param %q", cs.path, cs.body, resp.StatusCode, e.Error, param, cs.status, cs.typ, cs.param)
		}
	}
	// A body over the limit: 413.
	big := `{"model":"stories260K","prompt":"` + strings.Repeat("a", 5<<20) + `"}`
	resp := post(context.Background(), t, base+"/v1/completions", big)
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("oversized body: %d, want 413", resp.StatusCode)
	}
	c.waitIdle(t, 2*time.Second)
}

// TestOpenAIDisconnect: a client that goes away mid-stream leaves no
// in-flight request on any service within 2 s.
func TestOpenAIDisconnect(t *testing.T) {
	c := startCluster(t, workerFlags)
	base := "http://" + c.router.http
	for i := range 5 {
		ctx, cancel := context.WithCancel(context.Background())
		resp := post(ctx, t, base+"/v1/chat/completions",
			`{"model":"stories260K","messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":400,"temperature":0.8,"stream":true}`)
		r := bufio.NewReader(resp.Body)
		for range 3 + i {
			if _, err := r.ReadString('\n'); err != nil {
				t.Fatal(err)
			}
		}
		cancel()
		resp.Body.Close()
	}
	took := c.waitIdle(t, 2*time.Second)
	t.Logf("idle %v after the last disconnect", took)
}

// TestOpenAIChoices: against the real binaries, colocated and PD, a seeded
// completion with n = 3 gives each choice the text of a request of its own
// with the choice's seed (sample.ChoiceSeed), whole and streamed (the
// choices' chunks by index), with usage counting the prompt once; and
// cancelling a streamed n = 4 request mid-way leaves nothing held.
func TestOpenAIChoices(t *testing.T) {
	c := startCluster(t, workerFlags)
	for _, r := range []node{c.router, c.colocated} {
		t.Run(r.name, func(t *testing.T) { openAIChoices(t, c, "http://"+r.http) })
	}
}

func openAIChoices(t *testing.T, c *cluster, base string) {
	type completion struct {
		Choices []struct {
			Text         string  `json:"text"`
			Index        int     `json:"index"`
			FinishReason *string `json:"finish_reason"`
		} `json:"choices"`
		Usage *struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
			TotalTokens      int `json:"total_tokens"`
		} `json:"usage"`
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ask := func(body string) completion {
		t.Helper()
		resp := post(ctx, t, base+"/v1/completions", body)
		defer resp.Body.Close()
		var out completion
		if resp.StatusCode != 200 {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("%s: %s %s", body, resp.Status, b)
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	const n, seed = 3, 7
	body := func(seed int64, extra string) string {
		return fmt.Sprintf(`{"model":"stories260K","prompt":"Once upon a time","max_tokens":16,"temperature":1,"seed":%d%s}`, seed, extra)
	}
	want := make([]string, n)
	for k := range n {
		want[k] = ask(body(int64(sample.ChoiceSeed(seed, k)), "")).Choices[0].Text
	}
	whole := ask(body(seed, fmt.Sprintf(`,"n":%d`, n)))
	if len(whole.Choices) != n {
		t.Fatalf("%d choices, want %d", len(whole.Choices), n)
	}
	for k, ch := range whole.Choices {
		if ch.Index != k || ch.Text != want[k] {
			t.Errorf("choice %d (index %d): %q, alone %q", k, ch.Index, ch.Text, want[k])
		}
	}
	one := ask(body(seed, ""))
	if u := whole.Usage; u == nil || u.PromptTokens != one.Usage.PromptTokens || u.CompletionTokens < n || u.TotalTokens != u.PromptTokens+u.CompletionTokens {
		t.Errorf("usage %+v (one choice: %+v)", u, one.Usage)
	}

	resp := post(ctx, t, base+"/v1/completions", body(seed, fmt.Sprintf(`,"n":%d,"stream":true`, n)))
	texts := make([]string, n)
	finishes := make([]int, n)
	for _, d := range sseData(t, resp.Body) {
		var chunk completion
		if err := json.Unmarshal([]byte(d), &chunk); err != nil {
			t.Fatalf("chunk %q: %v", d, err)
		}
		for _, ch := range chunk.Choices {
			if ch.Index < 0 || ch.Index >= n {
				t.Fatalf("chunk of choice %d", ch.Index)
			}
			texts[ch.Index] += ch.Text
			if ch.FinishReason != nil {
				finishes[ch.Index]++
			}
		}
	}
	resp.Body.Close()
	for k := range n {
		if texts[k] != want[k] || finishes[k] != 1 {
			t.Errorf("streamed choice %d: %q (%d finishes), alone %q", k, texts[k], finishes[k], want[k])
		}
	}

	// A cancelled n = 4 stream releases every choice.
	sctx, scancel := context.WithCancel(ctx)
	resp = post(sctx, t, base+"/v1/completions", `{"model":"stories260K","prompt":"Once upon a time","max_tokens":100,"n":4,"ignore_eos":true,"stream":true}`)
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	scancel()
	resp.Body.Close()
	c.waitIdle(t, 2*time.Second)
}

// TestCompleteChoices: the native Complete with sampling.n = 2 returns both
// choices by index, choice 0 also in the top-level fields, and the
// request's usage (the prompt once).
func TestCompleteChoices(t *testing.T) {
	c := startCluster(t, workerFlags)
	client := c.client(t, c.router)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req := greedy("Once upon a time", 8)
	req.Sampling.IgnoreEos, req.Sampling.N = true, proto.Uint32(2)
	resp, err := client.Complete(ctx, &batonv1.CompleteRequest{Request: req})
	if err != nil {
		t.Fatal(err)
	}
	chs := resp.GetChoices()
	if len(chs) != 2 || chs[0].GetIndex() != 0 || chs[1].GetIndex() != 1 {
		t.Fatalf("choices %v", chs)
	}
	for k, ch := range chs {
		// Greedy: the choices are alike.
		if len(ch.GetTokenIds()) != 8 || ch.GetText() != resp.GetText() || ch.GetFinishReason() != batonv1.FinishReason_FINISH_REASON_LENGTH {
			t.Errorf("choice %d: %v (top-level text %q)", k, ch, resp.GetText())
		}
	}
	if u := resp.GetUsage(); u.GetPromptTokens() != uint32(len(resp.GetPromptTokenIds())) || u.GetCompletionTokens() != 16 {
		t.Errorf("usage %v", u)
	}
	c.waitIdle(t, 2*time.Second)
}
