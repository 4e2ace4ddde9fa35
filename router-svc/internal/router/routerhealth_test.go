package router

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/router-svc/internal/workers"
	"github.com/baton-serving/baton/svckit"
	"github.com/baton-serving/baton/tracing"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// servedRouter is a colocated router over fake decode workers, registered
// on a real svckit.Server and serving on loopback ports, as svckit.Main
// runs it (without the canary). tune adjusts the flags before Register.
func servedRouter(t *testing.T, maxConcurrent int, tune func(s *Service), decodes ...*fakeDecode) (*Service, *svckit.Server) {
	t.Helper()
	return servedRouterLogged(t, slog.New(slog.DiscardHandler), maxConcurrent, tune, decodes...)
}

// servedRouterLogged is servedRouter logging to logger.
func servedRouterLogged(t *testing.T, logger *slog.Logger, maxConcurrent int, tune func(s *Service), decodes ...*fakeDecode) (*Service, *svckit.Server) {
	t.Helper()
	s := testRouter(t)
	var addrs workers.Static
	for _, d := range decodes {
		addrs = append(addrs, d.addr)
	}
	s.decodeSrc = addrs
	var err error
	if s.prefillPolicy, err = workers.NewPolicy("least-load"); err != nil {
		t.Fatal(err)
	}
	if s.decodePolicy, err = workers.NewPolicy("least-load"); err != nil {
		t.Fatal(err)
	}
	s.prefillPolicyName, s.decPolicy = "least-load", "least-load"
	s.loadInterval = 50 * time.Millisecond
	s.fleet = fleetFlags{resolveInterval: time.Second, canaryTimeout: time.Second}
	s.limits = limitFlags{maxConcurrent: maxConcurrent, requestTimeout: time.Minute, clientWriteTimeout: 10 * time.Second, maxBodyBytes: defaultMaxBodyBytes}
	if tune != nil {
		tune(s)
	}
	s.limit = newLimiter(s.limits.maxConcurrent)
	if err := s.openAPI(logger); err != nil {
		t.Fatal(err)
	}
	tp, err := tracing.Init(context.Background(), "router-test", logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	srv, err := svckit.NewServer("router-test", svckit.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", AdminAddr: "127.0.0.1:0", ShutdownTimeout: 5 * time.Second},
		logger, tp, svckit.ServerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Register(srv); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
		if err := s.Close(); err != nil {
			t.Errorf("Close = %v", err)
		}
	})
	return s, srv
}

