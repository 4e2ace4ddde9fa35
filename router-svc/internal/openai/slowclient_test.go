package openai_test

// Slow, trickling and stuck stream readers (issue 18, defect 2): a client
// that stops reading, or reads too little to keep up, must not hold its
// request — the limiter slot, the in-flight entry, the workers — nor a
// goroutine and a socket, beyond the write timeout or, with none, the
// request timeout; and one client address may hold only so many requests.
// The clients here are raw TCP connections shaped like clients on a slow
// link, against a real HTTP server.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/router-svc/internal/openai"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// slowLinkDial connects to addr from the local address from ("" for any) the
// way a client on a slow link does: a 1,200-byte MSS (on loopback the
// kernel would otherwise size the server's send buffer for 64 KiB segments,
// megabytes) and a tiny receive buffer, so that a client that reads nothing
// blocks the server's writes after a few tens of kilobytes.
func slowLinkDial(t *testing.T, addr, from string) net.Conn {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second, Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = errors.Join(syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096),
				syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_MAXSEG, 1200))
		}); err != nil {
			return err
		}
		return serr
	}}
	if from != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(from)}
	}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// rawPost sends a POST with body on conn and reads the response's status
// line and headers; the body is left to read from the returned reader.
func rawPost(t *testing.T, conn net.Conn, path, body string, header ...string) (*http.Response, *bufio.Reader) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nAuthorization: Bearer %s\r\n",
		path, conn.RemoteAddr(), len(body), testKey)
	for i := 0; i+1 < len(header); i += 2 {
		fmt.Fprintf(&b, "%s: %s\r\n", header[i], header[i+1])
	}
	b.WriteString("\r\n" + body)
	if _, err := io.WriteString(conn, b.String()); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReaderSize(conn, 512)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	_ = conn.SetReadDeadline(time.Time{})
	return resp, br
}

// bigStream is a streaming completion whose output (every token with its
// 20 most likely alternatives) outgrows every buffer on the way.
func bigStream(maxTokens int) string {
	return fmt.Sprintf(`{"prompt":"Once upon a time","max_tokens":%d,"stream":true,"ignore_eos":true,"logprobs":20,"temperature":0}`, maxTokens)
}

// readAllUntil reads r until it ends or within passes; it returns what it
// read and whether the connection ended (EOF or a reset) rather than the
// time running out.
func readAllUntil(conn net.Conn, r io.Reader, within time.Duration) (got []byte, ended bool) {
	_ = conn.SetReadDeadline(time.Now().Add(within))
	got, err := io.ReadAll(r)
	var ne net.Error
	return got, !(errors.As(err, &ne) && ne.Timeout())
}

// TestRouterUnreadSSEEndsAtRequestTimeout: with --client-write-timeout 0 a
// client that stops reading its SSE stream is still bounded by
// --request-timeout: at the deadline its request is gone from the router
// (in-flight entry, limiter slot) and the worker, and its connection ends.
func TestRouterUnreadSSEEndsAtRequestTimeout(t *testing.T) {
	const requestTimeout = 2 * time.Second
	tr := startRouterOn(t, newEngineGenCtx(t, 2048), "--context-length", "2048",
		"--client-write-timeout", "0", "--request-timeout", requestTimeout.String(), "--max-concurrent-requests", "1")
	conn := slowLinkDial(t, strings.TrimPrefix(tr.http, "http://"), "")
	start := time.Now()
	resp, br := rawPost(t, conn, "/v1/completions", bigStream(2000), "X-Request-Id", "unread-1")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %s", resp.Status)
	}
	if line, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first event %q, %v", line, err)
	}
	// The client reads no more, and the router's writes block.
	waitUntil(t, requestTimeout, "the router blocked on the client", func() bool {
		lr, err := client(tr).ListRequests(tr.authed(), &batonv1.ListRequestsRequest{})
		return err == nil && len(lr.GetRequests()) == 1 && lr.GetRequests()[0].GetSinceProgressSeconds() > 0.3
	})
	time.Sleep(time.Until(start.Add(requestTimeout)))
	tr.idle(t)
	// Its slot is free: another request is served.
	if resp, b := post(t, tr.http+"/v1/completions", `{"prompt":"x","max_tokens":2}`, "Authorization", "Bearer "+testKey); resp.StatusCode != 200 {
		t.Errorf("after the deadline: %d %s", resp.StatusCode, b)
	}
	got, ended := readAllUntil(conn, br, 5*time.Second)
	if !ended {
		t.Error("the router kept the connection of the client that stopped reading open past its deadline")
	}
	if bytes.Contains(got, []byte("[DONE]")) {
		t.Error("the unread stream ended with [DONE]")
	}
}

