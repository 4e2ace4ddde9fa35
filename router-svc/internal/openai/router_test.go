package openai_test

// These tests run the real router (package router, through svckit as main
// does) in front of an in-process decode worker that generates with the real
// engine, and talk to it with real HTTP and gRPC clients: the OpenAI API, the
// REST gateway with its NDJSON stream, authentication on every API, the
// limits, and the release of every request on every path.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/baton-serving/baton/engine/refdata"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/router-svc/internal/router"
	"github.com/baton-serving/baton/svckit"
	"github.com/baton-serving/baton/svckit/workerapi"
	"github.com/baton-serving/baton/tracing"
	"github.com/getkin/kin-openapi/openapi2"
	"github.com/getkin/kin-openapi/openapi2conv"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

const testKey = "sk-baton-test-0123456789"

// decodeWorker is a decode worker whose Generate runs the engine in-process
// (colocated mode: it computes the prompt itself).
type decodeWorker struct {
	batonv1.UnimplementedDecodeServiceServer
	gen *engineGen
}

func (d *decodeWorker) Generate(req *batonv1.DecodeServiceGenerateRequest, stream batonv1.DecodeService_GenerateServer) error {
	if req.GetPrefillEndpoint() != "local" {
		return status.Errorf(codes.FailedPrecondition, "prefill_endpoint %q: this test worker runs colocated only", req.GetPrefillEndpoint())
	}
	return d.gen.Generate(stream.Context(), req.GetRequest(), func(ev *batonv1.GenerateEvent) error {
		return stream.Send(&batonv1.DecodeServiceGenerateResponse{Event: ev})
	})
}

func (d *decodeWorker) Info() *batonv1.InfoResponse {
	return &batonv1.InfoResponse{Role: batonv1.WorkerRole_WORKER_ROLE_DECODE,
		Model: &batonv1.ModelInfo{Id: modelID, Object: "model", Fingerprint: d.gen.m.Fingerprint()}}
}

func (d *decodeWorker) Load(context.Context) *batonv1.LoadReport {
	return &batonv1.LoadReport{Ready: true, RunningRequests: uint32(d.gen.inFlight())}
}

func (d *decodeWorker) Requests() []*batonv1.RequestInfo { return nil }

// testRouter is a running router and its decode worker.
type testRouter struct {
	http string // base URL
	grpc *grpc.ClientConn
	gen  *engineGen
	// stop begins the router's shutdown (SIGTERM's part in main).
	stop context.CancelFunc
	// logs is what the router logged (JSON lines).
	logs *syncBuffer
}

// syncBuffer is a bytes.Buffer safe for the router's concurrent logging.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// startRouter starts a decode worker and a router with flags added to the
// test defaults; authentication is on with testKey.
func startRouter(t *testing.T, flags ...string) *testRouter {
	t.Helper()
	return startRouterOn(t, newEngineGen(t), flags...)
}

