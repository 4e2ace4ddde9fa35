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
	"sync"
	"syscall"
	"testing"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// drainShutdownTimeout is the router's --shutdown-timeout in
// TestRouterDrainStreams.
const drainShutdownTimeout = 2 * time.Second

// TestRouterDrainStreams: SIGTERM to the router (--shutdown-timeout 2s)
// with an SSE stream, a REST NDJSON stream and a native gRPC stream in the
// middle of their answers, and one SSE request still waiting for its first
// token (the decode worker is frozen, so nothing moves). No stream may end
// silently: the SSE stream ends with a data: {"error":…} event then
// data: [DONE]; the NDJSON stream with a terminal {"error":…} line; the gRPC
// stream with UNAVAILABLE saying the router is shutting down; the waiting
// request is refused at once with 503 and Retry-After; the router's log
// says the drain ended them (ended_by drain), never the client; the router
// exits 0; the workers release everything.
func TestRouterDrainStreams(t *testing.T) {
	c := startCluster(t, map[string][]string{
		"prefill": workerFlags["prefill"],
		"decode":  append([]string{"--debug-hooks"}, workerFlags["decode"]...),
		"router":  {"--shutdown-timeout", drainShutdownTimeout.String(), "--log-level", "info"},
	})
	base := "http://" + c.router.http
	rc := c.client(t, c.router)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	freeze := func(path string) {
		t.Helper()
		resp, err := http.Post("http://"+adminOf(c.decode.http)+path, "", nil)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("%s on decode: %v %v", path, resp, err)
		}
		resp.Body.Close()
	}
	t.Cleanup(func() { _, _ = http.Post("http://"+adminOf(c.decode.http)+"/debug/unfreeze", "", nil) })

	const maxTokens = 480
	sseBody := fmt.Sprintf(`{"prompt":"Once upon a time","max_tokens":%d,"stream":true,"ignore_eos":true,"temperature":0}`, maxTokens)
	type result struct {
		name string
		body string // what the client read after the first event
		err  error  // the read's error (io.EOF excluded), or the gRPC status
	}
	// Three streams, each past its first event before the decode worker
	// freezes; their rest is read concurrently.
	results := make(chan result, 3)
	var begun sync.WaitGroup
	begun.Add(3)
	go func() { // SSE
		resp, err := postNoFatal(ctx, base+"/v1/completions", sseBody, "drain-sse")
		if err != nil {
			begun.Done()
			results <- result{"sse", "", err}
			return
		}
		defer resp.Body.Close()
		br := bufio.NewReader(resp.Body)
		first, err := br.ReadString('\n')
		begun.Done()
		if err != nil || !strings.HasPrefix(first, "data: {") {
			results <- result{"sse", first, fmt.Errorf("first event %q: %v", first, err)}
			return
		}
		rest, err := io.ReadAll(br)
		results <- result{"sse", string(rest), err}
	}()
	go func() { // REST NDJSON
		resp, err := postNoFatal(ctx, base+"/v1/generate", fmt.Sprintf(`{"request_id":"drain-ndjson","prompt":"Once upon a time",`+
			`"sampling":{"max_new_tokens":%d,"ignore_eos":true,"temperature":0}}`, maxTokens), "")
		if err != nil {
			begun.Done()
			results <- result{"ndjson", "", err}
			return
		}
		defer resp.Body.Close()
		br := bufio.NewReader(resp.Body)
		first, err := br.ReadString('\n')
		begun.Done()
		if err != nil || !strings.Contains(first, `"result"`) {
			results <- result{"ndjson", first, fmt.Errorf("first line %q: %v", first, err)}
			return
		}
		rest, err := io.ReadAll(br)
		results <- result{"ndjson", string(rest), err}
	}()
	go func() { // native gRPC
		s, err := rc.Generate(ctx, &batonv1.GenerateRequest{RequestId: "drain-grpc", Prompt: "Once upon a time",
			Sampling: &batonv1.SamplingParams{MaxNewTokens: maxTokens, IgnoreEos: true, Temperature: proto.Float32(0)}})
		if err == nil {
			_, err = s.Recv()
		}
		begun.Done()
		for err == nil {
			var ev *batonv1.GenerateResponse
			if ev, err = s.Recv(); err == nil && ev.GetEvent().GetFinishReason() != batonv1.FinishReason_FINISH_REASON_UNSPECIFIED {
				err = fmt.Errorf("finished (%v) before the drain", ev.GetEvent().GetFinishReason())
			}
		}
		results <- result{"grpc", "", err}
	}()
	begun.Wait()
	freeze("/debug/freeze?for=60s")
	lr, err := rc.ListRequests(ctx, &batonv1.ListRequestsRequest{})
	if err != nil || len(lr.GetRequests()) != 3 {
		t.Fatalf("want the 3 streams in flight when the decode worker froze: %v %v", lr, err)
	}

	// A fourth request waits for its first token behind the freeze.
	type reply struct {
		resp *http.Response
		err  error
	}
	waiting := make(chan reply, 1)
	go func() {
		resp, err := postNoFatal(ctx, base+"/v1/completions", sseBody, "drain-waiting")
		waiting <- reply{resp, err}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		lr, err := rc.ListRequests(ctx, &batonv1.ListRequestsRequest{})
		if err == nil && len(lr.GetRequests()) == 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the waiting request never in flight: %v %v", lr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}

	term := time.Now()
	c.router.p.signal(t, syscall.SIGTERM)

	// The waiting request: refused at once, retryable.
	if wr := <-waiting; wr.err != nil {
		t.Errorf("the waiting request got no answer: %v", wr.err)
	} else {
		w := wr.resp
		wb, _ := io.ReadAll(w.Body)
		w.Body.Close()
		refusedIn := time.Since(term)
		if w.StatusCode != http.StatusServiceUnavailable || w.Header.Get("Retry-After") == "" || !strings.Contains(string(wb), `"error"`) {
			t.Errorf("the waiting request: %s Retry-After %q %s; want 503 with Retry-After and an OpenAI error", w.Status,
				w.Header.Get("Retry-After"), wb)
		}
		if refusedIn >= drainShutdownTimeout {
			t.Errorf("the waiting request was answered %v after SIGTERM: cut at the drain's end, not refused at its start", refusedIn)
		}
	}

	for range 3 {
		var r result
		select {
		case r = <-results:
		case <-time.After(drainShutdownTimeout + 15*time.Second):
			t.Fatal("a stream did not end after SIGTERM")
		}
		switch r.name {
		case "sse":
			if r.err != nil {
				t.Errorf("SSE stream cut: %v (read ...%q)", r.err, tailOf(r.body, 300))
				continue
			}
			blocks := strings.Split(strings.TrimSuffix(r.body, "\n\n"), "\n\n")
			if len(blocks) < 2 || blocks[len(blocks)-1] != "data: [DONE]" {
				t.Errorf("SSE stream does not end with an error event and [DONE]: ...%q", tailOf(r.body, 300))
				continue
			}
			var ev struct {
				Error struct{ Message, Type string } `json:"error"`
			}
			if err := json.Unmarshal([]byte(strings.TrimPrefix(blocks[len(blocks)-2], "data: ")), &ev); err != nil ||
				!strings.Contains(ev.Error.Message, "shutting down") {
				t.Errorf("SSE event before [DONE] %q: want an error saying the router is shutting down (%v)", blocks[len(blocks)-2], err)
			}
		case "ndjson":
			lines := strings.Split(strings.TrimSpace(r.body), "\n")
			last := lines[len(lines)-1]
			if r.err != nil || !strings.HasPrefix(last, `{"error":`) || !strings.Contains(last, "shutting down") {
				t.Errorf("NDJSON stream does not end with an error line saying the router is shutting down: %v ...%q", r.err, tailOf(r.body, 300))
			}
		case "grpc":
			if st := status.Convert(r.err); st.Code() != codes.Unavailable || !strings.Contains(st.Message(), "shutting down") {
				t.Errorf("gRPC stream ended with %v; want UNAVAILABLE saying the router is shutting down", r.err)
			}
		}
	}
	code := c.router.p.wait(t, drainShutdownTimeout+10*time.Second)
	t.Logf("router exited %v after SIGTERM (--shutdown-timeout %v), code %d", time.Since(term).Round(10*time.Millisecond), drainShutdownTimeout, code)
	if code != 0 {
		t.Errorf("router exit code %d after SIGTERM, want 0", code)
	}
	logs := c.router.p.Stderr()
	for _, id := range []string{"drain-sse", "drain-ndjson", "drain-grpc", "drain-waiting"} {
		if !logHas(logs, id, `"ended_by":"drain"`) {
			t.Errorf("the router's log has no ended_by drain line for %s", id)
		}
	}
	if strings.Contains(logs, "ended by the client") {
		t.Error("the router says a client ended a drained stream (its log is below)")
	}

	// The workers let go of everything once the decode worker thaws.
	freeze("/debug/unfreeze")
	for start := time.Now(); ; {
		var busy []string
		for _, n := range []node{c.prefill, c.decode} {
			m := metrics(t, n.http)
			for _, g := range queueGauges {
				if v := m[g]; v != 0 {
					busy = append(busy, fmt.Sprintf("%s %s=%v", n.name, g, v))
				}
			}
		}
		if len(busy) == 0 {
			break
		}
		if time.Since(start) > 5*time.Second {
			t.Fatalf("workers not idle 5 s after the router's drain: %v", busy)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// postNoFatal posts a JSON body (with X-Request-Id id unless empty); safe
// off the test's goroutine.
func postNoFatal(ctx context.Context, url, body, id string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if id != "" {
		req.Header.Set("X-Request-Id", id)
	}
	return http.DefaultClient.Do(req)
}

// logHas says whether one line of logs mentions the request id and attr.
func logHas(logs, id, attr string) bool {
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, `"`+id+`"`) && strings.Contains(l, attr) {
			return true
		}
	}
	return false
}

// tailOf is the last n bytes of s.
func tailOf(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