// TestRouterAbortUnreadStream: an Abort of a request whose client has
// stopped reading (SSE or gRPC) releases it within 2 s, though the write
// timeout and the deadline are far off.
func TestRouterAbortUnreadStream(t *testing.T) {
	tr := startRouterOn(t, newEngineGenCtx(t, 2048), "--context-length", "2048", "--client-write-timeout", "1m", "--request-timeout", "1m")
	client := batonv1.NewRouterServiceClient(tr.grpc)
	abort := func(t *testing.T, id string) {
		t.Helper()
		// Wait until the router's writes block, then abort.
		waitUntil(t, 30*time.Second, id+" blocked on its client", func() bool {
			lr, err := client.ListRequests(tr.authed(), &batonv1.ListRequestsRequest{})
			return err == nil && len(lr.GetRequests()) == 1 && lr.GetRequests()[0].GetSinceProgressSeconds() > 0.3
		})
		if _, err := client.Abort(tr.authed(), &batonv1.AbortRequest{RequestId: id, Reason: "test"}); err != nil {
			t.Fatal(err)
		}
		tr.idle(t)
	}
	t.Run("sse", func(t *testing.T) {
		conn := slowLinkDial(t, strings.TrimPrefix(tr.http, "http://"), "")
		resp, br := rawPost(t, conn, "/v1/completions", bigStream(2000), "X-Request-Id", "unread-sse")
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %s", resp.Status)
		}
		if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
			t.Fatal(err)
		}
		abort(t, "unread-sse")
		if _, ended := readAllUntil(conn, br, 5*time.Second); !ended {
			t.Error("the aborted stream's connection stayed open")
		}
	})
	t.Run("grpc", func(t *testing.T) {
		ctx, cancel := context.WithCancel(tr.authed())
		defer cancel()
		startHeldStream(ctx, t, tr, "unread-grpc", 2000)
		abort(t, "unread-grpc")
	})
}

// smallBufListener gives every accepted connection a small send buffer, as
// a server on a constrained link (or a kernel that wakes writers early) has:
// then each write waits only for the client's next read, and only the
// minimum-progress rule — not the kernel's buffering — tells a trickling
// client from one that keeps up.
type smallBufListener struct{ net.Listener }

func (l smallBufListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(8 << 10)
	}
	return c, err
}

// TestSSETricklingClientEvicted: a client that takes a little of its
// stream at every turn — every single write completes well within the
// write timeout — but falls ever further behind the generation is aborted
// once the oldest event it has not taken has waited the write timeout, not
// at the end of its (here ~3 MB) stream.
func TestSSETricklingClientEvicted(t *testing.T) {
	const writeTimeout = 2 * time.Second
	eg := newEngineGenCtx(t, 2048)
	h, err := openai.New(eg, openai.Options{
		Model: openai.Model{ID: modelID, Created: 1700000000, Architecture: eg.cfg.Architecture,
			Fingerprint: eg.m.Fingerprint(), ContextLength: eg.cfg.ContextLength, Tokenizer: eg.tok},
		Limits: openai.Limits{MaxBodyBytes: 64 << 10, DefaultMaxTokens: 32, WriteTimeout: writeTimeout},
	})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	h.Register(mux)
	srv := httptest.NewUnstartedServer(mux)
	srv.Listener = smallBufListener{srv.Listener}
	srv.Start()
	t.Cleanup(srv.Close)

	conn := slowLinkDial(t, srv.Listener.Addr().String(), "")
	resp, br := rawPost(t, conn, "/v1/completions", bigStream(2000))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %s", resp.Status)
	}
	// 4 KiB every 250 ms: ~16 KB/s, a tenth of what the engine makes.
	var got bytes.Buffer
	var mu sync.Mutex
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		buf := make([]byte, 4<<10)
		for {
			n, err := br.Read(buf)
			mu.Lock()
			got.Write(buf[:n])
			mu.Unlock()
			if err != nil {
				return
			}
			time.Sleep(250 * time.Millisecond)
		}
	}()
	start := time.Now()
	select {
	case err := <-eg.ended:
		if err == nil {
			t.Fatal("the trickling client's generation finished: it was never evicted")
		}
		t.Logf("evicted %v into the stream: %v", time.Since(start).Round(100*time.Millisecond), err)
	case <-time.After(10 * writeTimeout):
		t.Fatalf("the trickling client still holds its request %v into the stream (write timeout %v)", 10*writeTimeout, writeTimeout)
	}
	select {
	case <-readerDone:
	case <-time.After(10 * time.Second):
		t.Fatal("the evicted client's connection stayed open")
	}
	mu.Lock()
	defer mu.Unlock()
	if bytes.Contains(got.Bytes(), []byte("[DONE]")) {
		t.Error("the evicted stream ended with [DONE]")
	}
}

