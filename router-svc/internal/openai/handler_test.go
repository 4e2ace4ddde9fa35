package openai_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/router-svc/internal/openai"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const modelID = "stories260K"

// apiServer serves the API over gen on a real HTTP server.
func apiServer(t *testing.T, eg *engineGen, gen openai.Generator, edit func(*openai.Options)) *httptest.Server {
	t.Helper()
	if gen == nil {
		gen = eg
	}
	opts := openai.Options{
		Model: openai.Model{ID: modelID, Created: 1700000000, Architecture: eg.cfg.Architecture,
			Fingerprint: eg.m.Fingerprint(), ContextLength: eg.cfg.ContextLength, Tokenizer: eg.tok},
		Limits: openai.Limits{MaxBodyBytes: 64 << 10, DefaultMaxTokens: 32},
	}
	if edit != nil {
		edit(&opts)
	}
	h, err := openai.New(gen, opts)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	h.Register(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

func post(t *testing.T, url, body string, header ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
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
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

func object(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("not a JSON object: %v: %s", err, b)
	}
	return m
}

// keys checks that m has exactly the fields want (OpenAI's API reference
// field lists; Baton adds none to these objects).
func keys(t *testing.T, what string, m any, want ...string) map[string]any {
	t.Helper()
	obj, ok := m.(map[string]any)
	if !ok {
		t.Fatalf("%s: %T, want an object", what, m)
	}
	var got []string
	for k := range obj {
		got = append(got, k)
	}
	sort.Strings(got)
	sort.Strings(want)
	if !slices.Equal(got, want) {
		t.Errorf("%s fields = %v, want %v", what, got, want)
	}
	return obj
}

func only(t *testing.T, what string, v any) map[string]any {
	t.Helper()
	list, ok := v.([]any)
	if !ok || len(list) != 1 {
		t.Fatalf("%s = %v, want one element", what, v)
	}
	m, ok := list[0].(map[string]any)
	if !ok {
		t.Fatalf("%s[0] = %T", what, list[0])
	}
	return m
}

var (
	completionFields      = []string{"id", "object", "created", "model", "system_fingerprint", "choices", "usage"}
	completionChoice      = []string{"text", "index", "logprobs", "finish_reason"}
	chatChoice            = []string{"index", "message", "logprobs", "finish_reason"}
	chatMessageFields     = []string{"role", "content", "refusal"}
	chunkFields           = []string{"id", "object", "created", "model", "system_fingerprint", "choices"}
	chatChunkChoice       = []string{"index", "delta", "logprobs", "finish_reason"}
	usageFields           = []string{"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details"}
	completionLogprobKeys = []string{"tokens", "token_logprobs", "top_logprobs", "text_offset"}
)

// checkHeader checks the fields every completion object and chunk shares.
func checkHeader(t *testing.T, obj map[string]any, object, idPrefix string) {
	t.Helper()
	if obj["object"] != object {
		t.Errorf("object = %v, want %s", obj["object"], object)
	}
	if id, _ := obj["id"].(string); !strings.HasPrefix(id, idPrefix) || len(id) <= len(idPrefix) {
		t.Errorf("id = %v, want %s…", obj["id"], idPrefix)
	}
	if c, ok := obj["created"].(float64); !ok || c <= 0 || c != math.Trunc(c) {
		t.Errorf("created = %v, want an integer Unix time", obj["created"])
	}
	if obj["model"] != modelID {
		t.Errorf("model = %v", obj["model"])
	}
	if fp, _ := obj["system_fingerprint"].(string); !strings.HasPrefix(fp, "fp_") {
		t.Errorf("system_fingerprint = %v", obj["system_fingerprint"])
	}
}

func checkUsage(t *testing.T, v any, prompt, completion int) {
	t.Helper()
	u := keys(t, "usage", v, usageFields...)
	if u["prompt_tokens"] != float64(prompt) || u["completion_tokens"] != float64(completion) || u["total_tokens"] != float64(prompt+completion) {
		t.Errorf("usage = %v, want %d + %d", u, prompt, completion)
	}
}

// sseEvents splits a complete event stream, checking its framing exactly:
// every event is one "data: " line followed by a blank line, and the last is
// "data: [DONE]". It returns the JSON of the events before [DONE].
func sseEvents(t *testing.T, resp *http.Response, body []byte) []map[string]any {
	t.Helper()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type = %q, want text/event-stream; body %s", ct, body)
	}
	s := string(body)
	if !strings.HasSuffix(s, "\n\n") {
		t.Fatalf("stream does not end with a blank line: %q", s)
	}
	blocks := strings.Split(strings.TrimSuffix(s, "\n\n"), "\n\n")
	if last := blocks[len(blocks)-1]; last != "data: [DONE]" {
		t.Fatalf("last event = %q, want data: [DONE]", last)
	}
	var out []map[string]any
	for _, b := range blocks[:len(blocks)-1] {
		data, ok := strings.CutPrefix(b, "data: ")
		if !ok || strings.Contains(data, "\n") || data == "" {
			t.Fatalf("malformed event %q", b)
		}
		out = append(out, object(t, []byte(data)))
	}
	return out
}

func TestCompletionsGolden(t *testing.T) {
	eg := newEngineGen(t)
	srv := apiServer(t, eg, nil, nil)
	for _, g := range goldens(t) {
		if g.Prompt == "" {
			continue // the API refuses an empty prompt
		}
		t.Run(g.Prompt, func(t *testing.T) {
			body := mustJSON(map[string]any{"model": modelID, "prompt": g.Prompt, "max_tokens": len(g.GeneratedIDs), "temperature": 0})
			resp, b := post(t, srv.URL+"/v1/completions", body)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, b)
			}
			obj := keys(t, "completion", object(t, b), completionFields...)
			checkHeader(t, obj, "text_completion", "cmpl-")
			c := keys(t, "choice", only(t, "choices", obj["choices"]), completionChoice...)
			if c["text"] != g.Text {
				t.Errorf("text = %q\nwant   %q", c["text"], g.Text)
			}
			if c["finish_reason"] != "length" || c["index"] != 0.0 || c["logprobs"] != nil {
				t.Errorf("choice = %v", c)
			}
			checkUsage(t, obj["usage"], len(g.PromptIDs), len(g.GeneratedIDs))
			if id := resp.Header.Get("X-Request-Id"); id == "" || obj["id"] != "cmpl-"+id {
				t.Errorf("X-Request-Id %q, id %v", id, obj["id"])
			}
		})
	}
}

