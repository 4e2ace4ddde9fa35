package openai

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/baton-serving/baton/engine/gguf"
	"github.com/baton-serving/baton/engine/refdata"
	"github.com/baton-serving/baton/engine/tokenizer"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// storiesTokenizer is the shared model's tokenizer.
func storiesTokenizer(t *testing.T) *tokenizer.Tokenizer {
	t.Helper()
	f, err := gguf.Open(refdata.Model(t))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tok, err := tokenizer.FromGGUF(f)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// countingHandler is a Handler on gen whose tokenizing is counted.
func countingHandler(t *testing.T, gen Generator, admits bool) (*http.ServeMux, *Handler, *atomic.Int64) {
	t.Helper()
	tok := storiesTokenizer(t)
	h, err := New(gen, Options{Model: Model{ID: "stories260K", ContextLength: 128, Tokenizer: tok},
		Limits: Limits{MaxBodyBytes: 4 << 20, DefaultMaxTokens: 8}, Admits: admits})
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	encode := h.encode
	h.encode = func(text string, opts tokenizer.EncodeOptions) []int32 {
		calls.Add(1)
		return encode(text, opts)
	}
	mux := http.NewServeMux()
	h.Register(mux)
	return mux, h, &calls
}

func serveJSON(mux *http.ServeMux, path string, body any) (*httptest.ResponseRecorder, map[string]any) {
	b, _ := json.Marshal(body)
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, strings.NewReader(string(b))))
	var out map[string]any
	_ = json.Unmarshal(rec.Body.Bytes(), &out)
	return rec, out
}

// finish is a Generator that admits the request and answers one token.
func finish(ctx context.Context, req *batonv1.GenerateRequest, send func(*batonv1.GenerateEvent) error) error {
	if err := Admitted(ctx); err != nil {
		return err
	}
	return send(&batonv1.GenerateEvent{PromptTokenIds: req.GetPromptTokenIds(), TokenIds: []uint32{13}, Text: ".",
		FinishReason: batonv1.FinishReason_FINISH_REASON_LENGTH})
}

// TestPromptBytesRefusedUntokenized: a prompt longer than the context
// window times the vocabulary's longest token is refused (400, naming the
// field, code context_length_exceeded) without being tokenized and without
// reaching the Generator; one at the bound is tokenized.
func TestPromptBytesRefusedUntokenized(t *testing.T) {
	var ran atomic.Int64
	gen := GeneratorFunc(func(ctx context.Context, req *batonv1.GenerateRequest, send func(*batonv1.GenerateEvent) error) error {
		ran.Add(1)
		return finish(ctx, req, send)
	})
	for _, admits := range []bool{false, true} {
		mux, h, calls := countingHandler(t, gen, admits)
		limit := int(h.maxPromptBytes)
		if limit != 127*MaxTokenBytes(h.model.Tokenizer) {
			t.Fatalf("byte limit %d, want 127 tokens × %d bytes", limit, MaxTokenBytes(h.model.Tokenizer))
		}
		over := strings.Repeat("a", limit+1)
		for _, c := range []struct {
			path, param string
			body        map[string]any
		}{
			{"/v1/completions", "prompt", map[string]any{"prompt": over}},
			{"/v1/completions", "prompt", map[string]any{"prompt": []string{over}}},
			{"/v1/chat/completions", "messages", map[string]any{"messages": []map[string]any{{"role": "user", "content": over}}}},
		} {
			calls.Store(0)
			ran.Store(0)
			rec, out := serveJSON(mux, c.path, c.body)
			e, _ := out["error"].(map[string]any)
			if rec.Code != http.StatusBadRequest || e["param"] != c.param || e["code"] != "context_length_exceeded" ||
				!strings.Contains(e["message"].(string), "bytes") {
				t.Errorf("admits %v %s: %d %s; want 400 context_length_exceeded naming %s and bytes", admits, c.path, rec.Code, rec.Body, c.param)
			}
			if n := calls.Load(); n != 0 {
				t.Errorf("admits %v %s: the over-long prompt was tokenized %d times", admits, c.path, n)
			}
			// The chat prompt is rendered (and measured) once admitted;
			// the completions prompt never reaches the Generator.
			if n := ran.Load(); c.path == "/v1/completions" && n != 0 {
				t.Errorf("admits %v: the over-long prompt reached the Generator", admits)
			}
		}
		// At the bound the byte check lets it through: tokenized, then
		// refused for its tokens if they do not fit.
		calls.Store(0)
		rec, _ := serveJSON(mux, "/v1/completions", map[string]any{"prompt": strings.Repeat("a", limit)})
		if calls.Load() != 1 || rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), "tokens") {
			t.Errorf("admits %v: a prompt at the byte bound: tokenized %d times, %d %s", admits, calls.Load(), rec.Code, rec.Body)
		}
	}
}

