package openai_test

import (
	"context"
	"net/http"
	"testing"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/router-svc/internal/openai"
)

// TestCachedTokens: the worker's Usage.cached_tokens (prompt tokens reused
// from the prefix cache) is usage.prompt_tokens_details.cached_tokens, in
// completions and chat, whole and in the streamed last chunk.
func TestCachedTokens(t *testing.T) {
	eg := newEngineGen(t)
	gen := openai.GeneratorFunc(func(_ context.Context, req *batonv1.GenerateRequest, send func(*batonv1.GenerateEvent) error) error {
		n := uint32(len(req.GetPromptTokenIds()))
		return send(&batonv1.GenerateEvent{RequestId: req.GetRequestId(), TokenIds: []uint32{300}, Text: " x",
			FinishReason: batonv1.FinishReason_FINISH_REASON_LENGTH,
			Usage:        &batonv1.Usage{PromptTokens: n, CompletionTokens: 1, TotalTokens: n + 1, CachedTokens: 16}})
	})
	srv := apiServer(t, eg, gen, nil)
	cached := func(v any) any {
		u := keys(t, "usage", v, usageFields...)
		d, _ := u["prompt_tokens_details"].(map[string]any)
		return d["cached_tokens"]
	}
	for _, c := range []struct{ path, body string }{
		{"/v1/completions", `{"model":"` + modelID + `","prompt":"Once upon a time there was a little girl named Lily","max_tokens":1}`},
		{"/v1/chat/completions", `{"model":"` + modelID + `","messages":[{"role":"user","content":"Once upon a time there was a little girl"}],"max_tokens":1}`},
	} {
		resp, body := post(t, srv.URL+c.path, c.body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %s", c.path, resp.StatusCode, body)
		}
		if got := cached(object(t, body)["usage"]); got != float64(16) {
			t.Errorf("%s: cached_tokens %v, want 16", c.path, got)
		}
		stream := c.body[:len(c.body)-1] + `,"stream":true,"stream_options":{"include_usage":true}}`
		resp, body = post(t, srv.URL+c.path, stream)
		evs := sseEvents(t, resp, body)
		if got := cached(evs[len(evs)-1]["usage"]); got != float64(16) {
			t.Errorf("%s streamed: cached_tokens %v, want 16", c.path, got)
		}
	}
}