// startRouterOn is startRouter with the decode worker generating on eg.
func startRouterOn(t *testing.T, eg *engineGen, flags ...string) *testRouter {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ws := grpc.NewServer()
	dw := &decodeWorker{gen: eg}
	batonv1.RegisterDecodeServiceServer(ws, dw)
	batonv1.RegisterWorkerServiceServer(ws, workerapi.New(dw))
	go ws.Serve(lis)
	t.Cleanup(ws.Stop)

	keys := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(keys, []byte("# test\n"+testKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	svc := router.New()
	fs := flag.NewFlagSet("router-svc", flag.ContinueOnError)
	var cfg svckit.Config
	cfg.AddFlags(fs, svckit.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"})
	svc.AddFlags(fs)
	args := append([]string{"--model", refdata.Model(t), "--prefill", "local", "--decode", lis.Addr().String(),
		"--load-interval", "50ms", "--api-keys-file", keys, "--max-body-bytes", "65536",
		// These tests count the requests the decode side sees; canary
		// probes and the router's self-probe (covered by the canary and
		// router packages and the e2e suite) would add to them.
		"--canary-interval", "0", "--self-probe-interval", "0"}, flags...)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := svc.Validate(); err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	logger := slog.New(slog.NewJSONHandler(logs, nil))
	ctx, cancel := context.WithCancel(context.Background())
	tp, err := tracing.Init(ctx, "router-svc", logger)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := svckit.NewServer("router-svc", cfg, logger, tp, svckit.ServerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Open(ctx, &svckit.Deps{Logger: logger, Tracing: tp, Config: cfg}); err != nil {
		t.Fatal(err)
	}
	if err := svc.Register(srv); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	conn, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("router Run: %v", err)
		}
		svc.Close()
		tp.Shutdown(context.Background())
		http.DefaultClient.CloseIdleConnections()
	})
	tr := &testRouter{http: "http://" + srv.HTTPAddr(), grpc: conn, gen: eg, stop: cancel, logs: logs}
	waitUntil(t, 5*time.Second, "the router is ready", func() bool {
		resp, err := http.Get(tr.http + "/health/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return tr
}

func waitUntil(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", within, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (tr *testRouter) authed() context.Context {
	return metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+testKey)
}

// idle checks, within 2 s, that nothing is in flight anywhere: the router's
// request list and gauge, and the decode worker.
func (tr *testRouter) idle(t *testing.T) {
	t.Helper()
	client := batonv1.NewRouterServiceClient(tr.grpc)
	waitUntil(t, 2*time.Second, "no request in flight at the router and the worker", func() bool {
		lr, err := client.ListRequests(tr.authed(), &batonv1.ListRequestsRequest{})
		if err != nil || len(lr.GetRequests()) != 0 || tr.gen.inFlight() != 0 {
			return false
		}
		resp, err := http.Get(tr.http + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return strings.Contains(string(b), "\nbaton_router_inflight_requests 0\n")
	})
}

func TestRouterOpenAIGolden(t *testing.T) {
	tr := startRouter(t)
	g := goldens(t)[0]
	auth := []string{"Authorization", "Bearer " + testKey}
	body := mustJSON(map[string]any{"model": modelID, "prompt": g.Prompt, "max_tokens": len(g.GeneratedIDs), "temperature": 0})
	resp, b := post(t, tr.http+"/v1/completions", body, auth...)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	obj := keys(t, "completion", object(t, b), completionFields...)
	if c := only(t, "choices", obj["choices"]); c["text"] != g.Text || c["finish_reason"] != "length" {
		t.Errorf("choice = %v", c)
	}
	checkUsage(t, obj["usage"], len(g.PromptIDs), len(g.GeneratedIDs))

	body = mustJSON(map[string]any{"model": modelID, "max_tokens": len(g.GeneratedIDs), "temperature": 0, "stream": true,
		"stream_options": map[string]any{"include_usage": true},
		"messages":       []any{map[string]any{"role": "user", "content": g.Prompt}}})
	resp, b = post(t, tr.http+"/v1/chat/completions", body, auth...)
	var text strings.Builder
	events := sseEvents(t, resp, b)
	for _, ev := range events[:len(events)-1] {
		if d, ok := only(t, "choices", ev["choices"])["delta"].(map[string]any)["content"].(string); ok {
			text.WriteString(d)
		}
	}
	if text.String() != g.Text {
		t.Errorf("streamed %q\nwant     %q", text.String(), g.Text)
	}
	checkUsage(t, events[len(events)-1]["usage"], len(g.PromptIDs), len(g.GeneratedIDs))

	// GET /v1/models is OpenAI's model list (created is a number, not the
	// string protojson would make of an int64).
	req, _ := http.NewRequest(http.MethodGet, tr.http+"/v1/models", nil)
	req.Header.Set("Authorization", "Bearer "+testKey)
	mresp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	mb, _ := io.ReadAll(mresp.Body)
	mresp.Body.Close()
	m := only(t, "data", object(t, mb)["data"])
	if _, isNum := m["created"].(float64); !isNum || m["id"] != modelID || m["object"] != "model" {
		t.Errorf("model = %v", m)
	}
	tr.idle(t)
}

// TestRouterGenerateNDJSON checks POST /v1/generate: newline-delimited JSON,
// one {"result":{"event":...}} per line, the golden text.
func TestRouterGenerateNDJSON(t *testing.T) {
	tr := startRouter(t)
	g := goldens(t)[2]
	body := mustJSON(map[string]any{"prompt": g.Prompt, "sampling": map[string]any{"max_new_tokens": len(g.GeneratedIDs), "temperature": 0}})
	resp, b := post(t, tr.http+"/v1/generate", body, "Authorization", "Bearer "+testKey)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/x-ndjson" {
		t.Errorf("Content-Type = %q", ct)
	}
	if !strings.HasSuffix(string(b), "\n") {
		t.Errorf("the stream does not end with a newline")
	}
	var text strings.Builder
	var last map[string]any
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	for i, line := range lines {
		obj := keys(t, "line", object(t, []byte(line)), "result")
		ev := keys(t, "result", obj["result"], "event")["event"].(map[string]any)
		if i == 0 {
			if ids, _ := ev["prompt_token_ids"].([]any); len(ids) != len(g.PromptIDs) {
				t.Errorf("first event %v, want the prompt's %d ids", ev, len(g.PromptIDs))
			}
		}
		if s, ok := ev["text"].(string); ok {
			text.WriteString(s)
		}
		last = ev
	}
	if text.String() != g.Text {
		t.Errorf("text %q\nwant %q", text.String(), g.Text)
	}
	if last["finish_reason"] != "FINISH_REASON_LENGTH" {
		t.Errorf("last event %v", last)
	}
	tr.idle(t)
}

// TestRouterAuth: with --api-keys-file every API needs the key; health and
// the OpenAPI document do not.
func TestRouterAuth(t *testing.T) {
	tr := startRouter(t)
	for _, c := range []struct {
		method, path, body string
	}{
		{"POST", "/v1/completions", `{"prompt":"x","max_tokens":2}`},
		{"POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"max_tokens":2}`},
		{"GET", "/v1/models", ""},
		{"POST", "/v1/generate", `{"prompt":"x","sampling":{"max_new_tokens":2}}`},
		{"POST", "/v1/complete", `{"prompt":"x","sampling":{"max_new_tokens":2}}`},
		{"GET", "/v1/requests", ""},
	} {
		for _, key := range []string{"", "Bearer sk-wrong", "Bearer " + testKey} {
			req, _ := http.NewRequest(c.method, tr.http+c.path, strings.NewReader(c.body))
			if key != "" {
				req.Header.Set("Authorization", key)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			want := http.StatusUnauthorized
			if key == "Bearer "+testKey {
				want = http.StatusOK
			}
			if resp.StatusCode != want {
				t.Errorf("%s %s with %q: %d %s, want %d", c.method, c.path, key, resp.StatusCode, b, want)
			}
			if strings.Contains(string(b), "sk-") {
				t.Errorf("%s %s: the answer quotes a key: %s", c.method, c.path, b)
			}
		}
	}
	for _, p := range []string{"/health", "/health/ready", "/openapi.json", "/metrics"} {
		resp, err := http.Get(tr.http + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("GET %s without a key: %d", p, resp.StatusCode)
		}
	}
	client := batonv1.NewRouterServiceClient(tr.grpc)
	if _, err := client.ListModels(context.Background(), &batonv1.ListModelsRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("gRPC ListModels without a key: %v", err)
	}
	stream, err := client.Generate(context.Background(), &batonv1.GenerateRequest{Prompt: "x"})
	if err == nil {
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.Unauthenticated {
		t.Errorf("gRPC Generate without a key: %v", err)
	}
	wrong := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer sk-wrong")
	if _, err := client.ListModels(wrong, &batonv1.ListModelsRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("gRPC ListModels with a wrong key: %v", err)
	}
	if _, err := client.ListModels(tr.authed(), &batonv1.ListModelsRequest{}); err != nil {
		t.Errorf("gRPC ListModels with the key: %v", err)
	}
	tr.idle(t)
}

// TestRouterLimits: too many requests in flight get 429 / RESOURCE_EXHAUSTED
// with Retry-After on every API, a duplicate request id 409 /
// ALREADY_EXISTS, and everything is released afterwards.
func TestRouterLimits(t *testing.T) {
	tr := startRouter(t, "--max-concurrent-requests", "2")
	tr.gen.delay.Store(int64(30 * time.Millisecond))
	auth := []string{"Authorization", "Bearer " + testKey}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var open []*http.Response
	for _, id := range []string{"busy-1", "busy-2"} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, tr.http+"/v1/completions",
			strings.NewReader(`{"prompt":"Once upon a time","max_tokens":100,"stream":true}`))
		req.Header.Set("Authorization", "Bearer "+testKey)
		req.Header.Set("X-Request-Id", id)
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%v %v", resp, err)
		}
		readEvent(t, resp)
		open = append(open, resp)
	}

	// The router lists both, with the HTTP client as their peer.
	client := batonv1.NewRouterServiceClient(tr.grpc)
	lr, err := client.ListRequests(tr.authed(), &batonv1.ListRequestsRequest{})
	if err != nil || len(lr.GetRequests()) != 2 {
		t.Fatalf("in flight: %v, %v", lr, err)
	}
	for _, r := range lr.GetRequests() {
		if !strings.HasPrefix(r.GetRequestId(), "busy-") || !strings.HasPrefix(r.GetPeer(), "127.0.0.1:") || r.GetPromptTokens() != 5 {
			t.Errorf("in flight: %v", r)
		}
	}

	resp, b := post(t, tr.http+"/v1/completions", `{"prompt":"x","max_tokens":2}`, auth...)
	checkError(t, resp.StatusCode, object(t, b), http.StatusTooManyRequests, "rate_limit_error", nil)
	if resp.Header.Get("Retry-After") != "1" {
		t.Errorf("Retry-After = %q", resp.Header.Get("Retry-After"))
	}
	resp, _ = post(t, tr.http+"/v1/complete", `{"prompt":"x","sampling":{"max_new_tokens":2}}`, auth...)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "1" {
		t.Errorf("REST over the limit: %d, Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if _, err := client.Complete(tr.authed(), &batonv1.CompleteRequest{Request: &batonv1.GenerateRequest{Prompt: "x"}}); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("gRPC over the limit: %v", err)
	}

	// A request id in flight: free one slot first so the limiter lets the
	// duplicate through to the in-flight table.
	open[1].Body.Close()
	waitUntil(t, 2*time.Second, "busy-2 released", func() bool { return tr.gen.inFlight() == 1 })
	resp, b = post(t, tr.http+"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"max_tokens":2}`,
		"Authorization", "Bearer "+testKey, "X-Request-Id", "busy-1")
	checkError(t, resp.StatusCode, object(t, b), http.StatusConflict, "invalid_request_error", "X-Request-Id")
	_, err = client.Complete(tr.authed(), &batonv1.CompleteRequest{Request: &batonv1.GenerateRequest{RequestId: "busy-1", Prompt: "x"}})
	if status.Code(err) != codes.AlreadyExists {
		t.Errorf("gRPC duplicate id: %v", err)
	}
	open[0].Body.Close()
	tr.idle(t)

	// With the slots free, the same id is accepted again.
	resp, b = post(t, tr.http+"/v1/completions", `{"prompt":"x","max_tokens":2}`, "Authorization", "Bearer "+testKey, "X-Request-Id", "busy-1")
	if resp.StatusCode != 200 {
		t.Errorf("after release: %d %s", resp.StatusCode, b)
	}
	tr.idle(t)
}

// TestRouterBadRequests: refusals through the real router, which validates
// again after the OpenAI layer; and the size limit on the REST gateway.
func TestRouterBadRequests(t *testing.T) {
	tr := startRouter(t, "--max-prompt-tokens", "8", "--max-new-tokens-limit", "50", "--max-new-tokens", "20")
	auth := []string{"Authorization", "Bearer " + testKey}
	for _, c := range []struct {
		path, body string
		status     int
		param      any
	}{
		{"/v1/completions", `{"prompt":"Once upon a time there was a little girl"}`, 400, "prompt"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"Once upon a time there was a little girl"}]}`, 400, "messages"},
		{"/v1/completions", `{"prompt":"x","max_tokens":51}`, 400, "max_tokens"},
		{"/v1/completions", `{"model":"gpt-9","prompt":"x"}`, 404, "model"},
		{"/v1/completions", "{\"prompt\":\"\xff\"}", 400, "prompt"},
		{"/v1/completions", `{"prompt":"` + strings.Repeat("x", 70000) + `"}`, 413, nil},
		{"/v1/generate", `{"prompt":"` + strings.Repeat("x", 70000) + `"}`, 413, nil},
	} {
		resp, b := post(t, tr.http+c.path, c.body, auth...)
		checkError(t, resp.StatusCode, object(t, b), c.status, "invalid_request_error", c.param)
	}
	// The router's own checks, reached over gRPC.
	client := batonv1.NewRouterServiceClient(tr.grpc)
	for _, req := range []*batonv1.GenerateRequest{
		{Prompt: "Once upon a time there was a little girl"},
		{Prompt: "x", Sampling: &batonv1.SamplingParams{MaxNewTokens: 51}},
	} {
		if _, err := client.Complete(tr.authed(), &batonv1.CompleteRequest{Request: req}); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%v: %v", req, err)
		}
	}
	// The default is --max-new-tokens.
	resp, b := post(t, tr.http+"/v1/completions", `{"prompt":"x","temperature":0}`, auth...)
	var out struct {
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		}
	}
	if err := json.Unmarshal(b, &out); err != nil || resp.StatusCode != 200 || out.Usage.CompletionTokens != 20 {
		t.Errorf("default length: %d %s", resp.StatusCode, b)
	}
	tr.idle(t)
}

// TestRouterDisconnect: a client that goes away mid-stream — on the OpenAI
// API or the REST gateway — leaves nothing in flight within 2 s.
func TestRouterDisconnect(t *testing.T) {
	tr := startRouter(t)
	tr.gen.delay.Store(int64(50 * time.Millisecond))
	for _, c := range []struct{ path, body string }{
		{"/v1/completions", `{"prompt":"Once upon a time","max_tokens":100,"stream":true}`},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":100,"stream":true}`},
		{"/v1/generate", `{"prompt":"Once upon a time","sampling":{"max_new_tokens":100}}`},
	} {
		t.Run(c.path, func(t *testing.T) {
			resp := streamRequest(t, tr.http+c.path, c.body, "Authorization", "Bearer "+testKey)
			if c.path == "/v1/generate" {
				if line, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil || !strings.Contains(line, `"result"`) {
					t.Fatalf("first line %q, %v", line, err)
				}
			} else {
				readEvent(t, resp)
			}
			resp.Body.Close()
			if err := tr.gen.waitEnded(t, 2*time.Second); status.Code(err) != codes.Canceled {
				t.Errorf("the worker's generation ended with %v, want CANCELED", err)
			}
			tr.idle(t)
		})
	}
}

// TestRouterTimeout: --request-timeout ends a request with 504 (and the
// deadline reaches the worker).
func TestRouterTimeout(t *testing.T) {
	tr := startRouter(t, "--request-timeout", "300ms")
	tr.gen.delay.Store(int64(100 * time.Millisecond))
	resp, b := post(t, tr.http+"/v1/completions", `{"prompt":"Once upon a time","max_tokens":50}`, "Authorization", "Bearer "+testKey)
	e := checkError(t, resp.StatusCode, object(t, b), http.StatusGatewayTimeout, "server_error", nil)
	if e["code"] != "timeout" {
		t.Errorf("code = %v", e["code"])
	}
	if err := tr.gen.waitEnded(t, 2*time.Second); status.Code(err) != codes.DeadlineExceeded && status.Code(err) != codes.Canceled {
		t.Errorf("the worker's generation ended with %v", err)
	}
	tr.idle(t)
}

// TestOpenAPIDocument validates the served /openapi.json as OpenAPI v2: it
// must parse as a Swagger 2.0 document, convert to OpenAPI 3 and pass that
// model's validation, with every REST route present.
func TestOpenAPIDocument(t *testing.T) {
	tr := startRouter(t)
	resp, err := http.Get(tr.http + "/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q", ct)
	}
	var doc2 openapi2.T
	if err := json.Unmarshal(b, &doc2); err != nil {
		t.Fatal(err)
	}
	if doc2.Swagger != "2.0" || doc2.Info.Title == "" || doc2.Info.Version == "" {
		t.Errorf("swagger %q, info %+v", doc2.Swagger, doc2.Info)
	}
	for _, p := range []string{"/v1/generate", "/v1/complete", "/v1/models", "/v1/requests", "/v1/requests/{request_id}:abort"} {
		if doc2.Paths[p] == nil {
			t.Errorf("path %s missing", p)
		}
	}
	doc3, err := openapi2conv.ToV3(&doc2)
	if err != nil {
		t.Fatal(err)
	}
	if err := doc3.Validate(context.Background()); err != nil {
		t.Errorf("invalid OpenAPI document: %v", err)
	}
	var bad openapi2.T
	if err := json.Unmarshal([]byte(`{"swagger":"2.0","info":{"title":"x","version":"1"},"paths":{"/a":{"get":{"responses":{"200":{"description":"ok","schema":{"$ref":"#/definitions/missing"}}}}}}}`), &bad); err != nil {
		t.Fatal(err)
	}
	d, err := openapi2conv.ToV3(&bad)
	if err == nil {
		err = d.Validate(context.Background())
	}
	if err == nil {
		t.Error("the validator accepted a dangling $ref")
	}
}