func TestChatGolden(t *testing.T) {
	eg := newEngineGen(t)
	srv := apiServer(t, eg, nil, nil)
	for _, g := range goldens(t) {
		if g.Prompt == "" {
			continue
		}
		t.Run(g.Prompt, func(t *testing.T) {
			// The model has no chat template: the plain default renders one
			// user message as its text, so the golden prompt ids result.
			body := mustJSON(map[string]any{"model": modelID, "max_completion_tokens": len(g.GeneratedIDs), "temperature": 0,
				"messages": []any{map[string]any{"role": "user", "content": g.Prompt}}})
			resp, b := post(t, srv.URL+"/v1/chat/completions", body)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, b)
			}
			obj := keys(t, "chat completion", object(t, b), completionFields...)
			checkHeader(t, obj, "chat.completion", "chatcmpl-")
			c := keys(t, "choice", only(t, "choices", obj["choices"]), chatChoice...)
			msg := keys(t, "message", c["message"], chatMessageFields...)
			if msg["role"] != "assistant" || msg["refusal"] != nil || msg["content"] != g.Text {
				t.Errorf("message = %v\nwant content %q", msg, g.Text)
			}
			if c["finish_reason"] != "length" || c["logprobs"] != nil {
				t.Errorf("choice = %v", c)
			}
			checkUsage(t, obj["usage"], len(g.PromptIDs), len(g.GeneratedIDs))
		})
	}
}

func TestCompletionsStream(t *testing.T) {
	eg := newEngineGen(t)
	srv := apiServer(t, eg, nil, nil)
	g := goldens(t)[0]
	for _, usage := range []bool{false, true} {
		t.Run(fmt.Sprintf("include_usage=%v", usage), func(t *testing.T) {
			req := map[string]any{"model": modelID, "prompt": g.Prompt, "max_tokens": len(g.GeneratedIDs), "temperature": 0, "stream": true}
			if usage {
				req["stream_options"] = map[string]any{"include_usage": true}
			}
			resp, b := post(t, srv.URL+"/v1/completions", mustJSON(req))
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, b)
			}
			events := sseEvents(t, resp, b)
			fields := chunkFields
			if usage {
				fields = append(slices.Clone(chunkFields), "usage")
			}
			var text strings.Builder
			var finish []any
			n := len(events)
			if usage {
				n-- // the usage chunk
			}
			for i, ev := range events[:n] {
				obj := keys(t, fmt.Sprintf("chunk %d", i), ev, fields...)
				checkHeader(t, obj, "text_completion", "cmpl-")
				if usage && obj["usage"] != nil {
					t.Errorf("chunk %d usage = %v, want null", i, obj["usage"])
				}
				c := keys(t, "choice", only(t, "choices", obj["choices"]), completionChoice...)
				text.WriteString(c["text"].(string))
				if c["finish_reason"] != nil {
					finish = append(finish, c["finish_reason"])
				}
			}
			if text.String() != g.Text {
				t.Errorf("streamed text = %q\nwant            %q", text.String(), g.Text)
			}
			if len(finish) != 1 || finish[0] != "length" {
				t.Errorf("finish reasons %v, want one length", finish)
			}
			if last := events[n-1]["choices"].([]any)[0].(map[string]any); last["finish_reason"] != "length" {
				t.Errorf("the finish reason is not in the last chunk: %v", last)
			}
			if usage {
				obj := keys(t, "usage chunk", events[n], fields...)
				if ch, ok := obj["choices"].([]any); !ok || len(ch) != 0 {
					t.Errorf("usage chunk choices = %v, want []", obj["choices"])
				}
				checkUsage(t, obj["usage"], len(g.PromptIDs), len(g.GeneratedIDs))
			}
		})
	}
}