// TestTokenizeAfterAdmission: with a Generator that admits (Options.Admits),
// the prompt is rendered and tokenized only when it calls Admitted; one that
// refuses the request first (its limiter is full) costs no tokenizing at
// all, and its refusal is the answer even for a prompt that would not fit.
func TestTokenizeAfterAdmission(t *testing.T) {
	var before, after atomic.Int64
	var calls *atomic.Int64
	admitting := GeneratorFunc(func(ctx context.Context, req *batonv1.GenerateRequest, send func(*batonv1.GenerateEvent) error) error {
		before.Store(calls.Load())
		if len(req.GetPromptTokenIds()) != 0 {
			t.Error("the prompt was tokenized before admission")
		}
		err := Admitted(ctx)
		after.Store(calls.Load())
		if err != nil {
			return err
		}
		return finish(ctx, req, send)
	})
	mux, _, c := countingHandler(t, admitting, true)
	calls = c
	for _, body := range []struct {
		path string
		in   map[string]any
	}{
		{"/v1/completions", map[string]any{"prompt": "Once upon a time", "max_tokens": 1}},
		{"/v1/chat/completions", map[string]any{"messages": []map[string]any{{"role": "user", "content": "Hi"}}, "max_tokens": 1}},
		{"/v1/completions", map[string]any{"prompt": "Once upon a time", "max_tokens": 1, "stream": true}},
	} {
		rec, _ := serveJSON(mux, body.path, body.in)
		if rec.Code != http.StatusOK || before.Load() != 0 || after.Load() != 1 {
			t.Errorf("%s %v: %d %s; tokenized %d times before admission, %d after; want 200, 0 and 1",
				body.path, body.in, rec.Code, rec.Body, before.Load(), after.Load())
		}
		calls.Store(0)
	}
	// A refusal from admission after the prompt would not fit in tokens
	// (200 words, the window is 128 tokens): still the refusal.
	calls.Store(0)
	rec, _ := serveJSON(mux, "/v1/completions", map[string]any{"prompt": strings.Repeat("cat ", 200)})
	if rec.Code != http.StatusBadRequest || after.Load() != 1 || !strings.Contains(rec.Body.String(), "context_length_exceeded") {
		t.Errorf("a prompt over the window in tokens: %d %s (tokenized %d after admission)", rec.Code, rec.Body, after.Load())
	}
	full := GeneratorFunc(func(context.Context, *batonv1.GenerateRequest, func(*batonv1.GenerateEvent) error) error {
		return status.Error(codes.ResourceExhausted, "too many requests in flight (--max-concurrent-requests); retry shortly")
	})
	mux, _, calls = countingHandler(t, full, true)
	for path, in := range map[string]map[string]any{
		"/v1/completions":      {"prompt": strings.Repeat("cat ", 200)},
		"/v1/chat/completions": {"messages": []map[string]any{{"role": "user", "content": strings.Repeat("cat ", 200)}}},
	} {
		rec, _ := serveJSON(mux, path, in)
		if rec.Code != http.StatusTooManyRequests || calls.Load() != 0 {
			t.Errorf("%s with the limiter full: %d %s, tokenized %d times; want 429 and none", path, rec.Code, rec.Body, calls.Load())
		}
	}
}

