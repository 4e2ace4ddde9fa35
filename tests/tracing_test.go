//go:build e2e

package tests

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// jaegerEnv returns Jaeger's query API base URL (BATON_JAEGER_QUERY, e.g.
// http://127.0.0.1:16686) and OTLP/gRPC endpoint (BATON_JAEGER_OTLP,
// default http://127.0.0.1:4317). scripts/test.sh starts Jaeger and sets
// them; without them the test is skipped, except in CI where it fails.
func jaegerEnv(t *testing.T) (query, otlp string) {
	t.Helper()
	query = os.Getenv("BATON_JAEGER_QUERY")
	if query == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("BATON_JAEGER_QUERY is not set in CI: scripts/test.sh starts Jaeger for the e2e suite")
		}
		t.Skip("BATON_JAEGER_QUERY not set: no Jaeger to check traces against (scripts/test.sh starts one)")
	}
	otlp = os.Getenv("BATON_JAEGER_OTLP")
	if otlp == "" {
		otlp = "http://127.0.0.1:4317"
	}
	resp, err := http.Get(query + "/api/services")
	if err != nil {
		t.Fatalf("Jaeger query API at %s: %v", query, err)
	}
	resp.Body.Close()
	return query, otlp
}

// tracedEnv is the environment of services that export to Jaeger quickly.
func tracedEnv(otlp string) []string {
	return []string{
		"OTEL_EXPORTER_OTLP_ENDPOINT=" + otlp,
		"OTEL_BSP_SCHEDULE_DELAY=50", // ms: spans reach Jaeger soon after they end
		"OTEL_TRACES_SAMPLER=parentbased_always_on",
	}
}

// newTraceparent returns a W3C traceparent for a new sampled trace, and its
// trace id.
func newTraceparent(t testing.TB) (header, traceID string) {
	t.Helper()
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	traceID = hex.EncodeToString(b[:16])
	return "00-" + traceID + "-" + hex.EncodeToString(b[16:]) + "-01", traceID
}

// Jaeger's JSON (GET /api/traces/{id}).
type jaegerTrace struct {
	Spans     []jaegerSpan             `json:"spans"`
	Processes map[string]jaegerProcess `json:"processes"`
}

type jaegerProcess struct {
	ServiceName string `json:"serviceName"`
}

type jaegerSpan struct {
	SpanID        string `json:"spanID"`
	OperationName string `json:"operationName"`
	References    []struct {
		RefType string `json:"refType"`
		SpanID  string `json:"spanID"`
	} `json:"references"`
	Tags      []jaegerKV                    `json:"tags"`
	Logs      []struct{ Fields []jaegerKV } `json:"logs"`
	ProcessID string                        `json:"processID"`
	StartTime int64                         `json:"startTime"` // µs
	Duration  int64                         `json:"duration"`  // µs

	service string
	parent  *jaegerSpan
}

type jaegerKV struct {
	Key   string `json:"key"`
	Value any    `json:"value"`
}

func (s *jaegerSpan) tag(key string) (string, bool) {
	for _, kv := range s.Tags {
		if kv.Key == key {
			return fmt.Sprint(kv.Value), true
		}
	}
	return "", false
}

// events returns the span's events by name, each as its fields.
func (s *jaegerSpan) events(name string) []map[string]string {
	var out []map[string]string
	for _, l := range s.Logs {
		f := map[string]string{}
		for _, kv := range l.Fields {
			f[kv.Key] = fmt.Sprint(kv.Value)
		}
		if f["event"] == name {
			out = append(out, f)
		}
	}
	return out
}

// spanTree is one trace with its spans linked to their parents.
type spanTree struct {
	spans []*jaegerSpan
}

func (tr *spanTree) named(service, name string) []*jaegerSpan {
	var out []*jaegerSpan
	for _, s := range tr.spans {
		if s.service == service && s.OperationName == name {
			out = append(out, s)
		}
	}
	return out
}

