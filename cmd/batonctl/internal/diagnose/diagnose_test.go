package diagnose

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/svckit/tlsconf"
	"github.com/baton-serving/baton/svckit/workerapi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/encoding/protojson"
)

// fakeService serves the HTTP endpoints diagnose reads, from fields the
// test sets.
type fakeService struct {
	mu       sync.Mutex
	metrics  string
	ready    bool
	requests []*batonv1.RequestInfo
	// complete answers /v1/complete (router only); nil: 404.
	complete func(w http.ResponseWriter, r *http.Request)
	workers  string // /debug/workers body; "": 404
	// adminElsewhere: /debug/requests is not on this port (404), as on a
	// real service, whose admin listener serves it.
	adminElsewhere bool
}

func (f *fakeService) set(fn func(f *fakeService)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

func (f *fakeService) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	metrics, ready, reqs, complete, workers := f.metrics, f.ready, f.requests, f.complete, f.workers
	adminElsewhere := f.adminElsewhere
	f.mu.Unlock()
	switch r.URL.Path {
	case "/metrics":
		_, _ = w.Write([]byte(metrics))
	case "/health/ready":
		if !ready {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`{"status":"NOT_SERVING","failing":{"scheduler":"no forward step for 12s"}}`))
			return
		}
		_, _ = w.Write([]byte(`{"status":"SERVING"}`))
	case "/debug/requests":
		if adminElsewhere {
			http.NotFound(w, r)
			return
		}
		b, _ := protojson.MarshalOptions{UseProtoNames: true}.Marshal(&batonv1.WorkerServiceListRequestsResponse{Requests: reqs})
		_, _ = w.Write(b)
	case "/debug/workers":
		if workers == "" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte(workers))
	case "/v1/complete":
		if complete == nil {
			http.NotFound(w, r)
			return
		}
		complete(w, r)
	default:
		http.NotFound(w, r)
	}
}

func serve(t *testing.T, f *fakeService) string {
	t.Helper()
	s := httptest.NewServer(f)
	t.Cleanup(s.Close)
	return s.URL
}

// traceOf extracts the trace id from a traceparent header.
func traceOf(r *http.Request) string {
	parts := strings.Split(r.Header.Get("Traceparent"), "-")
	if len(parts) != 4 {
		return ""
	}
	return parts[1]
}

func run(t *testing.T, args ...string) (int, Verdict, string) {
	t.Helper()
	var out, errb bytes.Buffer
	// The fake router serves /debug/* on its one port: it is its admin too.
	if i := slices.Index(args, "--router"); i >= 0 && i+1 < len(args) && !slices.Contains(args, "--router-admin") {
		args = append(args, "--router-admin", args[i+1])
	}
	code := Run(context.Background(), &out, &errb, append([]string{"--json", "--samples", "2", "--interval", "50ms", "--stuck-after", "1s"}, args...))
	var v Verdict
	if code != ExitUsage {
		if err := json.Unmarshal(out.Bytes(), &v); err != nil {
			t.Fatalf("--json output is not JSON: %v\n%s\nstderr: %s", err, out.String(), errb.String())
		}
	}
	return code, v, errb.String()
}

