package openai_test

// The end of a streaming request — --request-timeout, an Abort — must
// still be answered to a client that reads: before the stream's first
// event with the real HTTP status (504, 409), after it with one error
// event; never with a connection cut short (a bare EOF, which OpenAI's SDKs
// retry, sending the load again). The request's end frees a write blocked
// on a client that does not read (slowclient_test.go); it must not destroy
// the answer of one that does.

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
)

// answer is what a client got for one request.
type answer struct {
	resp *http.Response
	body []byte
	err  error // the request's or the body's read error
}

// postStream posts a streaming completion with id and reads its whole
// answer; it is safe to call from any goroutine.
func postStream(ctx context.Context, url, id, body string) answer {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return answer{err: err}
	}
	req.Header.Set("Authorization", "Bearer "+testKey)
	req.Header.Set("X-Request-Id", id)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{resp: resp, body: b, err: err}
}

// TestRouterStreamEndAnswered: with stream:true, a request that reaches
// --request-timeout or is aborted, before its first event or after it, is
// answered to its (reading) client: 504 / 409 in OpenAI's error shape
// before the first event; after it, the stream ends with one
// data: {"error":…} event (code timeout / aborted), then data: [DONE], and
// a proper end of the body.
func TestRouterStreamEndAnswered(t *testing.T) {
	const requestTimeout = 1500 * time.Millisecond
	tr := startRouter(t, "--request-timeout", requestTimeout.String())
	url := tr.http + "/v1/completions"
	body := `{"prompt":"Once upon a time","max_tokens":100,"stream":true,"ignore_eos":true}`
	abort := func(t *testing.T, id string) {
		t.Helper()
		waitUntil(t, requestTimeout/2, id+" in flight", func() bool {
			lr, err := client(tr).ListRequests(tr.authed(), &batonv1.ListRequestsRequest{})
			return err == nil && len(lr.GetRequests()) == 1
		})
		if _, err := client(tr).Abort(tr.authed(), &batonv1.AbortRequest{RequestId: id, Reason: "test"}); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name          string
		prefill, step time.Duration
		abort         bool
		status        int
		code          string
	}{
		{name: "timeout before the first event", prefill: 10 * time.Second, status: http.StatusGatewayTimeout, code: "timeout"},
		{name: "abort before the first event", prefill: 10 * time.Second, abort: true, status: http.StatusConflict, code: "aborted"},
		{name: "timeout after the first event", step: 100 * time.Millisecond, status: http.StatusOK, code: "timeout"},
		{name: "abort after the first event", step: 100 * time.Millisecond, abort: true, status: http.StatusOK, code: "aborted"},
	} {
		t.Run(c.name, func(t *testing.T) {
			tr.gen.prefillDelay.Store(int64(c.prefill))
			tr.gen.delay.Store(int64(c.step))
			id := "end-" + strings.ReplaceAll(c.name, " ", "-")
			got := make(chan answer, 1)
			go func() { got <- postStream(context.Background(), url, id, body) }()
			if c.abort {
				if c.prefill == 0 {
					// Wait for the stream to have begun: a few tokens.
					waitUntil(t, requestTimeout/2, id+" streaming", func() bool {
						lr, err := client(tr).ListRequests(tr.authed(), &batonv1.ListRequestsRequest{})
						return err == nil && len(lr.GetRequests()) == 1 && lr.GetRequests()[0].GetGeneratedTokens() >= 2
					})
				}
				abort(t, id)
			}
			var a answer
			select {
			case a = <-got:
			case <-time.After(requestTimeout + 10*time.Second):
				t.Fatal("no answer")
			}
			if a.err != nil {
				t.Fatalf("the client got no proper answer: %v (read %q)", a.err, a.body)
			}
			if a.resp.StatusCode != c.status {
				t.Fatalf("status %d %s, want %d", a.resp.StatusCode, a.body, c.status)
			}
			errBody := a.body
			if c.status == http.StatusOK {
				// An error event, then [DONE] (OpenAI's SDKs raise on the
				// error event; a stream without [DONE] reads as cut).
				blocks := strings.Split(strings.TrimSuffix(string(a.body), "\n\n"), "\n\n")
				if len(blocks) < 3 || blocks[len(blocks)-1] != "data: [DONE]" || bytes.Count(a.body, []byte("[DONE]")) != 1 {
					t.Fatalf("the failed stream does not end with an error event and [DONE] (%d events): %q", len(blocks), a.body)
				}
				last, ok := strings.CutPrefix(blocks[len(blocks)-2], "data: ")
				if !ok || !strings.HasSuffix(string(a.body), "\n\n") {
					t.Fatalf("the stream does not end with an event after the first (%d events): %q", len(blocks), a.body)
				}
				errBody = []byte(last)
			}
			wantType := map[string]string{"timeout": "server_error", "aborted": "invalid_request_error"}[c.code]
			e := checkError(t, c.status, object(t, errBody), c.status, wantType, nil)
			if e["code"] != c.code {
				t.Errorf("error %v, want code %q", e, c.code)
			}
			tr.idle(t)
			// The router's log names who ended it.
			wantBy := map[string]string{"timeout": "deadline", "aborted": "abort"}[c.code]
			if !hasLogLine(tr.logs.String(), id, `"ended_by":"`+wantBy+`"`) {
				t.Errorf("no log line with ended_by %s for %s", wantBy, id)
			}
			t.Logf("%s: %s", c.name, fmt.Sprint(e["message"]))
		})
	}
}