func TestChatStream(t *testing.T) {
	eg := newEngineGen(t)
	srv := apiServer(t, eg, nil, nil)
	g := goldens(t)[1]
	body := mustJSON(map[string]any{"model": modelID, "max_tokens": len(g.GeneratedIDs), "temperature": 0, "stream": true,
		"messages": []any{map[string]any{"role": "user", "content": g.Prompt}}})
	resp, b := post(t, srv.URL+"/v1/chat/completions", body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	events := sseEvents(t, resp, b)
	if len(events) < 3 {
		t.Fatalf("%d events", len(events))
	}
	var text strings.Builder
	for i, ev := range events {
		obj := keys(t, fmt.Sprintf("chunk %d", i), ev, chunkFields...)
		checkHeader(t, obj, "chat.completion.chunk", "chatcmpl-")
		c := keys(t, "choice", only(t, "choices", obj["choices"]), chatChunkChoice...)
		delta := c["delta"].(map[string]any)
		switch i {
		case 0:
			keys(t, "first delta", delta, "role", "content")
			if delta["role"] != "assistant" || delta["content"] != "" {
				t.Errorf("first delta = %v", delta)
			}
		case len(events) - 1:
			keys(t, "last delta", delta)
			if c["finish_reason"] != "length" {
				t.Errorf("last chunk = %v", c)
			}
		default:
			keys(t, "delta", delta, "content")
			if c["finish_reason"] != nil {
				t.Errorf("chunk %d finish_reason = %v", i, c["finish_reason"])
			}
			text.WriteString(delta["content"].(string))
		}
	}
	if text.String() != g.Text {
		t.Errorf("streamed text = %q\nwant            %q", text.String(), g.Text)
	}
	// Streamed and whole answers agree.
	body = mustJSON(map[string]any{"max_tokens": len(g.GeneratedIDs), "temperature": 0,
		"messages": []any{map[string]any{"role": "user", "content": g.Prompt}}})
	_, b = post(t, srv.URL+"/v1/chat/completions", body)
	var whole struct {
		Choices []struct{ Message struct{ Content string } }
	}
	if err := json.Unmarshal(b, &whole); err != nil || len(whole.Choices) != 1 || whole.Choices[0].Message.Content != text.String() {
		t.Errorf("non-streamed %s, streamed %q", b, text.String())
	}
}

// TestStop checks stop strings, streamed and not: the text ends before the
// stop string, and the streamed deltas never show any of it.
func TestStop(t *testing.T) {
	eg := newEngineGen(t)
	srv := apiServer(t, eg, nil, nil)
	g := goldens(t)[0]
	want, _, ok := strings.Cut(g.Text, "Lily")
	if !ok {
		t.Fatal("golden text lacks the stop string")
	}
	for _, stop := range []any{"Lily", []string{"zebra", "Lily"}} {
		req := map[string]any{"prompt": g.Prompt, "max_tokens": 64, "temperature": 0, "stop": stop}
		_, b := post(t, srv.URL+"/v1/completions", mustJSON(req))
		var whole struct {
			Choices []struct {
				Text         string
				FinishReason string `json:"finish_reason"`
			}
			Usage struct {
				CompletionTokens int `json:"completion_tokens"`
			}
		}
		if err := json.Unmarshal(b, &whole); err != nil || len(whole.Choices) != 1 {
			t.Fatalf("%s: %v", b, err)
		}
		if c := whole.Choices[0]; c.Text != want || c.FinishReason != "stop" {
			t.Errorf("stop %v: %q %s, want %q stop", stop, c.Text, c.FinishReason, want)
		}
		if whole.Usage.CompletionTokens >= 64 || whole.Usage.CompletionTokens == 0 {
			t.Errorf("completion_tokens = %d", whole.Usage.CompletionTokens)
		}
		req["stream"] = true
		resp, b := post(t, srv.URL+"/v1/completions", mustJSON(req))
		var text strings.Builder
		for _, ev := range sseEvents(t, resp, b) {
			text.WriteString(ev["choices"].([]any)[0].(map[string]any)["text"].(string))
		}
		if text.String() != want {
			t.Errorf("stop %v streamed %q, want %q", stop, text.String(), want)
		}
	}
}

func TestLogprobs(t *testing.T) {
	eg := newEngineGen(t)
	srv := apiServer(t, eg, nil, nil)
	g := goldens(t)[0]
	const firstLogprob = -0.031753066927194595 // golden steps[0]: "," after "Once upon a time"

	_, b := post(t, srv.URL+"/v1/completions", mustJSON(map[string]any{"prompt": g.Prompt, "max_tokens": 8, "temperature": 0, "logprobs": 2}))
	obj := object(t, b)
	c := only(t, "choices", obj["choices"])
	lp := keys(t, "logprobs", c["logprobs"], completionLogprobKeys...)
	tokens, _ := lp["tokens"].([]any)
	tlp, _ := lp["token_logprobs"].([]any)
	top, _ := lp["top_logprobs"].([]any)
	off, _ := lp["text_offset"].([]any)
	if len(tokens) != 8 || len(tlp) != 8 || len(top) != 8 || len(off) != 8 {
		t.Fatalf("logprobs = %v", lp)
	}
	if tokens[0] != "," || math.Abs(tlp[0].(float64)-firstLogprob) > 1e-4 {
		t.Errorf("first token %v %v, want , %v", tokens[0], tlp[0], firstLogprob)
	}
	if m := top[0].(map[string]any); len(m) != 2 || m[","] == nil {
		t.Errorf("top_logprobs[0] = %v", m)
	}
	var joined strings.Builder
	for i, tk := range tokens {
		// OpenAI's offsets count from the prompt's start (ASCII here).
		if int(off[i].(float64)) != len(g.Prompt)+joined.Len() {
			t.Errorf("text_offset[%d] = %v, want %d", i, off[i], len(g.Prompt)+joined.Len())
		}
		joined.WriteString(tk.(string))
	}
	if joined.String() != c["text"] {
		t.Errorf("tokens join to %q, text %q", joined.String(), c["text"])
	}

	body := mustJSON(map[string]any{"max_tokens": 4, "temperature": 0, "logprobs": true, "top_logprobs": 3, "stream": true,
		"messages": []any{map[string]any{"role": "user", "content": g.Prompt}}})
	resp, b := post(t, srv.URL+"/v1/chat/completions", body)
	var n int
	for _, ev := range sseEvents(t, resp, b) {
		c := ev["choices"].([]any)[0].(map[string]any)
		if c["logprobs"] == nil {
			continue
		}
		lp := keys(t, "chat logprobs", c["logprobs"], "content", "refusal")
		for _, e := range lp["content"].([]any) {
			e := keys(t, "token logprob", e, "token", "logprob", "bytes", "top_logprobs")
			if n == 0 && (e["token"] != "," || math.Abs(e["logprob"].(float64)-firstLogprob) > 1e-4) {
				t.Errorf("first = %v", e)
			}
			if tl := e["top_logprobs"].([]any); len(tl) != 3 {
				t.Errorf("top_logprobs = %v", tl)
			} else {
				keys(t, "top logprob", tl[0], "token", "logprob", "bytes")
			}
			if by := e["bytes"].([]any); len(by) != len(e["token"].(string)) {
				t.Errorf("bytes %v for %q", by, e["token"])
			}
			n++
		}
	}
	if n != 4 {
		t.Errorf("%d token logprobs streamed, want 4", n)
	}
}

func TestModels(t *testing.T) {
	eg := newEngineGen(t)
	srv := apiServer(t, eg, nil, nil)
	get := func(path string) (int, map[string]any) {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, object(t, b)
	}
	code, list := get("/v1/models")
	if code != 200 || list["object"] != "list" {
		t.Fatalf("%d %v", code, list)
	}
	m := only(t, "data", list["data"])
	if m["id"] != modelID || m["object"] != "model" || m["created"] != 1700000000.0 || m["owned_by"] != "baton" || m["context_length"] != 128.0 {
		t.Errorf("model = %v", m)
	}
	if code, m := get("/v1/models/" + modelID); code != 200 || m["id"] != modelID {
		t.Errorf("%d %v", code, m)
	}
	code, e := get("/v1/models/gpt-9")
	checkError(t, code, e, http.StatusNotFound, "invalid_request_error", "model")
}

func checkError(t *testing.T, code int, body map[string]any, wantStatus int, wantType string, wantParam any) map[string]any {
	t.Helper()
	e := keys(t, "error body", body, "error")
	obj := keys(t, "error", e["error"], "message", "type", "param", "code")
	if code != wantStatus || obj["type"] != wantType || obj["param"] != wantParam {
		t.Errorf("got %d type=%v param=%v (%v); want %d %s %v", code, obj["type"], obj["param"], obj["message"], wantStatus, wantType, wantParam)
	}
	if msg, _ := obj["message"].(string); msg == "" {
		t.Error("empty message")
	}
	return obj
}

func TestBadRequests(t *testing.T) {
	eg := newEngineGen(t)
	srv := apiServer(t, eg, nil, nil)
	const cmpl, chat = "/v1/completions", "/v1/chat/completions"
	long := strings.Repeat("Once upon a time ", 40)
	user := `"messages":[{"role":"user","content":"Once upon a time"}]`
	cases := []struct {
		name, path, body string
		status           int
		param            any // nil: JSON null
		code             any
	}{
		{"malformed JSON", cmpl, `{"prompt":`, 400, nil, nil},
		{"malformed JSON chat", chat, `{"messages":[}`, 400, nil, nil},
		{"trailing garbage", cmpl, `{"prompt":"x"} x`, 400, nil, nil},
		{"empty body", cmpl, ``, 400, nil, nil},
		{"not an object", cmpl, `["x"]`, 400, nil, nil},
		{"temperature wrong type", cmpl, `{"prompt":"x","temperature":"hot"}`, 400, "temperature", nil},
		{"max_tokens not an integer", cmpl, `{"prompt":"x","max_tokens":1.5}`, 400, "max_tokens", nil},
		{"stream wrong type", chat, `{` + user + `,"stream":"yes"}`, 400, "stream", nil},
		{"messages wrong type", chat, `{"messages":"hi"}`, 400, "messages", nil},
		{"role wrong type", chat, `{"messages":[{"role":"user","content":"a"},{"role":5,"content":"b"}]}`, 400, "messages[1].role", nil},
		{"content wrong type", chat, `{"messages":[{"role":"user","content":5}]}`, 400, "messages[0].content", nil},
		{"prompt wrong type", cmpl, `{"prompt":{"a":1}}`, 400, "prompt", nil},
		{"stop wrong type", cmpl, `{"prompt":"x","stop":5}`, 400, "stop", nil},
		{"unknown model", cmpl, `{"model":"gpt-9","prompt":"x"}`, 404, "model", "model_not_found"},
		{"unknown model chat", chat, `{"model":"gpt-9",` + user + `}`, 404, "model", "model_not_found"},
		{"missing prompt", cmpl, `{"max_tokens":4}`, 400, "prompt", nil},
		{"empty prompt", cmpl, `{"prompt":""}`, 400, "prompt", nil},
		{"empty prompt list", cmpl, `{"prompt":[]}`, 400, "prompt", nil},
		{"batched prompts", cmpl, `{"prompt":["a","b"]}`, 400, "prompt", nil},
		{"token id beyond vocabulary", cmpl, `{"prompt":[1,99999]}`, 400, "prompt", nil},
		{"missing messages", chat, `{"max_tokens":4}`, 400, "messages", nil},
		{"empty messages", chat, `{"messages":[]}`, 400, "messages", nil},
		{"unknown role", chat, `{"messages":[{"role":"wizard","content":"x"}]}`, 400, "messages[0].role", nil},
		{"missing role", chat, `{"messages":[{"content":"x"}]}`, 400, "messages[0].role", nil},
		{"user without content", chat, `{"messages":[{"role":"user"}]}`, 400, "messages[0].content", nil},
		{"image part", chat, `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, 400, "messages[0].content[0].type", nil},
		{"temperature below 0", cmpl, `{"prompt":"x","temperature":-0.1}`, 400, "temperature", nil},
		{"temperature above 2", chat, `{` + user + `,"temperature":2.5}`, 400, "temperature", nil},
		{"top_p 0", cmpl, `{"prompt":"x","top_p":0}`, 400, "top_p", nil},
		{"top_p above 1", chat, `{` + user + `,"top_p":1.5}`, 400, "top_p", nil},
		{"top_k below -1", cmpl, `{"prompt":"x","top_k":-2}`, 400, "top_k", nil},
		{"min_p above 1", cmpl, `{"prompt":"x","min_p":1.5}`, 400, "min_p", nil},
		{"repetition_penalty 0", cmpl, `{"prompt":"x","repetition_penalty":0}`, 400, "repetition_penalty", nil},
		{"presence_penalty", cmpl, `{"prompt":"x","presence_penalty":3}`, 400, "presence_penalty", nil},
		{"frequency_penalty", chat, `{` + user + `,"frequency_penalty":-2.5}`, 400, "frequency_penalty", nil},
		{"max_tokens 0", cmpl, `{"prompt":"x","max_tokens":0}`, 400, "max_tokens", nil},
		{"max_tokens negative", chat, `{` + user + `,"max_tokens":-1}`, 400, "max_tokens", nil},
		{"max_completion_tokens 0", chat, `{` + user + `,"max_completion_tokens":0}`, 400, "max_completion_tokens", nil},
		{"max_tokens beyond the context", cmpl, `{"prompt":"x","max_tokens":500}`, 400, "max_tokens", "context_length_exceeded"},
		{"prompt + max_tokens beyond the context", cmpl, `{"prompt":"Once upon a time","max_tokens":124}`, 400, "prompt", "context_length_exceeded"},
		{"messages + max_tokens beyond the context", chat, `{` + user + `,"max_tokens":124}`, 400, "messages", "context_length_exceeded"},
		{"prompt fills the context", cmpl, `{"prompt":"` + long + `"}`, 400, "prompt", "context_length_exceeded"},
		{"invalid UTF-8 prompt", cmpl, "{\"prompt\":\"a\xffb\"}", 400, "prompt", nil},
		{"invalid UTF-8 content", chat, "{\"messages\":[{\"role\":\"user\",\"content\":\"\xc3\"}]}", 400, "messages[0].content", nil},
		{"n 0", chat, `{` + user + `,"n":0}`, 400, "n", nil},
		{"n 0 completions", cmpl, `{"prompt":"x","n":0}`, 400, "n", nil},
		{"n negative", cmpl, `{"prompt":"x","n":-1}`, 400, "n", nil},
		{"n above --max-n", chat, `{` + user + `,"n":17}`, 400, "n", nil},
		{"best_of", cmpl, `{"prompt":"x","best_of":3}`, 400, "best_of", nil},
		{"best_of with n", cmpl, `{"prompt":"x","n":2,"best_of":1}`, 400, "best_of", nil},
		{"stream_options without stream", cmpl, `{"prompt":"x","stream_options":{"include_usage":true}}`, 400, "stream_options", nil},
		{"too many stops", cmpl, `{"prompt":"x","stop":["a","b","c","d","e","f","g","h","i","j","k","l","m","n","o","p","q"]}`, 400, "stop", nil},
		{"empty stop", cmpl, `{"prompt":"x","stop":[""]}`, 400, "stop", nil},
		{"logprobs beyond 20", cmpl, `{"prompt":"x","logprobs":21}`, 400, "logprobs", nil},
		{"chat logprobs wrong type", chat, `{` + user + `,"logprobs":5}`, 400, "logprobs", nil},
		{"top_logprobs without logprobs", chat, `{` + user + `,"top_logprobs":2}`, 400, "top_logprobs", nil},
		{"logit_bias beyond 100", cmpl, `{"prompt":"x","logit_bias":{"1":500}}`, 400, "logit_bias", nil},
		{"tools", chat, `{` + user + `,"tools":[{"type":"retrieval"}]}`, 400, "tools[0].type", nil},
		{"response_format unknown type", chat, `{` + user + `,"response_format":{"type":"xml"}}`, 400, "response_format.type", nil},
		{"body over the limit", cmpl, `{"prompt":"` + strings.Repeat("a", 70<<10) + `"}`, 413, nil, "request_too_large"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, b := post(t, srv.URL+c.path, c.body)
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type = %q", ct)
			}
			obj := checkError(t, resp.StatusCode, object(t, b), c.status, "invalid_request_error", c.param)
			if obj["code"] != c.code {
				t.Errorf("code = %v, want %v", obj["code"], c.code)
			}
		})
	}
	if n := eg.inFlight(); n != 0 {
		t.Errorf("%d requests still in flight", n)
	}

	resp, err := http.Get(srv.URL + cmpl)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	checkError(t, resp.StatusCode, object(t, b), http.StatusMethodNotAllowed, "invalid_request_error", nil)
	if resp.Header.Get("Allow") != http.MethodPost {
		t.Errorf("Allow = %q", resp.Header.Get("Allow"))
	}
	resp, b = post(t, srv.URL+cmpl, `{"prompt":"x"}`, "X-Request-Id", "a b")
	checkError(t, resp.StatusCode, object(t, b), 400, "invalid_request_error", "X-Request-Id")
}

// TestGeneratorErrors checks the mapping of every gRPC code a Generator
// returns, before any output and after a stream has started.
func TestGeneratorErrors(t *testing.T) {
	eg := newEngineGen(t)
	cases := []struct {
		err        error
		status     int
		typ, param string
		retryAfter bool
	}{
		{status.Error(codes.InvalidArgument, "sampling.temperature = 3: want a value in [0, 2]"), 400, "invalid_request_error", "temperature", false},
		{status.Error(codes.InvalidArgument, "prompt_token_ids[3] = 9999: want an id below 512"), 400, "invalid_request_error", "prompt", false},
		{status.Error(codes.InvalidArgument, "sampling.max_new_tokens: 5 tokens of prompt + 500 new tokens exceed"), 400, "invalid_request_error", "max_tokens", false},
		{status.Error(codes.NotFound, `model "x" is not served here`), 404, "invalid_request_error", "model", false},
		{status.Error(codes.AlreadyExists, `request_id "r1" is already in flight`), 409, "invalid_request_error", "X-Request-Id", false},
		{status.Error(codes.ResourceExhausted, "too many requests in flight"), 429, "rate_limit_error", "", true},
		{status.Error(codes.Unauthenticated, "missing key"), 401, "invalid_request_error", "", false},
		{status.Error(codes.PermissionDenied, "no"), 403, "permission_error", "", false},
		{status.Error(codes.FailedPrecondition, "decode 1.2.3.4:5: fingerprint mismatch"), 400, "invalid_request_error", "", false},
		{status.Error(codes.Unavailable, "no ready decode worker"), 503, "server_error", "", true},
		{status.Error(codes.DeadlineExceeded, "deadline exceeded"), 504, "server_error", "", false},
		{status.Error(codes.Unimplemented, "decode: Generate not implemented"), 501, "server_error", "", false},
		{status.Error(codes.Internal, "boom"), 500, "server_error", "", false},
		{status.Error(codes.Aborted, "aborted by an Abort call"), 409, "invalid_request_error", "", false},
		{fmt.Errorf("not a status"), 500, "server_error", "", false},
	}
	for _, c := range cases {
		t.Run(c.err.Error(), func(t *testing.T) {
			fail := openai.GeneratorFunc(func(context.Context, *batonv1.GenerateRequest, func(*batonv1.GenerateEvent) error) error {
				return c.err
			})
			srv := apiServer(t, eg, fail, nil)
			var param any
			if c.param != "" {
				param = c.param
			}
			for _, stream := range []bool{false, true} {
				resp, b := post(t, srv.URL+"/v1/completions", mustJSON(map[string]any{"prompt": "x", "stream": stream}))
				checkError(t, resp.StatusCode, object(t, b), c.status, c.typ, param)
				if got := resp.Header.Get("Retry-After") != ""; got != c.retryAfter {
					t.Errorf("Retry-After = %q", resp.Header.Get("Retry-After"))
				}
			}
		})
	}

	// After the first event, an error (here a worker's death) ends the
	// stream with an error event, then [DONE]: never silently.
	midway := openai.GeneratorFunc(func(ctx context.Context, req *batonv1.GenerateRequest, send func(*batonv1.GenerateEvent) error) error {
		if err := send(&batonv1.GenerateEvent{PromptTokenIds: req.GetPromptTokenIds(), TokenIds: []uint32{432}, Text: ","}); err != nil {
			return err
		}
		return status.Error(codes.Unavailable, "decode 127.0.0.1:1: connection reset")
	})
	srv := apiServer(t, eg, midway, nil)
	resp, b := post(t, srv.URL+"/v1/chat/completions", `{"stream":true,"messages":[{"role":"user","content":"x"}]}`)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	blocks := strings.Split(strings.TrimSuffix(string(b), "\n\n"), "\n\n")
	if len(blocks) != 4 || blocks[3] != "data: [DONE]" || !strings.HasSuffix(string(b), "\n\n") {
		t.Fatalf("stream = %q, want role chunk, content chunk, error, [DONE]", b)
	}
	last := object(t, []byte(strings.TrimPrefix(blocks[2], "data: ")))
	checkError(t, 503, last, 503, "server_error", nil)

	// A generator that ends without a finish reason is a server error.
	silent := openai.GeneratorFunc(func(context.Context, *batonv1.GenerateRequest, func(*batonv1.GenerateEvent) error) error { return nil })
	srv = apiServer(t, eg, silent, nil)
	resp, b = post(t, srv.URL+"/v1/completions", `{"prompt":"x"}`)
	checkError(t, resp.StatusCode, object(t, b), 500, "server_error", nil)
}

// TestDuplicateRequestID: a request id already in flight is refused with 409
// while the first request goes on undisturbed.
func TestDuplicateRequestID(t *testing.T) {
	eg := newEngineGen(t)
	eg.delay.Store(int64(20 * time.Millisecond))
	srv := apiServer(t, eg, nil, nil)
	first := streamRequest(t, srv.URL+"/v1/completions", `{"prompt":"Once upon a time","max_tokens":50,"stream":true}`, "X-Request-Id", "job-7")
	defer first.Body.Close()
	readEvent(t, first)
	resp, b := post(t, srv.URL+"/v1/completions", `{"prompt":"The cat","max_tokens":4}`, "X-Request-Id", "job-7")
	checkError(t, resp.StatusCode, object(t, b), http.StatusConflict, "invalid_request_error", "X-Request-Id")
	rest, err := io.ReadAll(first.Body)
	if err != nil || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
		t.Errorf("first stream ended with %q, %v", rest, err)
	}
	resp, _ = post(t, srv.URL+"/v1/completions", `{"prompt":"The cat","max_tokens":4}`, "X-Request-Id", "job-7")
	if resp.StatusCode != 200 || resp.Header.Get("X-Request-Id") != "job-7" {
		t.Errorf("reusing a finished id: %d %q", resp.StatusCode, resp.Header.Get("X-Request-Id"))
	}
}

func streamRequest(t *testing.T, url, body string, header ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	return resp
}

// readEvent reads one "data: ..." event of a stream.
func readEvent(t *testing.T, resp *http.Response) string {
	t.Helper()
	r := bufio.NewReader(resp.Body)
	line, err := r.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first line %q, %v", line, err)
	}
	if blank, err := r.ReadString('\n'); err != nil || blank != "\n" {
		t.Fatalf("no blank line after the event: %q, %v", blank, err)
	}
	// Give back what was buffered so the caller can read the rest.
	resp.Body = readCloser{io.MultiReader(r, resp.Body), resp.Body}
	return strings.TrimPrefix(strings.TrimSuffix(line, "\n"), "data: ")
}

type readCloser struct {
	io.Reader
	io.Closer
}

// TestClientDisconnect: a client that goes away mid-stream cancels the
// request's context, and the generator stops promptly.
func TestClientDisconnect(t *testing.T) {
	eg := newEngineGen(t)
	eg.delay.Store(int64(50 * time.Millisecond)) // 100 tokens would take 5 s
	srv := apiServer(t, eg, nil, nil)
	for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
		t.Run(path, func(t *testing.T) {
			body := `{"prompt":"Once upon a time","max_tokens":100,"stream":true}`
			if strings.Contains(path, "chat") {
				body = `{"messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":100,"stream":true}`
			}
			resp := streamRequest(t, srv.URL+path, body)
			readEvent(t, resp)
			start := time.Now()
			resp.Body.Close()
			err := eg.waitEnded(t, 2*time.Second)
			if status.Code(err) != codes.Canceled {
				t.Errorf("generation ended with %v, want CANCELED", err)
			}
			t.Logf("generation stopped %v after the client left", time.Since(start).Round(time.Millisecond))
			if n := eg.inFlight(); n != 0 {
				t.Errorf("%d requests in flight", n)
			}
		})
	}
	// The same for a client waiting for a whole answer.
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/completions", strings.NewReader(`{"prompt":"Once upon a time","max_tokens":100}`))
	done := make(chan struct{})
	go func() {
		defer close(done)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	time.Sleep(200 * time.Millisecond)
	cancel()
	<-done
	if err := eg.waitEnded(t, 2*time.Second); status.Code(err) != codes.Canceled {
		t.Errorf("non-streaming generation ended with %v, want CANCELED", err)
	}
}

func TestAuthHTTP(t *testing.T) {
	eg := newEngineGen(t)
	k, err := openai.NewKeys("sk-one", "sk-two")
	if err != nil {
		t.Fatal(err)
	}
	srv := apiServer(t, eg, nil, func(o *openai.Options) { o.Keys = k })
	for _, c := range []struct {
		auth string
		ok   bool
	}{
		{"", false}, {"Bearer", false}, {"Bearer sk-three", false}, {"Basic sk-one", false}, {"Bearer sk-on", false},
		{"Bearer sk-one", true}, {"bearer sk-two", true}, {"Bearer  sk-two ", true},
	} {
		for _, path := range []string{"/v1/completions", "/v1/models"} {
			var req *http.Request
			if path == "/v1/models" {
				req, _ = http.NewRequest(http.MethodGet, srv.URL+path, nil)
			} else {
				req, _ = http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(`{"prompt":"x","max_tokens":2}`))
			}
			if c.auth != "" {
				req.Header.Set("Authorization", c.auth)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if c.ok {
				if resp.StatusCode != 200 {
					t.Errorf("%s with %q: %d %s", path, c.auth, resp.StatusCode, b)
				}
				continue
			}
			e := checkError(t, resp.StatusCode, object(t, b), http.StatusUnauthorized, "invalid_request_error", nil)
			if e["code"] != "invalid_api_key" || resp.Header.Get("WWW-Authenticate") == "" {
				t.Errorf("%s with %q: %v, WWW-Authenticate %q", path, c.auth, e, resp.Header.Get("WWW-Authenticate"))
			}
			if strings.Contains(string(b), "sk-") {
				t.Errorf("the answer quotes a key: %s", b)
			}
		}
	}
}

// TestConcurrentStreams runs streams side by side (under -race) and checks
// each gets its own, complete answer.
func TestConcurrentStreams(t *testing.T) {
	eg := newEngineGen(t)
	srv := apiServer(t, eg, nil, nil)
	gs := goldens(t)
	errs := make(chan error, len(gs))
	var n int
	for _, g := range gs {
		if g.Prompt == "" {
			continue
		}
		n++
		go func() {
			body := mustJSON(map[string]any{"prompt": g.Prompt, "max_tokens": len(g.GeneratedIDs), "temperature": 0, "stream": true})
			resp, err := http.Post(srv.URL+"/v1/completions", "application/json", bytes.NewReader([]byte(body)))
			if err != nil {
				errs <- err
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			var text strings.Builder
			for _, block := range strings.Split(strings.TrimSuffix(string(b), "\n\n"), "\n\n") {
				var ev struct{ Choices []struct{ Text string } }
				if json.Unmarshal([]byte(strings.TrimPrefix(block, "data: ")), &ev) == nil && len(ev.Choices) == 1 {
					text.WriteString(ev.Choices[0].Text)
				}
			}
			if text.String() != g.Text {
				errs <- fmt.Errorf("%q: got %q", g.Prompt, text.String())
				return
			}
			errs <- nil
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}