func TestRunHealthy(t *testing.T) {
	decode := &fakeService{ready: true, metrics: "baton:num_running_reqs 0\nbaton_kv_pages_leaked 0\n"}
	decodeURL := serve(t, decode)
	var gotTimeout, gotTrace string
	router := &fakeService{ready: true, metrics: "baton_router_inflight_requests 0\n",
		workers: `{"workers":[{"role":"WORKER_ROLE_DECODE","address":"127.0.0.1:1","http_addr":"` + strings.TrimPrefix(decodeURL, "http://") + `"}]}`,
		complete: func(w http.ResponseWriter, r *http.Request) {
			gotTimeout, gotTrace = r.Header.Get("Grpc-Timeout"), traceOf(r)
			var req batonv1.GenerateRequest
			b, _ := io.ReadAll(r.Body)
			if err := protojson.Unmarshal(b, &req); err != nil || req.GetPrompt() == "" || !strings.HasPrefix(req.GetRequestId(), "diagnose-") {
				http.Error(w, fmt.Sprintf(`{"code":3,"message":"bad probe body %s: %v"}`, b, err), http.StatusBadRequest)
				return
			}
			_, _ = w.Write([]byte(`{"request_id":"x","text":" there was","token_ids":[1,2,3],"unknown_field":1}`))
		}}
	code, v, stderr := run(t, "--router", serve(t, router), "--probe-timeout", "3s")
	if code != 0 || v.Status != Healthy {
		t.Fatalf("exit %d, verdict %+v; stderr %s", code, v, stderr)
	}
	if len(v.Services) != 2 || v.Services[1].Name != "decode-0" || !strings.HasPrefix(v.Services[1].HTTP, "http://") {
		t.Errorf("services %+v, want router and the discovered decode-0", v.Services)
	}
	if v.Probe == nil || !v.Probe.OK || v.Probe.Text != " there was" || gotTrace != v.Probe.TraceID || len(gotTrace) != 32 || gotTimeout != "3000m" {
		t.Errorf("probe %+v; router saw trace %q timeout %q", v.Probe, gotTrace, gotTimeout)
	}
}

// TestRunWedged: the probe hangs at decode's prealloc queue while decode
// lists three requests stuck in transfer; diagnose exits 2 and says so.
func TestRunWedged(t *testing.T) {
	decode := &fakeService{ready: true, metrics: "baton:num_decode_transfer_queue_reqs 3\n"}
	var stuckReqs []*batonv1.RequestInfo
	for i := range 3 {
		stuckReqs = append(stuckReqs, &batonv1.RequestInfo{RequestId: "zombie-" + strconv.Itoa(i),
			State: batonv1.RequestState_REQUEST_STATE_TRANSFERRING, AgeSeconds: 50, SinceProgressSeconds: 42,
			TraceId: "5f2c0a9e8d7c6b5a49382716a5b4c3d2"})
	}
	decode.requests = stuckReqs
	router := &fakeService{ready: true}
	router.complete = func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			RequestID string `json:"request_id"`
		}
		_ = json.NewDecoder(r.Body).Decode(&body)
		probe := &batonv1.RequestInfo{RequestId: body.RequestID, TraceId: traceOf(r),
			State: batonv1.RequestState_REQUEST_STATE_PREALLOC}
		decode.set(func(f *fakeService) { f.requests = append(stuckReqs, probe) })
		router.set(func(f *fakeService) { f.requests = []*batonv1.RequestInfo{probe} })
		d, _ := time.ParseDuration(strings.TrimSuffix(r.Header.Get("Grpc-Timeout"), "m") + "ms")
		select {
		case <-time.After(d):
		case <-r.Context().Done():
		}
		w.WriteHeader(http.StatusGatewayTimeout)
		_, _ = w.Write([]byte(`{"code":4,"message":"deadline exceeded"}`))
	}
	code, v, stderr := run(t, "--router", serve(t, router), "--decode", serve(t, decode), "--probe-timeout", "500ms")
	if code != 2 || v.Status != Wedged {
		t.Fatalf("exit %d, verdict %+v; stderr %s", code, v, stderr)
	}
	for _, want := range []string{"decode-0: 3 requests in transfer queue, no progress for 42 s, oldest 5f2c0a9e…", "probe stalled at prealloc_wait on decode-0"} {
		if !strings.Contains(v.Summary, want) {
			t.Errorf("summary %q lacks %q", v.Summary, want)
		}
	}
	if p := v.Probe; p == nil || !p.TimedOut || p.Code != "DEADLINE_EXCEEDED" {
		t.Errorf("probe %+v, want timed out with DEADLINE_EXCEEDED", p)
	}
}