func (tr *spanTree) String() string {
	var b strings.Builder
	var walk func(p *jaegerSpan, depth int)
	walk = func(p *jaegerSpan, depth int) {
		for _, s := range tr.spans {
			if s.parent == p {
				fmt.Fprintf(&b, "%s%s %s (%dµs)\n", strings.Repeat("  ", depth), s.service, s.OperationName, s.Duration)
				walk(s, depth+1)
			}
		}
	}
	walk(nil, 0)
	return b.String()
}

// fetchTrace gets a trace from Jaeger's query API; nil while Jaeger has none.
func fetchTrace(t testing.TB, query, traceID string) *spanTree {
	t.Helper()
	resp, err := http.Get(query + "/api/traces/" + traceID)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return nil
	}
	var body struct {
		Data []jaegerTrace `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatalf("Jaeger's answer for %s: %v", traceID, err)
	}
	if len(body.Data) == 0 {
		return nil
	}
	tr := &spanTree{}
	byID := map[string]*jaegerSpan{}
	for _, d := range body.Data {
		for i := range d.Spans {
			s := &d.Spans[i]
			s.service = d.Processes[s.ProcessID].ServiceName
			byID[s.SpanID] = s
			tr.spans = append(tr.spans, s)
		}
	}
	for _, s := range tr.spans {
		for _, r := range s.References {
			if r.RefType == "CHILD_OF" {
				s.parent = byID[r.SpanID]
			}
		}
	}
	return tr
}

// awaitTrace polls Jaeger until the trace satisfies done (exports are
// batched) and returns it.
func awaitTrace(t testing.TB, query, traceID string, done func(*spanTree) bool) *spanTree {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		tr := fetchTrace(t, query, traceID)
		if tr != nil && done(tr) {
			return tr
		}
		if time.Now().After(deadline) {
			if tr == nil {
				t.Fatalf("trace %s not in Jaeger after 30s", traceID)
			}
			t.Fatalf("trace %s incomplete after 30s:\n%s", traceID, tr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// storySpans are the spans that tell a PD request's story, by service.
var storySpans = map[string][]string{
	"router-svc":  {"route", "stream"},
	"decode-svc":  {"prealloc_wait", "kv_receive", "decode"},
	"prefill-svc": {"queue_wait", "forward", "kv_send"},
}

func hasStory(tr *spanTree) bool {
	for svc, names := range storySpans {
		for _, n := range names {
			if len(tr.named(svc, n)) == 0 {
				return false
			}
		}
	}
	return true
}

// one returns the only span of a name, failing the test otherwise.
func one(t *testing.T, tr *spanTree, service, name string) *jaegerSpan {
	t.Helper()
	ss := tr.named(service, name)
	if len(ss) != 1 {
		t.Fatalf("%d %s spans named %q, want 1:\n%s", len(ss), service, name, tr)
	}
	return ss[0]
}

// wantParent checks that span's parent is named parent in service.
func wantParent(t *testing.T, s *jaegerSpan, service, parent string) *jaegerSpan {
	t.Helper()
	p := s.parent
	if p == nil || p.service != service || p.OperationName != parent {
		got := "none"
		if p != nil {
			got = p.service + " " + p.OperationName
		}
		t.Errorf("%s %s: parent %s, want %s %s", s.service, s.OperationName, got, service, parent)
		return nil
	}
	return p
}

// wantTags checks that span has every tag, with the value given unless it
// is "" (then any value does), and that numeric ones named in positive are
// above 0.
func wantTags(t *testing.T, s *jaegerSpan, want map[string]string, positive ...string) {
	t.Helper()
	for k, v := range want {
		got, ok := s.tag(k)
		switch {
		case !ok:
			t.Errorf("%s %s: no attribute %s", s.service, s.OperationName, k)
		case v != "" && got != v:
			t.Errorf("%s %s: %s = %s, want %s", s.service, s.OperationName, k, got, v)
		}
	}
	for _, k := range positive {
		got, _ := s.tag(k)
		if n, err := strconv.ParseFloat(got, 64); err != nil || n <= 0 {
			t.Errorf("%s %s: %s = %q, want > 0", s.service, s.OperationName, k, got)
		}
	}
}

// TestTraceAcrossServices: one generation through the router is one trace in
// Jaeger, found by the trace id its caller sent, with the router's, decode's
// and prefill's spans in order and their attributes; every log line about
// the request carries its trace id; a cancelled request's trace shows where
// it was aborted; and an OpenAI request's traceparent is honoured too.
func TestTraceAcrossServices(t *testing.T) {
	query, otlp := jaegerEnv(t)
	g := loadGolden(t)
	debug := []string{"--log-level", "debug"}
	c := startClusterEnv(t, tracedEnv(otlp), map[string][]string{"prefill": debug, "decode": debug, "router": debug})
	client := c.client(t, c.router)
	gen := g.Generations[0]

	tp, traceID := newTraceparent(t)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "traceparent", tp)
	const n = 40 // more than tracing.TokenEventEvery
	req := greedy(gen.Prompt, n)
	req.Sampling.IgnoreEos = true
	resp, err := complete(ctx, client, req)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetTokenIds()) != n {
		t.Fatalf("%d tokens, want %d", len(resp.GetTokenIds()), n)
	}
	tr := awaitTrace(t, query, traceID, hasStory)
	t.Logf("trace %s:\n%s", traceID, tr)

	// The router: its RPC span, then route, then stream, then the decode
	// call.
	route := one(t, tr, "router-svc", "route")
	rpc := wantParent(t, route, "router-svc", "baton.v1.RouterService/Complete")
	if rpc != nil {
		wantTags(t, rpc, map[string]string{"baton.request_id": resp.GetRequestId()})
	}
	wantTags(t, route, map[string]string{"baton.prefill": c.prefill.grpc, "baton.decode": c.decode.grpc,
		"baton.policy": "least-load/least-load", "baton.attempt": "0", "baton.retry": "false"})
	stream := one(t, tr, "router-svc", "stream")
	wantParent(t, stream, "router-svc", "route")
	wantTags(t, stream, map[string]string{"baton.tokens": strconv.Itoa(n)})

	// Decode: its RPC span under the router's call, with the three stages.
	dec := one(t, tr, "decode-svc", "decode")
	decRPC := wantParent(t, dec, "decode-svc", "baton.v1.DecodeService/Generate")
	if decRPC != nil {
		wantParent(t, decRPC, "router-svc", "baton.v1.DecodeService/Generate") // the client span
		if decRPC.parent != nil {
			wantParent(t, decRPC.parent, "router-svc", "stream")
		}
		wantTags(t, decRPC, map[string]string{"baton.request_id": resp.GetRequestId()})
	}
	wait := one(t, tr, "decode-svc", "prealloc_wait")
	wantParent(t, wait, "decode-svc", "baton.v1.DecodeService/Generate")
	wantTags(t, wait, nil, "baton.kv.pages")
	recv := one(t, tr, "decode-svc", "kv_receive")
	wantParent(t, recv, "decode-svc", "baton.v1.DecodeService/Generate")
	wantTags(t, recv, map[string]string{"baton.prefill": c.prefill.grpc}, "baton.kv.bytes", "baton.kv.chunks", "baton.kv.pages", "baton.prompt_tokens")
	wantTags(t, dec, map[string]string{"baton.tokens": strconv.Itoa(n), "baton.mode": "pd", "baton.finish_reason": "FINISH_REASON_LENGTH"})
	if len(dec.events("first_token")) != 1 || len(dec.events("tokens")) != n/32 {
		t.Errorf("decode span events: %d first_token, %d tokens; want 1 and %d", len(dec.events("first_token")), len(dec.events("tokens")), n/32)
	}
	if !(wait.StartTime <= recv.StartTime && recv.StartTime+recv.Duration <= dec.StartTime+dec.Duration) {
		t.Errorf("stages out of order: prealloc_wait at %d, kv_receive at %d+%d, decode at %d+%d",
			wait.StartTime, recv.StartTime, recv.Duration, dec.StartTime, dec.Duration)
	}

	// Prefill: its TransferKV span under decode's kv_receive.
	send := one(t, tr, "prefill-svc", "kv_send")
	pre := wantParent(t, send, "prefill-svc", "baton.v1.PrefillService/TransferKV")
	if pre != nil {
		wantParent(t, pre, "decode-svc", "baton.v1.PrefillService/TransferKV")
		if pre.parent != nil {
			wantParent(t, pre.parent, "decode-svc", "kv_receive")
		}
		wantTags(t, pre, map[string]string{"baton.request_id": resp.GetRequestId()}, "baton.prompt_tokens")
	}
	wantTags(t, send, nil, "baton.kv.bytes", "baton.kv.chunks")
	recvBytes, _ := recv.tag("baton.kv.bytes")
	if sent, _ := send.tag("baton.kv.bytes"); sent != recvBytes {
		t.Errorf("prefill sent %s bytes, decode received %s", sent, recvBytes)
	}
	queue := one(t, tr, "prefill-svc", "queue_wait")
	wantParent(t, queue, "prefill-svc", "baton.v1.PrefillService/TransferKV")
	forwards := tr.named("prefill-svc", "forward")
	tokens := 0
	for _, f := range forwards {
		wantParent(t, f, "prefill-svc", "baton.v1.PrefillService/TransferKV")
		wantTags(t, f, nil, "baton.batch.seqs", "baton.batch.tokens")
		v, _ := f.tag("baton.tokens")
		k, _ := strconv.Atoi(v)
		tokens += k
		if f.StartTime < queue.StartTime+queue.Duration {
			t.Errorf("a forward step starts before queue_wait ends")
		}
	}
	if want := len(resp.GetPromptTokenIds()); tokens != want {
		t.Errorf("forward spans computed %d prompt tokens, want %d", tokens, want)
	}
	if last := forwards[len(forwards)-1]; len(last.events("first_token")) != 1 {
		t.Errorf("the last forward span has no first_token event")
	}
	for _, s := range tr.spans {
		if len(s.events("abort")) > 0 {
			t.Errorf("%s %s has an abort event in a request that finished", s.service, s.OperationName)
		}
	}

	// Logs: every line about the request names its trace and span.
	for _, nd := range []node{c.router, c.decode, c.prefill} {
		lines := 0
		sc := bufio.NewScanner(strings.NewReader(nd.p.Stderr()))
		for sc.Scan() {
			var rec map[string]any
			if json.Unmarshal(sc.Bytes(), &rec) != nil || rec["request_id"] != resp.GetRequestId() {
				continue
			}
			lines++
			if rec["trace_id"] != traceID || rec["span_id"] == nil {
				t.Errorf("%s log line without the request's trace: %s", nd.name, sc.Text())
			}
		}
		if lines == 0 {
			t.Errorf("%s logged nothing about request %s at debug level", nd.name, resp.GetRequestId())
		}
	}

	t.Run("cancelled", func(t *testing.T) { cancelledTrace(t, c, query) })
	t.Run("openai", func(t *testing.T) { openAITrace(t, c, query) })
}

// cancelledTrace cancels a request mid-decode; its trace must carry abort
// events naming the stage: the router's stream, decode's decode. While it
// runs, the router and decode list it with its trace id.
func cancelledTrace(t *testing.T, c *cluster, query string) {
	client := c.client(t, c.router)
	worker := batonv1.NewWorkerServiceClient(dial(t, c.decode.grpc))
	for try := 0; ; try++ {
		tp, traceID := newTraceparent(t)
		ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(context.Background(), "traceparent", tp))
		req := greedy("Once upon a time", 480)
		req.Sampling.IgnoreEos = true
		stream, err := client.Generate(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		var id string
		for id == "" {
			ev, err := stream.Recv()
			if err != nil {
				t.Fatal(err)
			}
			if len(ev.GetEvent().GetTokenIds()) > 0 {
				id = ev.GetEvent().GetRequestId()
			}
		}
		listed, err := client.ListRequests(context.Background(), &batonv1.ListRequestsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		wlisted, err := worker.ListRequests(context.Background(), &batonv1.WorkerServiceListRequestsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		cancel()
		for err == nil {
			_, err = stream.Recv()
		}
		if status.Code(err) != codes.Canceled {
			if try < 3 {
				continue // it finished before the cancel landed
			}
			t.Fatalf("the request was never cancelled mid-decode: %v", err)
		}
		for what, reqs := range map[string][]*batonv1.RequestInfo{"router": listed.GetRequests(), "decode": wlisted.GetRequests()} {
			i := slices.IndexFunc(reqs, func(r *batonv1.RequestInfo) bool { return r.GetRequestId() == id })
			if i < 0 {
				t.Errorf("%s's ListRequests does not list %s mid-flight", what, id)
			} else if reqs[i].GetTraceId() != traceID {
				t.Errorf("%s lists %s with trace id %q, want %q", what, id, reqs[i].GetTraceId(), traceID)
			}
		}
		abortAt := func(service, name, stage string) func(*spanTree) bool {
			return func(tr *spanTree) bool {
				for _, s := range tr.named(service, name) {
					for _, ev := range s.events("abort") {
						if ev["stage"] == stage && ev["reason"] != "" {
							return true
						}
					}
				}
				return false
			}
		}
		routerAbort, decodeAbort := abortAt("router-svc", "route", "stream"), abortAt("decode-svc", "decode", "decode")
		tr := awaitTrace(t, query, traceID, func(tr *spanTree) bool { return routerAbort(tr) && decodeAbort(tr) })
		t.Logf("cancelled request's trace %s:\n%s", traceID, tr)
		for _, s := range tr.named("decode-svc", "decode") {
			for _, ev := range s.events("abort") {
				t.Logf("decode abort event: %v", ev)
			}
		}
		return
	}
}

// openAITrace: an OpenAI completion with a traceparent header joins the
// caller's trace: the router's HTTP span leads to route and on to decode.
func openAITrace(t *testing.T, c *cluster, query string) {
	tp, traceID := newTraceparent(t)
	body := `{"model":"stories260K","prompt":"Once upon a time","max_tokens":4,"temperature":0}`
	req, err := http.NewRequest("POST", "http://"+c.router.http+"/v1/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("traceparent", tp)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /v1/completions: %s", resp.Status)
	}
	tr := awaitTrace(t, query, traceID, hasStory)
	route := one(t, tr, "router-svc", "route")
	wantParent(t, route, "router-svc", "POST /v1/completions")
}

// TestTracingCollectorDown: with the trace collector unreachable, requests
// are unaffected and each service logs the export failure a bounded number
// of times (rate-limited), not once per span or batch.
func TestTracingCollectorDown(t *testing.T) {
	g := loadGolden(t)
	down := freePorts(t, 1)[0] // nothing listens there
	c := startClusterEnv(t, tracedEnv("http://127.0.0.1:"+strconv.Itoa(down)), nil)
	client := c.client(t, c.router)
	for i := range 10 {
		gen := g.Generations[i%len(g.Generations)]
		resp, err := complete(context.Background(), client, greedy(gen.Prompt, uint32(len(gen.GeneratedIDs))))
		if err != nil {
			t.Fatalf("request %d with the collector down: %v", i, err)
		}
		if !slices.Equal(resp.GetTokenIds(), u32s(gen.GeneratedIDs)) {
			t.Errorf("request %d: %v, want %v", i, resp.GetTokenIds(), gen.GeneratedIDs)
		}
	}
	time.Sleep(time.Second) // several export attempts (every 50 ms)
	for _, n := range []node{c.router, c.decode, c.prefill} {
		if k := strings.Count(n.p.Stderr(), "opentelemetry error"); k > 2 {
			t.Errorf("%s logged %d export errors in a few seconds, want at most 2:\n%s", n.name, k, n.p.Stderr())
		}
	}
}