// readiness reads /health/ready: its status code and failing checks.
func readiness(t *testing.T, srv *svckit.Server) (int, map[string]string) {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + srv.HTTPAddr() + "/health/ready")
	if err != nil {
		t.Fatalf("/health/ready: %v", err)
	}
	defer resp.Body.Close()
	var body struct {
		Failing map[string]string `json:"failing"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&body)
	return resp.StatusCode, body.Failing
}

// waitReadiness polls /health/ready until ok accepts it or within passes;
// it returns the last answer and whether ok accepted it.
func waitReadiness(t *testing.T, srv *svckit.Server, within time.Duration, ok func(code int, failing map[string]string) bool) (int, map[string]string, bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		code, failing := readiness(t, srv)
		if ok(code, failing) {
			return code, failing, true
		}
		if time.Now().After(deadline) {
			return code, failing, false
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func allFailing(failing map[string]string) string {
	var b strings.Builder
	for k, v := range failing {
		b.WriteString(k + ": " + v + "; ")
	}
	return b.String()
}

// TestWedgedLimiterNotReady: a router whose request path is wedged — every
// limiter slot held, nothing finishing — must leave rotation, though its
// workers are ready; when the slots come back, readiness does too.
func TestWedgedLimiterNotReady(t *testing.T) {
	d := startFakeDecode(t, serve)
	s, srv := servedRouter(t, 2, nil, d)
	if _, failing, ok := waitReadiness(t, srv, 10*time.Second, func(c int, _ map[string]string) bool { return c == http.StatusOK }); !ok {
		t.Fatalf("router not ready with a serving decode worker: %s", allFailing(failing))
	}

	// Wedge: both slots taken by requests that never finish.
	var held []func()
	for range 2 {
		release, err := s.limit.acquire()
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, release)
	}
	wedged := time.Now()
	code, failing, ok := waitReadiness(t, srv, 20*time.Second, func(c int, _ map[string]string) bool { return c != http.StatusOK })
	if !ok {
		t.Fatalf("router still ready (%d) %v after its limiter filled with requests that never finish", code, time.Since(wedged).Round(time.Second))
	}
	if msg := failing["request-path"]; !strings.Contains(msg, "stuck at admission") || !strings.Contains(msg, "--max-concurrent-requests") {
		t.Errorf("not ready for %q, want check request-path naming stage admission and the limiter: %s", msg, allFailing(failing))
	}
	for _, r := range held {
		r()
	}
	if _, failing, ok := waitReadiness(t, srv, 15*time.Second, func(c int, _ map[string]string) bool { return c == http.StatusOK }); !ok {
		t.Errorf("router not ready again after the slots came back: %s", allFailing(failing))
	}
}

// TestSelfProbeNamesStage: the self-probe goes through the router's own
// gRPC port and passes while the path serves, without counting as user
// traffic; when requests wedge in the router (the --debug-hooks wedge, in
// stage routing) it times out there and readiness turns NOT_SERVING naming
// the stage; when the wedge ends, readiness comes back.
func TestSelfProbeNamesStage(t *testing.T) {
	d := startFakeDecode(t, serve)
	s, srv := servedRouter(t, 8, func(s *Service) {
		s.probeFlags = selfProbeFlags{interval: 200 * time.Millisecond, timeout: 500 * time.Millisecond}
		s.debugHooks = true
	}, d)
	if _, failing, ok := waitReadiness(t, srv, 10*time.Second, func(c int, _ map[string]string) bool { return c == http.StatusOK }); !ok {
		t.Fatalf("router not ready with a serving decode worker: %s", allFailing(failing))
	}
	passed := func() float64 { return testutil.ToFloat64(s.selfProbe.results.WithLabelValues("pass")) }
	deadline := time.Now().Add(10 * time.Second)
	for passed() < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("self-probe passed %v times in 10s", passed())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := testutil.CollectAndCount(s.metrics.requests); n != 0 {
		t.Errorf("baton_router_requests_total has %d series after self-probes only; probes must not count as user traffic", n)
	}
	if d.calls.Load() == 0 {
		t.Errorf("no self-probe reached the decode worker")
	}

	// The wedge hook is on the loopback admin listener, not the public port.
	if resp, err := http.Post("http://"+srv.HTTPAddr()+"/debug/wedge?stage=routing&for=1ms", "", nil); err != nil {
		t.Fatal(err)
	} else {
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound && resp.StatusCode != http.StatusMethodNotAllowed {
			t.Errorf("POST /debug/wedge on the public HTTP port = %d, want 404: the hook belongs on the admin listener", resp.StatusCode)
		}
	}
	// Wedge the path at routing.
	post := func(path string) {
		resp, err := http.Post("http://"+srv.AdminAddr()+path, "", nil)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("POST %s: %v %v", path, resp, err)
		}
		resp.Body.Close()
	}
	post("/debug/wedge?stage=routing&for=1m")
	code, failing, ok := waitReadiness(t, srv, 10*time.Second, func(c int, _ map[string]string) bool { return c != http.StatusOK })
	if !ok {
		t.Fatalf("router still ready (%d) 10s into a wedge of its request path", code)
	}
	if msg := failing["request-path"]; !strings.Contains(msg, "stuck at routing") || !strings.Contains(msg, "self-probe") {
		t.Errorf("not ready for %q, want check request-path naming the self-probe stuck at routing: %s", msg, allFailing(failing))
	}
	if _, ok := failing["workers"]; ok {
		t.Errorf("workers check failing while only the router is wedged: %s", allFailing(failing))
	}

	post("/debug/unwedge")
	if _, failing, ok := waitReadiness(t, srv, 10*time.Second, func(c int, _ map[string]string) bool { return c == http.StatusOK }); !ok {
		t.Errorf("router not ready again after the wedge ended: %s", allFailing(failing))
	}
}

// TestSelfProbeTinyLimits: a router whose limits allow only one token of
// prompt and one new token (a scoring deployment: --max-new-tokens 1
// --max-new-tokens-limit 1 --max-prompt-tokens 1) is a valid configuration:
// its self-probe must fit them and pass, and the router must turn ready.
func TestSelfProbeTinyLimits(t *testing.T) {
	d := startFakeDecode(t, serve)
	s, srv := servedRouter(t, 8, func(s *Service) {
		s.probeFlags = selfProbeFlags{interval: 200 * time.Millisecond, timeout: time.Second}
		s.maxNewTokens, s.limits.maxNewTokens, s.limits.maxPromptTokens = 1, 1, 1
	}, d)
	if _, failing, ok := waitReadiness(t, srv, 10*time.Second, func(c int, _ map[string]string) bool { return c == http.StatusOK }); !ok {
		t.Fatalf("router with --max-new-tokens-limit 1 --max-prompt-tokens 1 not ready: %s", allFailing(failing))
	}
	deadline := time.Now().Add(10 * time.Second)
	for testutil.ToFloat64(s.selfProbe.results.WithLabelValues("pass")) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("self-probe passed %v times in 10s under one-token limits (failed %v)",
				testutil.ToFloat64(s.selfProbe.results.WithLabelValues("pass")), testutil.ToFloat64(s.selfProbe.results.WithLabelValues("fail")))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code, failing := readiness(t, srv); code != http.StatusOK {
		t.Errorf("router not ready after passing self-probes: %s", allFailing(failing))
	}
}

// countingHandler counts the records logged at Error level and above whose
// message contains sub.
type countingHandler struct {
	sub string
	n   *atomic.Int32
}

func (h countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h countingHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelError && strings.Contains(r.Message, h.sub) {
		h.n.Add(1)
	}
	return nil
}
func (h countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h countingHandler) WithGroup(string) slog.Handler      { return h }

// TestSelfProbeRefusedByConfig: a self-probe that prepare refuses
// (INVALID_ARGUMENT: here a context window of two tokens, which the probe's
// prompt token and its two new tokens do not fit) is a
// configuration error, logged once, not a router stuck at a stage: the
// request-path check does not fail for it.
func TestSelfProbeRefusedByConfig(t *testing.T) {
	d := startFakeDecode(t, serve)
	var logged atomic.Int32
	s, srv := servedRouterLogged(t, slog.New(countingHandler{sub: "configuration", n: &logged}), 8, func(s *Service) {
		s.probeFlags = selfProbeFlags{interval: 100 * time.Millisecond, timeout: time.Second}
		s.cfg.ContextLength = 2
	}, d)
	deadline := time.Now().Add(10 * time.Second)
	for testutil.ToFloat64(s.selfProbe.results.WithLabelValues("config")) < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("self-probe refused by prepare counted as config %v times in 10s (fail %v)",
				testutil.ToFloat64(s.selfProbe.results.WithLabelValues("config")), testutil.ToFloat64(s.selfProbe.results.WithLabelValues("fail")))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, failing := readiness(t, srv); failing["request-path"] != "" {
		t.Errorf("request-path failing for a probe the configuration refuses: %s", failing["request-path"])
	}
	if n := logged.Load(); n != 1 {
		t.Errorf("configuration error logged %d times over 3 probes, want once", n)
	}
}

// TestSelfProbeIDsReserved: a client cannot pass for the self-probe: a
// canary id without the process's token is refused like any canary id.
func TestSelfProbeIDsReserved(t *testing.T) {
	d := startFakeDecode(t, serve)
	_, srv := servedRouter(t, 8, func(s *Service) {
		s.probeFlags = selfProbeFlags{interval: time.Hour, timeout: time.Second}
	}, d)
	conn, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := metadata.AppendToOutgoingContext(context.Background(), selfProbeTokenKey, "guessed")
	_, err = batonv1.NewRouterServiceClient(conn).Complete(ctx, &batonv1.CompleteRequest{
		Request: &batonv1.GenerateRequest{RequestId: selfProbeIDPrefix + "x", Prompt: "Once upon a time"}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "reserved") {
		t.Errorf("client request with a self-probe id: %v, want INVALID_ARGUMENT (reserved)", err)
	}
}

// TestRequestPathRules: the limiter and overdue rules of the request-path
// check, on made-up state. A full limiter is a wedge only when nothing
// finishes or progresses for stallBound and some slot holder is not
// waiting on a worker; an in-flight request past --request-timeout plus
// overdueGrace is one wherever it is.
func TestRequestPathRules(t *testing.T) {
	now := time.Now()
	stale := now.Add(-2 * stallBound)
	mk := func(id string, state batonv1.RequestState, start, progress time.Time) *request {
		r := &request{id: id, start: start}
		r.state.Store(int32(state))
		r.progress.Store(progress.UnixNano())
		return r
	}
	sending := func(id string, progress time.Time) *request {
		r := mk(id, batonv1.RequestState_REQUEST_STATE_RUNNING, stale, progress)
		r.sending.Store(true)
		return r
	}
	cases := []struct {
		name     string
		slots    int // taken of 2
		reqs     []*request
		finished time.Time
		want     string // "" or a substring of the problem
	}{
		{"limiter not full", 1, nil, stale, ""},
		{"full, a request finished lately", 2, nil, now, ""},
		{"full, nothing listed, nothing finished: stuck before the table", 2, nil, stale, "stuck at admission: the limiter is full (2 of 2"},
		{"full, requests streaming with progress", 2, []*request{
			mk("a", batonv1.RequestState_REQUEST_STATE_RUNNING, stale, now), mk("b", batonv1.RequestState_REQUEST_STATE_RUNNING, stale, stale)}, stale, ""},
		{"full, both waiting on workers", 2, []*request{
			mk("a", batonv1.RequestState_REQUEST_STATE_PREALLOC, stale, stale), mk("b", batonv1.RequestState_REQUEST_STATE_RUNNING, stale, stale)}, stale, ""},
		{"full, both stuck routing", 2, []*request{
			mk("a", batonv1.RequestState_REQUEST_STATE_ROUTING, stale, stale), mk("b", batonv1.RequestState_REQUEST_STATE_ROUTING, stale, stale)}, stale, "stuck at routing: the limiter is full"},
		// Clients that stopped reading: --client-write-timeout (30s here)
		// releases them, so the router is not stuck while it has not passed.
		{"full, sending to clients that stopped reading, within --client-write-timeout", 2, []*request{
			sending("a", now.Add(-15*time.Second)), sending("b", now.Add(-20*time.Second))}, stale, ""},
		{"full, one sending to a slow client, one stuck routing", 2, []*request{
			sending("a", now.Add(-15*time.Second)), mk("b", batonv1.RequestState_REQUEST_STATE_ROUTING, stale, stale)}, stale, "stuck at routing: the limiter is full"},
		{"full, sending past --client-write-timeout plus grace", 2, []*request{
			sending("a", now.Add(-40*time.Second)), sending("b", now.Add(-40*time.Second))}, stale, "stuck at sending to client: the limiter is full"},
		{"overdue request", 1, []*request{
			mk("old", batonv1.RequestState_REQUEST_STATE_RUNNING, now.Add(-time.Minute-overdueGrace-time.Second), now)}, now, "stuck at streaming: request old in flight for 1m6s, past --request-timeout 1m0s"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := New()
			s.limits.requestTimeout, s.limits.clientWriteTimeout = time.Minute, 30*time.Second
			s.limit = newLimiter(2)
			for range tc.slots {
				if _, err := s.limit.acquire(); err != nil {
					t.Fatal(err)
				}
			}
			for _, r := range tc.reqs {
				if _, err := s.inflight.add(r); err != nil {
					t.Fatal(err)
				}
			}
			s.path.released.Store(tc.finished.UnixNano())
			err := s.checkRequestPath(context.Background())
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("request-path failing: %v, want passing", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("request-path = %v, want %q", err, tc.want)
			}
		})
	}
}