// TestRunGRPCWorker: a worker given as grpc://host:port is read through
// gRPC health and WorkerService.
func TestRunGRPCWorker(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	healthpb.RegisterHealthServer(srv, hs)
	batonv1.RegisterWorkerServiceServer(srv, workerapi.New(&workerapi.Idle{Role: batonv1.WorkerRole_WORKER_ROLE_PREFILL,
		Ready: func(context.Context) map[string]string { return map[string]string{"x": "y"} }}))
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)

	code, v, stderr := run(t, "--prefill", "grpc://"+lis.Addr().String())
	if code != 2 || len(v.Services) != 1 {
		t.Fatalf("exit %d, verdict %+v; stderr %s", code, v, stderr)
	}
	s := v.Services[0]
	if s.Name != "prefill-0" || s.Down || s.Ready || !strings.Contains(strings.Join(s.Problems, ";"), "NOT_SERVING") {
		t.Errorf("prefill-0 verdict %+v, want read over gRPC, not ready", s)
	}
}

func TestRunUsage(t *testing.T) {
	for _, args := range [][]string{
		{"--router", "http://x", "--samples", "0"},
		{"--router", "http://x", "--probe-timeout", "-1s"},
		{"--decode", "ftp://x"},
		{"--router", "http://x", "extra"},
	} {
		var out, errb bytes.Buffer
		if code := Run(context.Background(), &out, &errb, args); code != ExitUsage || errb.Len() == 0 {
			t.Errorf("%q: exit %d, stderr %q; want %d with a message", args, code, errb.String(), ExitUsage)
		}
	}
}

// TestDefaultRouter: without --router, --prefill or --decode, diagnose reads
// the router `batonctl up` starts, as generate and bench do; naming workers
// alone still leaves the router out.
func TestDefaultRouter(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "http://127.0.0.1:8080"},
		{[]string{"--router", "10.0.0.1:9000/"}, "http://10.0.0.1:9000"},
		{[]string{"--decode", "http://127.0.0.1:8085"}, ""},
		{[]string{"--prefill", "http://127.0.0.1:8083"}, ""},
	} {
		var o options
		fs := flag.NewFlagSet("diagnose", flag.ContinueOnError)
		o.addFlags(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		if err := o.validate(); err != nil || o.router != tc.want {
			t.Errorf("%q: router %q, err %v; want %q", tc.args, o.router, err, tc.want)
		}
	}
}

// TestRunRouterDown: nothing listens at the router: wedged, with the
// discovery failure noted.
func TestRunRouterDown(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	code, v, _ := run(t, "--router", addr, "--probe-timeout", "1s", "--timeout", "500ms")
	if code != 2 || len(v.Services) != 1 || !v.Services[0].Down || len(v.Notes) == 0 || v.Probe == nil || v.Probe.OK {
		t.Errorf("exit %d, verdict %+v; want wedged, router down, a note, a failed probe", code, v)
	}
}

// adminWorker is a decode worker as services are now: /metrics and
// /health/ready on its HTTP port, /debug/requests (one request stuck in
// transfer) only on its admin listener. It returns both base URLs.
func adminWorker(t *testing.T) (httpURL, adminURL string) {
	t.Helper()
	stuck := []*batonv1.RequestInfo{{RequestId: "stuck-on-admin", State: batonv1.RequestState_REQUEST_STATE_TRANSFERRING,
		AgeSeconds: 50, SinceProgressSeconds: 42, TraceId: "5f2c0a9e8d7c6b5a49382716a5b4c3d2"}}
	main := &fakeService{ready: true, metrics: "baton:num_decode_transfer_queue_reqs 1\n", adminElsewhere: true}
	admin := &fakeService{requests: stuck}
	return serve(t, main), serve(t, admin)
}

// stuckOn reports whether diagnose's verdict for svc lists the admin
// worker's stuck request, that is, read its admin listener's list.
func stuckOn(v Verdict, svc string) bool {
	for _, s := range v.Services {
		if s.Name != svc {
			continue
		}
		for _, r := range s.Stuck {
			if r.ID == "stuck-on-admin" {
				return true
			}
		}
	}
	return false
}