// TestRouterMaxInflightPerClient: one client address may hold at most
// --max-inflight-per-client requests, over every API; more get 429 /
// RESOURCE_EXHAUSTED naming the flag, while other addresses are served.
// REST requests count against the HTTP client's address, not the gateway's.
func TestRouterMaxInflightPerClient(t *testing.T) {
	tr := startRouter(t, "--max-inflight-per-client", "2")
	tr.gen.delay.Store(int64(30 * time.Millisecond))
	addr := strings.TrimPrefix(tr.http, "http://")
	// Two streams from 127.0.0.2, one on each HTTP API, that it keeps open.
	for i, c := range []struct{ path, body string }{
		{"/v1/completions", `{"prompt":"Once upon a time","max_tokens":100,"stream":true}`},
		{"/v1/generate", `{"prompt":"Once upon a time","sampling":{"max_new_tokens":100}}`},
	} {
		conn := slowLinkDial(t, addr, "127.0.0.2")
		resp, _ := rawPost(t, conn, c.path, c.body, "X-Request-Id", fmt.Sprintf("held-%d", i))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %s", c.path, resp.Status)
		}
		if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	refused := func(what string, resp *http.Response, _ *bufio.Reader) {
		t.Helper()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		if resp.StatusCode != http.StatusTooManyRequests || !bytes.Contains(b, []byte("--max-inflight-per-client")) || resp.Header.Get("Retry-After") == "" {
			t.Errorf("%s over the per-client cap: %s %s (Retry-After %q)", what, resp.Status, b, resp.Header.Get("Retry-After"))
		}
	}
	conn := slowLinkDial(t, addr, "127.0.0.2")
	resp, br := rawPost(t, conn, "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"max_tokens":2}`)
	refused("OpenAI", resp, br)
	conn = slowLinkDial(t, addr, "127.0.0.2")
	resp, br = rawPost(t, conn, "/v1/complete", `{"prompt":"x","sampling":{"max_new_tokens":2}}`)
	refused("REST", resp, br)
	gconn, err := grpc.NewClient(tr.grpc.Target(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}
			return d.DialContext(ctx, "tcp", a)
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer gconn.Close()
	_, err = batonv1.NewRouterServiceClient(gconn).Complete(tr.authed(), &batonv1.CompleteRequest{Request: &batonv1.GenerateRequest{Prompt: "x"}})
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "--max-inflight-per-client") {
		t.Errorf("gRPC over the per-client cap: %v", err)
	}
	// Another address is served on every API, REST included.
	for _, c := range []struct{ path, body string }{
		{"/v1/completions", `{"prompt":"x","max_tokens":2}`},
		{"/v1/complete", `{"prompt":"x","sampling":{"max_new_tokens":2}}`},
	} {
		conn := slowLinkDial(t, addr, "127.0.0.3")
		resp, _ := rawPost(t, conn, c.path, c.body)
		if b := mustRead(resp.Body); resp.StatusCode != http.StatusOK {
			t.Errorf("%s from another address: %s %s", c.path, resp.Status, b)
		}
	}
	if _, err := client(tr).Complete(tr.authed(), &batonv1.CompleteRequest{Request: &batonv1.GenerateRequest{Prompt: "x", Sampling: &batonv1.SamplingParams{MaxNewTokens: 2}}}); err != nil {
		t.Errorf("gRPC from another address: %v", err)
	}
}

func client(tr *testRouter) batonv1.RouterServiceClient {
	return batonv1.NewRouterServiceClient(tr.grpc)
}

// mustRead reads what is buffered of a short answer.
func mustRead(r io.Reader) []byte {
	b, _ := io.ReadAll(io.LimitReader(r, 4096))
	return b
}

// TestRouterRESTUnreadStreamClosed: a REST (NDJSON) stream whose client
// stops reading is bounded at the gateway too: its write to the client
// fails after the write timeout, and the connection — the gateway's
// goroutine and socket — is closed rather than kept forever.
func TestRouterRESTUnreadStreamClosed(t *testing.T) {
	tr := startRouter(t, "--client-write-timeout", "1s")
	conn := slowLinkDial(t, strings.TrimPrefix(tr.http, "http://"), "")
	resp, br := rawPost(t, conn, "/v1/generate", `{"prompt":"Once upon a time","sampling":{"max_new_tokens":120,"ignore_eos":true,"logprobs":true,"top_logprobs":20,"temperature":0}}`)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %s", resp.Status)
	}
	if line, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil || !strings.Contains(line, `"result"`) {
		t.Fatalf("first line %q, %v", line, err)
	}
	// The router's side ends (the generation may finish into the
	// gateway's buffers, or be aborted as too slow); the gateway's write
	// to the client must end too.
	tr.gen.waitEnded(t, 10*time.Second)
	tr.idle(t)
	time.Sleep(3 * time.Second) // the client still reads nothing
	got, ended := readAllUntil(conn, br, 5*time.Second)
	if !ended {
		t.Errorf("the gateway kept the connection of a client that stopped reading open (read %d bytes, then nothing)", len(got))
	}
}
