package backend

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

func TestReadSSE(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     []string
	}{
		{"plain", "data: a\n\ndata: b\n\n", []string{"a", "b"}},
		{"crlf and comments", ": hi\r\ndata: a\r\n\r\nevent: x\r\ndata:b\r\n\r\n", []string{"a", "b"}},
		{"multi-line", "data: a\ndata: b\n\n", []string{"a\nb"}},
		{"no final blank line", "data: a\n\ndata: [DONE]", []string{"a", "[DONE]"}},
		{"blank lines only", "\n\n\n", nil},
	} {
		var got []string
		err := readSSE(strings.NewReader(tc.in), func(d []byte) error { got = append(got, string(d)); return nil })
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: got %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
	n := 0
	err := readSSE(strings.NewReader("data: a\n\ndata: b\n\n"), func([]byte) error { n++; return errStop })
	if err != nil || n != 1 {
		t.Errorf("errStop: %d events, %v", n, err)
	}
}

// openAIServer answers /v1/models and streams /v1/completions with the
// events a test gives, recording the request bodies.
type openAIServer struct {
	mu     sync.Mutex
	bodies []map[string]any
	auth   []string
	status int
	events []string
}

func (s *openAIServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.auth = append(s.auth, r.Header.Get("Authorization"))
	s.mu.Unlock()
	switch r.URL.Path {
	case "/v1/models":
		fmt.Fprint(w, `{"object":"list","data":[{"id":"m","object":"model","vocab_size":512,"context_length":128,"fingerprint":"fp"}]}`)
	case "/v1/completions":
		var body map[string]any
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		s.mu.Lock()
		s.bodies = append(s.bodies, body)
		s.mu.Unlock()
		if s.status != 0 {
			w.WriteHeader(s.status)
			fmt.Fprint(w, `{"error":{"message":"too many\nrequests","type":"rate_limit_error"}}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for _, e := range s.events {
			fmt.Fprintf(w, "data: %s\n\n", e)
			w.(http.Flusher).Flush()
		}
	default:
		http.NotFound(w, r)
	}
}

func chunk(text string, finish string, usage string) string {
	fr := "null"
	if finish != "" {
		fr = `"` + finish + `"`
	}
	if usage == "" {
		usage = "null"
	}
	return fmt.Sprintf(`{"id":"c","object":"text_completion","choices":[{"text":%q,"index":0,"finish_reason":%s}],"usage":%s}`, text, fr, usage)
}

func TestOpenAIGenerate(t *testing.T) {
	srv := &openAIServer{events: []string{
		chunk("Once", "", ""), chunk(" upon", "", ""), chunk("", "length", ""),
		`{"id":"c","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7,"prompt_tokens_details":{"cached_tokens":2}}}`, "[DONE]",
	}}
	ts := httptest.NewServer(srv)
	defer ts.Close()
	o, err := NewOpenAI(strings.TrimPrefix(ts.URL, "http://"), "key", 4)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	m, err := o.Model(context.Background())
	if err != nil || m != (Model{ID: "m", VocabSize: 512, ContextLength: 128, Fingerprint: "fp"}) {
		t.Fatalf("Model = %+v, %v", m, err)
	}
	var got []int
	res, err := o.Generate(context.Background(), Request{PromptIDs: []int32{1, 5, 9}, MaxTokens: 4, IgnoreEOS: true, Temperature: 0.5, Seed: 7},
		func(n int) { got = append(got, n) })
	if err != nil {
		t.Fatal(err)
	}
	if want := (Result{InputTokens: 3, OutputTokens: 4, FinishReason: "length", CachedTokens: 2}); res != want {
		t.Errorf("Result = %+v, want %+v", res, want)
	}
	if !reflect.DeepEqual(got, []int{0, 0}) {
		t.Errorf("chunks %v, want two text chunks of unknown size", got)
	}
	body := srv.bodies[0]
	for k, v := range map[string]any{"model": "m", "max_tokens": 4.0, "ignore_eos": true, "stream": true, "temperature": 0.5, "seed": 7.0,
		"prompt": []any{1.0, 5.0, 9.0}, "stream_options": map[string]any{"include_usage": true}} {
		if !reflect.DeepEqual(body[k], v) {
			t.Errorf("request %s = %v, want %v", k, body[k], v)
		}
	}
	if srv.auth[1] != "Bearer key" {
		t.Errorf("Authorization %q", srv.auth[1])
	}
}

func TestOpenAIFailures(t *testing.T) {
	for _, tc := range []struct {
		name   string
		srv    *openAIServer
		substr string
	}{
		{"refused", &openAIServer{status: 429}, "http 429: too many requests"},
		{"stream error", &openAIServer{events: []string{chunk("a", "", ""), `{"error":{"message":"decode died"}}`}}, "stream error: decode died"},
		{"no done", &openAIServer{events: []string{chunk("a", "stop", "")}}, "without [DONE]"},
		{"no finish", &openAIServer{events: []string{chunk("a", "", ""), "[DONE]"}}, "without a finish reason"},
		{"bad json", &openAIServer{events: []string{"{"}}, "bad event"},
	} {
		ts := httptest.NewServer(tc.srv)
		o, _ := NewOpenAI(ts.URL+"/", "", 1)
		_, err := o.Generate(context.Background(), Request{PromptIDs: []int32{1}, MaxTokens: 1}, func(int) {})
		if err == nil || !strings.Contains(err.Error(), tc.substr) {
			t.Errorf("%s: error %v, want one containing %q", tc.name, err, tc.substr)
		}
		o.Close()
		ts.Close()
	}
	if _, err := NewOpenAI("ftp://x", "", 1); err == nil {
		t.Error("ftp URL accepted")
	}
}

func TestOpenAIWithoutUsage(t *testing.T) {
	ts := httptest.NewServer(&openAIServer{events: []string{chunk("a", "", ""), chunk("b", "", ""), chunk("", "stop", ""), "[DONE]"}})
	defer ts.Close()
	o, _ := NewOpenAI(ts.URL, "", 1)
	res, err := o.Generate(context.Background(), Request{PromptIDs: []int32{1, 2}, MaxTokens: 8}, func(int) {})
	if err != nil || res != (Result{InputTokens: 2, OutputTokens: 2, FinishReason: "stop"}) {
		t.Errorf("got %+v, %v", res, err)
	}
}

// routerServer streams scripted events.
type routerServer struct {
	batonv1.UnimplementedRouterServiceServer
	mu     sync.Mutex
	reqs   []*batonv1.GenerateRequest
	auth   []string
	events []*batonv1.GenerateEvent
	err    error
}

func (s *routerServer) ListModels(context.Context, *batonv1.ListModelsRequest) (*batonv1.ListModelsResponse, error) {
	return &batonv1.ListModelsResponse{Object: "list", Data: []*batonv1.ModelInfo{{Id: "m", VocabSize: 512, ContextLength: 128, Fingerprint: "fp"}}}, nil
}

func (s *routerServer) Generate(req *batonv1.GenerateRequest, stream grpc.ServerStreamingServer[batonv1.GenerateResponse]) error {
	md, _ := metadata.FromIncomingContext(stream.Context())
	s.mu.Lock()
	s.reqs = append(s.reqs, req)
	s.auth = append(s.auth, strings.Join(md.Get("authorization"), ","))
	s.mu.Unlock()
	for _, ev := range s.events {
		if err := stream.Send(&batonv1.GenerateResponse{Event: ev}); err != nil {
			return err
		}
	}
	return s.err
}

func startRouter(t *testing.T, s *routerServer) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	batonv1.RegisterRouterServiceServer(srv, s)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

func TestGRPCGenerate(t *testing.T) {
	s := &routerServer{events: []*batonv1.GenerateEvent{
		{RequestId: "r", PromptTokenIds: []uint32{1, 5, 9}},
		{TokenIds: []uint32{7}, Text: "a"},
		{TokenIds: []uint32{8, 9}, Text: ""},
		{TokenIds: []uint32{4}, FinishReason: batonv1.FinishReason_FINISH_REASON_LENGTH,
			Usage:  &batonv1.Usage{PromptTokens: 3, CompletionTokens: 4, CachedTokens: 2},
			Timing: &batonv1.Timing{TimeToFirstTokenSeconds: 0.125, KvTransferBytes: 4096, PrefillSeconds: 0.25, KvTransferSeconds: 0.0625}},
	}}
	b, err := New(Options{Kind: "grpc", Addr: startRouter(t, s), APIKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if m, err := b.Model(context.Background()); err != nil || m.ID != "m" || m.VocabSize != 512 || m.ContextLength != 128 {
		t.Fatalf("Model = %+v, %v", m, err)
	}
	var got []int
	res, err := b.Generate(context.Background(), Request{PromptIDs: []int32{1, 5, 9}, MaxTokens: 4, IgnoreEOS: true, Seed: 3},
		func(n int) { got = append(got, n) })
	if err != nil {
		t.Fatal(err)
	}
	if want := (Result{InputTokens: 3, OutputTokens: 4, ServerTTFT: 0.125, FinishReason: "length",
		CachedTokens: 2, KVTransferBytes: 4096, HasKVTransferBytes: true, Stages: res.Stages}); res != want || res.Stages == nil ||
		*res.Stages != (Stages{Prefill: 0.25, KVTransfer: 0.0625}) {
		t.Errorf("Result = %+v, want %+v", res, want)
	}
	if !reflect.DeepEqual(got, []int{1, 2, 1}) {
		t.Errorf("chunks %v, want [1 2 1]", got)
	}
	r := s.reqs[0]
	sp := r.GetSampling()
	if !reflect.DeepEqual(r.GetPromptTokenIds(), []uint32{1, 5, 9}) || sp.GetMaxNewTokens() != 4 || !sp.GetIgnoreEos() ||
		sp.GetTemperature() != 0 || sp.Temperature == nil || sp.GetSeed() != 3 || !r.GetStreamOptions().GetIncludeUsage() {
		t.Errorf("request sent: %v", r)
	}
	if s.auth[0] != "Bearer k" {
		t.Errorf("authorization metadata %q", s.auth[0])
	}
}

func TestGRPCFailures(t *testing.T) {
	for _, tc := range []struct {
		name   string
		srv    *routerServer
		substr string
	}{
		{"status", &routerServer{err: status.Error(codes.ResourceExhausted, "queue\nfull")}, "grpc resource_exhausted: queue full"},
		{"abort", &routerServer{events: []*batonv1.GenerateEvent{{TokenIds: []uint32{1}},
			{FinishReason: batonv1.FinishReason_FINISH_REASON_ABORT}}}, "aborted"},
		{"unfinished", &routerServer{events: []*batonv1.GenerateEvent{{TokenIds: []uint32{1}}}}, "without a finish reason"},
	} {
		b, _ := NewGRPC(startRouter(t, tc.srv), "")
		_, err := b.Generate(context.Background(), Request{PromptIDs: []int32{1}, MaxTokens: 1}, func(int) {})
		if err == nil || !strings.Contains(err.Error(), tc.substr) {
			t.Errorf("%s: error %v, want one containing %q", tc.name, err, tc.substr)
		}
		b.Close()
	}
	b, _ := NewGRPC("127.0.0.1:1", "")
	defer b.Close()
	if _, err := b.Generate(context.Background(), Request{PromptIDs: []int32{-1}}, func(int) {}); err == nil {
		t.Error("negative token id sent")
	}
	if _, err := New(Options{Kind: "rest"}); err == nil {
		t.Error("unknown backend accepted")
	}
}

// TestOpenAICacheN: llama-server reports its prompt cache's reuse as
// timings.cache_n rather than in the usage.
func TestOpenAICacheN(t *testing.T) {
	srv := &openAIServer{events: []string{
		chunk("Once", "", ""), chunk("", "length", ""),
		`{"id":"c","choices":[],"usage":{"prompt_tokens":30,"completion_tokens":2,"total_tokens":32},"timings":{"cache_n":16,"prompt_n":14}}`, "[DONE]",
	}}
	ts := httptest.NewServer(srv)
	defer ts.Close()
	o, err := NewOpenAI(strings.TrimPrefix(ts.URL, "http://"), "", 4)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	res, err := o.Generate(context.Background(), Request{PromptIDs: []int32{1, 5, 9}, MaxTokens: 2}, func(int) {})
	if err != nil || res.CachedTokens != 16 {
		t.Fatalf("Result = %+v, %v; want 16 cached tokens", res, err)
	}
	// Older llama-servers say only how many prompt tokens they computed.
	srv.events[2] = `{"id":"c","choices":[],"usage":{"prompt_tokens":30,"completion_tokens":2,"total_tokens":32},"timings":{"prompt_n":10}}`
	res, err = o.Generate(context.Background(), Request{PromptIDs: []int32{1, 5, 9}, MaxTokens: 2}, func(int) {})
	if err != nil || res.CachedTokens != 20 {
		t.Fatalf("Result = %+v, %v; want 20 cached tokens", res, err)
	}
}

// TestOpenAIRetriesOnClosedIdleConnection: a server that closes a
// kept-alive connection as the next request arrives, without answering it
// (an idle timeout racing the request), costs that request nothing: it is
// sent again on a new connection.
func TestOpenAIRetriesOnClosedIdleConnection(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	body := "data: " + chunk("Once", "length", `{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}`) + "\n\ndata: [DONE]\n\n"
	answer := func(conn net.Conn, r *bufio.Reader) error {
		req, err := http.ReadRequest(r)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, req.Body)
		_, err = fmt.Fprintf(conn, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		return err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		// First connection: one answer, then the next request is read
		// and the connection closed without a response.
		c1, err := lis.Accept()
		if err != nil {
			return
		}
		r1 := bufio.NewReader(c1)
		if answer(c1, r1) != nil {
			c1.Close()
			return
		}
		if req, err := http.ReadRequest(r1); err == nil {
			_, _ = io.Copy(io.Discard, req.Body)
		}
		c1.Close()
		// The retry comes on a second connection.
		c2, err := lis.Accept()
		if err != nil {
			return
		}
		defer c2.Close()
		_ = answer(c2, bufio.NewReader(c2))
	}()
	o, err := NewOpenAI(lis.Addr().String(), "", 1)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	o.model = "m" // skip /v1/models: the raw server answers completions only
	for i := range 2 {
		if res, err := o.Generate(context.Background(), Request{PromptIDs: []int32{1, 5, 9}, MaxTokens: 1}, func(int) {}); err != nil || res.OutputTokens != 1 {
			t.Fatalf("request %d: %+v, %v", i, res, err)
		}
	}
	<-done
}
