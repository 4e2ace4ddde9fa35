package openai_test

// A router that shuts down (SIGTERM) with streams in flight must never end
// one silently: a stream still running when --shutdown-timeout is nearly
// spent ends with an error event and [DONE] — a cut-off answer must not
// look finished — and a request still waiting for its first token when the
// drain begins is refused at once with 503 and Retry-After (nothing reached
// its client, so it can be sent again elsewhere), not cut at the end. The
// router's log says the drain ended them, not the client.

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
)

// TestRouterDrainEndsStreams: SIGTERM (the router's context) with one SSE
// stream mid-generation and one request waiting for its first token, under
// --shutdown-timeout 2s.
func TestRouterDrainEndsStreams(t *testing.T) {
	tr := startRouter(t, "--shutdown-timeout", "2s", "--request-timeout", "1m")
	url := tr.http + "/v1/completions"
	// 100 tokens at 200 ms each: far longer than the drain.
	tr.gen.delay.Store(int64(200 * time.Millisecond))
	const body = `{"prompt":"Once upon a time","max_tokens":100,"stream":true,"ignore_eos":true}`
	streaming := make(chan answer, 1)
	go func() { streaming <- postStream(context.Background(), url, "drain-streaming", body) }()
	waitUntil(t, 10*time.Second, "the stream has begun", func() bool {
		select {
		case a := <-streaming:
			t.Fatalf("the stream ended before the drain: %v %q", a.err, a.body)
		default:
		}
		lr, err := client(tr).ListRequests(tr.authed(), &batonv1.ListRequestsRequest{})
		return err == nil && len(lr.GetRequests()) == 1 && lr.GetRequests()[0].GetGeneratedTokens() >= 2
	})
	// The next request waits in "prefill" past the drain.
	tr.gen.prefillDelay.Store(int64(time.Minute))
	waiting := make(chan answer, 1)
	go func() { waiting <- postStream(context.Background(), url, "drain-waiting", body) }()
	waitUntil(t, 10*time.Second, "the second request in flight", func() bool {
		return tr.gen.inFlight() == 2
	})

	tr.stop() // SIGTERM
	var w, s answer
	for _, c := range []struct {
		ch  chan answer
		out *answer
	}{{waiting, &w}, {streaming, &s}} {
		select {
		case *c.out = <-c.ch:
		case <-time.After(20 * time.Second):
			t.Fatal("no answer within 20 s of SIGTERM")
		}
	}

	// The waiting request: refused, whole, retryable.
	t.Run("waiting", func(t *testing.T) { checkDrainRefused(t, w) })
	t.Run("streaming", func(t *testing.T) { checkDrainedStream(t, s) })
	t.Run("log", func(t *testing.T) { checkDrainLog(t, tr.logs.String()) })
}

// checkDrainRefused: the request that waited for its first token got 503
// with Retry-After in OpenAI's error shape.
func checkDrainRefused(t *testing.T, w answer) {
	if w.err != nil {
		t.Fatalf("the waiting request got no proper answer: %v (read %q)", w.err, w.body)
	}
	if w.resp.StatusCode != http.StatusServiceUnavailable || w.resp.Header.Get("Retry-After") == "" {
		t.Fatalf("the waiting request: %s Retry-After %q %s; want 503 with Retry-After", w.resp.Status,
			w.resp.Header.Get("Retry-After"), w.body)
	}
	checkError(t, w.resp.StatusCode, object(t, w.body), http.StatusServiceUnavailable, "server_error", nil)
}