// TestMaxTokenBytesBound: no text tokenizes to fewer tokens than its bytes
// over MaxTokenBytes, so the byte bound never refuses a prompt that fits.
func TestMaxTokenBytesBound(t *testing.T) {
	tok := storiesTokenizer(t)
	maxB := MaxTokenBytes(tok)
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []string{" ", "  ", "the", " the", "Once upon a time", "e", "\n", "é", "日本", "🙂", "<s>", "</s>", "ing", "aaaa", "\x00"}
	// The vocabulary's own pieces, repeated, are the worst case.
	for id := range tok.VocabSize() {
		alphabet = append(alphabet, tok.Piece(int32(id)))
	}
	for i := range 2000 {
		var b strings.Builder
		for range 1 + rng.IntN(60) {
			b.WriteString(alphabet[rng.IntN(len(alphabet))])
		}
		text := strings.ToValidUTF8(b.String(), "")
		if i%2 == 0 {
			text = strings.Repeat(tok.Piece(int32(rng.IntN(tok.VocabSize()))), 1+rng.IntN(20))
			text = strings.ToValidUTF8(text, "")
		}
		for _, opts := range []tokenizer.EncodeOptions{{AddSpecial: true, ParseSpecial: true}, {ParseSpecial: true}} {
			if n := len(tok.Encode(text, opts)); n*maxB < len(text) {
				t.Fatalf("%q (%d bytes) tokenizes to %d tokens, fewer than %d bytes / %d", text, len(text), n, len(text), maxB)
			}
		}
	}
	t.Logf("MaxTokenBytes %d over %d tokens", maxB, tok.VocabSize())
}

// TestRawMember: the skimmer finds the member encoding/json would decode,
// or gives up (nil) where it could differ.
func TestRawMember(t *testing.T) {
	for _, c := range []struct{ body, want string }{
		{`{"prompt":"abc"}`, `"abc"`},
		{` { "model" : "m", "prompt" : ["a\"b", [1,2]] , "n":1}`, `["a\"b", [1,2]]`},
		{`{"a":{"prompt":"inner"},"prompt":"outer"}`, `"outer"`},
		{`{"prompt":"first","prompt":"last"}`, `"last"`},
		{`{"prompt":12,"x":true}`, `12`},
		{`{"prompt":"a\\","b":"c"}`, `"a\\"`},
		{`{"x":"}{\"prompt\":1","prompt":null}`, `null`},
		{`{"prompt":"big","Prompt":"small"}`, ``}, // encoding/json matches either
		{`{"pr\u006fmpt":"x"}`, ``},
		{`{"prompt":"unterminated}`, ``},
		{`["prompt"]`, ``},
		{`{"other":1}`, ``},
	} {
		if got := string(rawMember([]byte(c.body), "prompt")); got != c.want {
			t.Errorf("rawMember(%s) = %q, want %q", c.body, got, c.want)
		}
	}
}

// TestPrecheckNeverRefusesAFit: a prompt within the byte bound passes the
// pre-decode check however it is escaped (six JSON bytes per byte), and
// one past the bound in raw and decoded bytes alike is refused before
// decoding.
func TestPrecheckNeverRefusesAFit(t *testing.T) {
	mux, h, calls := countingHandler(t, GeneratorFunc(finish), true)
	limit := int(h.maxPromptBytes)
	escaped := `{"prompt":"` + strings.Repeat(`\u0061`, limit) + `","max_tokens":1}`
	if herr := h.precheckCompletion([]byte(escaped)); herr != nil {
		t.Fatalf("a %d-byte prompt written with \\u escapes was refused: %s", limit, herr.message)
	}
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(escaped)))
	if calls.Load() != 1 {
		t.Errorf("the escaped prompt at the bound was not tokenized: %d %s", rec.Code, rec.Body)
	}
	over := `{"prompt":"` + strings.Repeat("a", maxEscapeRatio*limit+1) + `"}`
	if herr := h.precheckCompletion([]byte(over)); herr == nil || herr.param != "prompt" || herr.code != "context_length_exceeded" {
		t.Errorf("a prompt of %d raw bytes passed the pre-decode check: %v", maxEscapeRatio*limit+1, herr)
	}
}

// TestPrecheckChatMalformed: the chat precheck leaves every malformed
// messages value to the decoder, and returns.
func TestPrecheckChatMalformed(t *testing.T) {
	_, h, _ := countingHandler(t, GeneratorFunc(finish), true)
	for _, body := range []string{`{"messages":[}`, `{"messages":[1 2]}`, `{"messages":[{"content":"a"},]}`, `{"messages":[,]}`, `{"messages":[`, `{"messages":]`} {
		done := make(chan *httpError, 1)
		go func() { done <- h.precheckChat([]byte(body)) }()
		select {
		case herr := <-done:
			if herr != nil {
				t.Errorf("%s: refused %s", body, herr.message)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: the precheck does not return", body)
		}
	}
}