// TestRouterRESTStreamRecognised: grpc-gateway writes a REST stream's
// lines without ever calling WriteHeader (net/http's implicit one), and the
// router must still know the answer for a stream: on HTTP/1 it is sent
// with Connection: close (a write deadline bounds its end, which must not
// outlive it into a later request on the connection), and the connection
// of a client that stopped reading after the first line ends with the
// request instead of idling on in keep-alive.
func TestRouterRESTStreamRecognised(t *testing.T) {
	tr := startRouter(t, "--client-write-timeout", "0", "--request-timeout", "3s")
	addr := strings.TrimPrefix(tr.http, "http://")
	const body = `{"prompt":"Once upon a time","sampling":{"max_new_tokens":8,"ignore_eos":true,"temperature":0}}`
	t.Run("read", func(t *testing.T) {
		conn := slowLinkDial(t, addr, "")
		resp, br := rawPost(t, conn, "/v1/generate", body)
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/x-ndjson" {
			t.Fatalf("%s %q", resp.Status, resp.Header.Get("Content-Type"))
		}
		if !resp.Close {
			t.Errorf("a REST stream on HTTP/1 was sent without Connection: close (header %v)", resp.Header)
		}
		b, err := io.ReadAll(resp.Body)
		if err != nil || bytes.Count(b, []byte(`"result"`)) < 2 {
			t.Fatalf("stream %q, %v", b, err)
		}
		if _, ended := readAllUntil(conn, br, 5*time.Second); !ended {
			t.Error("the connection stayed open after a REST stream")
		}
		tr.idle(t)
	})
	t.Run("unread", func(t *testing.T) {
		conn := slowLinkDial(t, addr, "")
		resp, br := rawPost(t, conn, "/v1/generate", body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %s", resp.Status)
		}
		if line, err := readLine(resp.Body); err != nil || !strings.Contains(line, `"result"`) {
			t.Fatalf("first line %q, %v", line, err)
		}
		// The client reads no more; the request ends on the router's side.
		tr.gen.waitEnded(t, 10*time.Second)
		tr.idle(t)
		if _, ended := readAllUntil(conn, br, 5*time.Second); !ended {
			t.Error("the gateway kept the connection of a client that stopped reading open after its stream")
		}
	})
}

// readLine reads one line of r, byte by byte, leaving the rest unread.
func readLine(r io.Reader) (string, error) {
	var b strings.Builder
	one := make([]byte, 1)
	for {
		if _, err := io.ReadFull(r, one); err != nil {
			return b.String(), err
		}
		b.WriteByte(one[0])
		if one[0] == '\n' {
			return b.String(), nil
		}
	}
}