// TestWorkerAdminFlag: a worker given by its HTTP URL has /debug/requests
// on its admin listener; --decode-admin names it, and diagnose reads the
// list there (it used to ask the HTTP port, which answers 404).
func TestWorkerAdminFlag(t *testing.T) {
	httpURL, adminURL := adminWorker(t)
	_, v, stderr := run(t, "--probe=false", "--decode", httpURL, "--decode-admin", strings.TrimPrefix(adminURL, "http://"))
	if !stuckOn(v, "decode-0") {
		t.Fatalf("verdict %+v does not list decode-0's stuck request from its admin listener; stderr %s", v, stderr)
	}
	if got := v.Services[0].Admin; got != adminURL {
		t.Errorf("decode-0 admin %q, want %q", got, adminURL)
	}
	var out, errb bytes.Buffer
	if code := Run(context.Background(), &out, &errb, []string{"--decode", httpURL, "--decode-admin", "a,b"}); code != ExitUsage {
		t.Errorf("two --decode-admin for one --decode: exit %d, want %d (%s)", code, ExitUsage, errb.String())
	}
}

// TestWorkerAdminFromRouter: workers named by HTTP URL without
// --decode-admin, or discovered, are read at the admin address the router's
// /debug/workers reports for them (the worker's Info.admin_addr).
func TestWorkerAdminFromRouter(t *testing.T) {
	httpURL, adminURL := adminWorker(t)
	router := &fakeService{ready: true, metrics: "baton_router_inflight_requests 0\n",
		workers: `{"decode":{"workers":[{"role":"WORKER_ROLE_DECODE","address":"127.0.0.1:1","http_addr":"` +
			strings.TrimPrefix(httpURL, "http://") + `","admin_addr":"` + strings.TrimPrefix(adminURL, "http://") + `"}]}}`}
	routerURL := serve(t, router)
	for name, args := range map[string][]string{
		"given":      {"--decode", httpURL},
		"discovered": nil,
	} {
		t.Run(name, func(t *testing.T) {
			_, v, stderr := run(t, append([]string{"--probe=false", "--router", routerURL}, args...)...)
			if !stuckOn(v, "decode-0") {
				t.Fatalf("verdict %+v does not list decode-0's stuck request from its admin listener; stderr %s", v, stderr)
			}
		})
	}
}

// TestRunGRPCWorkerTLS: a worker serving mutual TLS is read over gRPC with
// --tls-cert/--tls-key/--tls-ca (a router-role certificate); without them
// diagnose cannot read it and says the worker is down.
func TestRunGRPCWorkerTLS(t *testing.T) {
	dir := t.TempDir()
	if err := tlsconf.WriteDevCerts(dir, tlsconf.DevOptions{}); err != nil {
		t.Fatal(err)
	}
	id, err := tlsconf.Load(tlsconf.FilesIn(dir, tlsconf.Prefill), nil)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(tlsconf.ServerOptions(id, tlsconf.PolicyFor(tlsconf.Prefill), func(err error) error { return err })...)
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(srv, hs)
	batonv1.RegisterWorkerServiceServer(srv, workerapi.New(&workerapi.Idle{Role: batonv1.WorkerRole_WORKER_ROLE_PREFILL}))
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	addr := "grpc://" + lis.Addr().String()

	if _, v, stderr := run(t, "--prefill", addr, "--samples", "1"); len(v.Services) != 1 || !v.Services[0].Down {
		t.Errorf("without a certificate: verdict %+v, want prefill-0 unreadable (down); stderr %s", v, stderr)
	}
	router := tlsconf.FilesIn(dir, tlsconf.Router)
	code, v, stderr := run(t, "--prefill", addr, "--samples", "1",
		"--tls-cert", router.Cert, "--tls-key", router.Key, "--tls-ca", router.CA)
	if len(v.Services) != 1 || v.Services[0].Down || !v.Services[0].Ready {
		t.Fatalf("with the router's certificate: exit %d, verdict %+v; stderr %s", code, v, stderr)
	}
	if code, _, stderr := run(t, "--prefill", addr, "--tls-cert", router.Cert); code != ExitUsage || !strings.Contains(stderr, "--tls-key") {
		t.Errorf("--tls-cert alone: exit %d, stderr %q; want usage error naming --tls-key", code, stderr)
	}
}