// TestRouterChatTemplateFile: --chat-template-file replaces the model's
// template; one that does not compile stops the router at start-up, naming
// the flag.
func TestRouterChatTemplateFile(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "chatml.jinja")
	if err := os.WriteFile(good, []byte(smolLMTemplate), 0o600); err != nil {
		t.Fatal(err)
	}
	tr := startRouter(t, "--chat-template-file", good)
	resp, b := post(t, tr.http+"/v1/chat/completions", `{"max_tokens":2,"messages":[{"role":"user","content":"Hi"}]}`, "Authorization", "Bearer "+testKey)
	var out struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		}
	}
	// "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n" is many more
	// tokens than the plain default's "Hi" (BOS + 1).
	if err := json.Unmarshal(b, &out); err != nil || resp.StatusCode != 200 || out.Usage.PromptTokens < 10 {
		t.Errorf("%d %s", resp.StatusCode, b)
	}

	bad := filepath.Join(dir, "broken.jinja")
	if err := os.WriteFile(bad, []byte("{% for m in messages %}"), 0o600); err != nil {
		t.Fatal(err)
	}
	svc := router.New()
	fs := flag.NewFlagSet("router-svc", flag.ContinueOnError)
	svc.AddFlags(fs)
	if err := fs.Parse([]string{"--model", refdata.Model(t), "--chat-template-file", bad}); err != nil {
		t.Fatal(err)
	}
	if err := svc.Validate(); err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.DiscardHandler)
	err := svc.Open(context.Background(), &svckit.Deps{Logger: logger})
	if err == nil || !strings.Contains(err.Error(), "--chat-template-file") {
		t.Errorf("Open with a broken template: %v", err)
	}
}