// checkDrainedStream: the stream's events, then an error event, then [DONE].
func checkDrainedStream(t *testing.T, s answer) {
	if s.err != nil {
		t.Fatalf("the stream was cut: %v (read %q)", s.err, s.body)
	}
	if s.resp.StatusCode != http.StatusOK {
		t.Fatalf("stream status %s %s", s.resp.Status, s.body)
	}
	blocks := strings.Split(strings.TrimSuffix(string(s.body), "\n\n"), "\n\n")
	if len(blocks) < 3 || blocks[len(blocks)-1] != "data: [DONE]" || !strings.HasSuffix(string(s.body), "\n\n") {
		t.Fatalf("the drained stream does not end with an error event and [DONE] (%d events): ...%q", len(blocks),
			tail(s.body, 300))
	}
	last, ok := strings.CutPrefix(blocks[len(blocks)-2], "data: ")
	if !ok {
		t.Fatalf("event before [DONE]: %q", blocks[len(blocks)-2])
	}
	e := checkError(t, http.StatusServiceUnavailable, object(t, []byte(last)), http.StatusServiceUnavailable, "server_error", nil)
	if msg, _ := e["message"].(string); !strings.Contains(msg, "shutting down") {
		t.Errorf("error event %v: want a message saying the router is shutting down", e)
	}
	if bytes.Contains(s.body, []byte(`"finish_reason":"`)) {
		t.Errorf("the drained stream carries a finish_reason: ...%q", tail(s.body, 300))
	}
}

// checkDrainLog: the log names who ended both requests.
func checkDrainLog(t *testing.T, logs string) {
	for _, id := range []string{"drain-streaming", "drain-waiting"} {
		if !hasLogLine(logs, id, `"ended_by":"drain"`) {
			t.Errorf("no log line with ended_by drain for %s; logs:\n%s", id, logs)
		}
	}
	if strings.Contains(logs, "ended by the client") {
		t.Errorf("the router says the client ended a drained stream:\n%s", logs)
	}
}

// hasLogLine says whether one line of logs mentions id and has attr.
func hasLogLine(logs, id, attr string) bool {
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, `"`+id+`"`) && strings.Contains(l, attr) {
			return true
		}
	}
	return false
}

// tail is the last n bytes of b.
func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// TestRouterCheapRefusalsFirst: with the router's limiter full
// (--max-concurrent-requests 1, one request held in prefill), a prompt
// whose byte length cannot fit is still refused at once (400 naming its
// bytes: no tokenizing, no slot needed), while one that needs tokenizing to
// be judged — 200 words for a 128-token window — waits for no tokenizer:
// it is refused by the limiter (429) before it is tokenized or rendered.
func TestRouterCheapRefusalsFirst(t *testing.T) {
	tr := startRouter(t, "--max-concurrent-requests", "1")
	url := tr.http + "/v1/completions"
	tr.gen.prefillDelay.Store(int64(time.Minute))
	held := make(chan answer, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); <-held; tr.gen.prefillDelay.Store(0); tr.idle(t) }()
	go func() {
		held <- postStream(ctx, url, "held", `{"prompt":"Once upon a time","max_tokens":4,"stream":true}`)
	}()
	waitUntil(t, 10*time.Second, "the held request in flight", func() bool { return tr.gen.inFlight() == 1 })

	words := strings.Repeat("cat ", 200)
	for _, c := range []struct {
		name, path, body string
		status           int
		want             string
	}{
		{"oversized completion", "/v1/completions", `{"prompt":"` + strings.Repeat("a", 4000) + `"}`, http.StatusBadRequest, "bytes"},
		{"completion over the window in tokens", "/v1/completions", `{"prompt":"` + words + `"}`, http.StatusTooManyRequests, "--max-concurrent-requests"},
		{"chat over the window in tokens", "/v1/chat/completions", `{"messages":[{"role":"user","content":"` + words + `"}]}`, http.StatusTooManyRequests, "--max-concurrent-requests"},
	} {
		a := postStream(context.Background(), tr.http+c.path, "cheap-"+strings.ReplaceAll(c.name, " ", "-"), c.body)
		if a.err != nil {
			t.Errorf("%s: %v", c.name, a.err)
		} else if a.resp.StatusCode != c.status || !strings.Contains(string(a.body), c.want) {
			t.Errorf("%s with the limiter full: %s %s; want %d mentioning %q", c.name, a.resp.Status, a.body, c.status, c.want)
		}
	}
}
