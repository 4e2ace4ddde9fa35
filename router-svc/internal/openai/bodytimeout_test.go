package openai_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestBodyTimeoutIs408 (issue 18, defect 9): a client that stops sending
// its request body before --http-body-timeout is answered 408 Request
// Timeout in OpenAI's error shape — its request was not malformed, it was
// late — on both OpenAI endpoints.
func TestBodyTimeoutIs408(t *testing.T) {
	tr := startRouter(t, "--http-body-timeout", "300ms")
	for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
		t.Run(path, func(t *testing.T) {
			conn, err := net.Dial("tcp", strings.TrimPrefix(tr.http, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			// Half of a 200-byte body, then silence.
			fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n{\"model\":\"m\",", path, testKey)
			_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatalf("no answer to a stalled body: %v", err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var e struct {
				Error struct {
					Message string  `json:"message"`
					Type    string  `json:"type"`
					Param   *string `json:"param"`
					Code    *string `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal(b, &e); err != nil {
				t.Fatalf("%d %s: not OpenAI's error shape: %v", resp.StatusCode, b, err)
			}
			if resp.StatusCode != http.StatusRequestTimeout || e.Error.Type != "invalid_request_error" || e.Error.Code == nil ||
				*e.Error.Code != "request_timeout" || !strings.Contains(e.Error.Message, "--http-body-timeout") {
				t.Errorf("stalled body: %d %s, want 408 invalid_request_error, code request_timeout, naming --http-body-timeout", resp.StatusCode, b)
			}
		})
	}
	tr.idle(t)
}
