package reconcile

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/router-svc/internal/logtest"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// fakeWorker is a real gRPC WorkerService whose request list the test sets;
// with block set, ListRequests answers only when its caller gives up.
type fakeWorker struct {
	batonv1.UnimplementedWorkerServiceServer
	mu    sync.Mutex
	reqs  []*batonv1.RequestInfo
	block bool
	calls int
}

func (f *fakeWorker) set(block bool, ids ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.block, f.reqs = block, nil
	for _, id := range ids {
		f.reqs = append(f.reqs, &batonv1.RequestInfo{RequestId: id, State: batonv1.RequestState_REQUEST_STATE_RUNNING,
			AgeSeconds: 42, TraceId: "trace-" + id})
	}
}

func (f *fakeWorker) ListRequests(ctx context.Context, _ *batonv1.WorkerServiceListRequestsRequest) (*batonv1.WorkerServiceListRequestsResponse, error) {
	f.mu.Lock()
	f.calls++
	block, reqs := f.block, f.reqs
	f.mu.Unlock()
	if block {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return &batonv1.WorkerServiceListRequestsResponse{Requests: reqs}, nil
}

// serve starts a fake worker on a loopback port.
func serve(t *testing.T, role batonv1.WorkerRole) (*fakeWorker, Worker) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fw := &fakeWorker{}
	srv := grpc.NewServer()
	batonv1.RegisterWorkerServiceServer(srv, fw)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	return fw, Worker{Addr: l.Addr().String(), Role: role, Conn: dial(t, l.Addr().String())}
}

func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// router is the router's side as the test sets it.
type router struct {
	mu      sync.Mutex
	entries []Entry
}

func (r *router) set(es ...Entry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.entries = es
}

func (r *router) list() []Entry {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Entry(nil), r.entries...)
}

const grace = 60 * time.Millisecond

func newReconciler(t *testing.T, rt *router, workers ...Worker) (*Reconciler, *logtest.Buffer) {
	t.Helper()
	logs := &logtest.Buffer{}
	r, err := New(Options{Router: rt.list, Workers: func() []Worker { return workers }, Grace: grace,
		Interval: 10 * time.Millisecond, Timeout: 200 * time.Millisecond,
		Logger: logs.Logger(), Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	return r, logs
}

func ids(os []Orphan) []string {
	var out []string
	for _, o := range os {
		out = append(out, o.Role+"/"+o.ID)
	}
	return out
}

func counted(r *Reconciler, role string) float64 {
	return testutil.ToFloat64(r.orphans.WithLabelValues(role))
}

// TestOrphanOnWorker: a request a decode worker holds and the router does
// not is an orphan once the grace period has passed, counted and logged once
// however many rounds see it, and logged again when it is gone.
func TestOrphanOnWorker(t *testing.T) {
	ctx := context.Background()
	dw, d := serve(t, batonv1.WorkerRole_WORKER_ROLE_DECODE)
	rt := &router{}
	rt.set(Entry{ID: "ok-1", Prefill: "p:1", Decode: d.Addr})
	dw.set(false, "ok-1", "lost-1")
	r, logs := newReconciler(t, rt, d)

	f := r.Reconcile(ctx)
	if len(f.Orphans) != 0 || f.Suspects != 1 || f.RouterRequests != 1 || len(f.Workers) != 1 || f.Workers[0].Requests != 2 {
		t.Fatalf("first round: %+v", f)
	}
	time.Sleep(grace)
	for round := range 3 {
		f = r.Reconcile(ctx)
		if got := ids(f.Orphans); len(got) != 1 || got[0] != "decode/lost-1" {
			t.Fatalf("round %d: orphans %v, want decode/lost-1", round, got)
		}
	}
	o := f.Orphans[0]
	if o.Worker != d.Addr || o.State != "running" || o.TraceID != "trace-lost-1" || o.AgeSeconds != 42 || o.UnmatchedSeconds < grace.Seconds() {
		t.Fatalf("orphan %+v", o)
	}
	if got := counted(r, RoleDecode); got != 1 {
		t.Fatalf("baton:router_orphans_total{role=decode} = %v after three rounds, want 1", got)
	}
	if got := testutil.ToFloat64(r.current.WithLabelValues(RoleDecode)); got != 1 {
		t.Fatalf("baton_router_orphans{role=decode} = %v, want 1", got)
	}
	found := logs.Records("reconcile: orphan request")
	if len(found) != 1 || found[0]["request_id"] != "lost-1" || found[0]["trace_id"] != "trace-lost-1" || found[0]["worker"] != d.Addr {
		t.Fatalf("orphan logs: %v", found)
	}
	if got := r.Findings(); len(got.Orphans) != 1 {
		t.Fatalf("Findings() = %+v, want the last round's", got)
	}

	dw.set(false, "ok-1")
	if f := r.Reconcile(ctx); len(f.Orphans) != 0 || f.Suspects != 0 {
		t.Fatalf("after the orphan went: %+v", f)
	}
	if gone := logs.Records("reconcile: orphan request gone"); len(gone) != 1 || gone[0]["request_id"] != "lost-1" {
		t.Fatalf("gone logs: %v", gone)
	}
	if got := testutil.ToFloat64(r.current.WithLabelValues(RoleDecode)); got != 0 {
		t.Fatalf("baton_router_orphans{role=decode} = %v after it went, want 0", got)
	}
}

// TestShortDisagreementsAreNotOrphans: requests seen on one side only for
// less than the grace period — starting, ending — are never counted.
func TestShortDisagreementsAreNotOrphans(t *testing.T) {
	ctx := context.Background()
	dw, d := serve(t, batonv1.WorkerRole_WORKER_ROLE_DECODE)
	rt := &router{}
	r, logs := newReconciler(t, rt, d)

	dw.set(false, "new-1")                     // the worker has it before the router lists it
	rt.set(Entry{ID: "old-1", Decode: d.Addr}) // the router has it after the worker released it
	if f := r.Reconcile(ctx); f.Suspects != 2 || len(f.Orphans) != 0 {
		t.Fatalf("first round: %+v", f)
	}
	rt.set(Entry{ID: "new-1", Decode: d.Addr})
	time.Sleep(grace)
	if f := r.Reconcile(ctx); f.Suspects != 0 || len(f.Orphans) != 0 {
		t.Fatalf("after both sides agreed: %+v", f)
	}
	for _, role := range []string{RolePrefill, RoleDecode, RoleRouter} {
		if got := counted(r, role); got != 0 {
			t.Errorf("role %s: %v orphans counted", role, got)
		}
	}
	if n := len(logs.Records("reconcile: orphan request")); n != 0 {
		t.Errorf("%d orphans logged", n)
	}
}

// TestWorkerSides: a request is known on a worker only if the router has it
// in flight on that worker; the router's requests are checked against their
// decode worker only (prefill lets a request go once its KV cache is sent).
func TestWorkerSides(t *testing.T) {
	ctx := context.Background()
	p1w, p1 := serve(t, batonv1.WorkerRole_WORKER_ROLE_PREFILL)
	p2w, p2 := serve(t, batonv1.WorkerRole_WORKER_ROLE_PREFILL)
	dw, d := serve(t, batonv1.WorkerRole_WORKER_ROLE_DECODE)
	rt := &router{}
	rt.set(
		Entry{ID: "a", Prefill: p1.Addr, Decode: d.Addr}, // on p1 and d: fine
		Entry{ID: "b", Prefill: p1.Addr, Decode: d.Addr}, // left behind on p2 by a retry
		Entry{ID: "c", Prefill: p1.Addr, Decode: d.Addr}, // handed over by p1, missing on d: router orphan
		Entry{ID: "unrouted"},                            // not routed yet: anywhere is fine
		Entry{ID: "colocated", Prefill: "local", Decode: d.Addr},
		Entry{ID: "canary-1", Decode: d.Addr}, // a colocated canary
	)
	p1w.set(false, "a")
	p2w.set(false, "b", "unrouted")
	dw.set(false, "a", "b", "colocated", "canary-1")
	r, _ := newReconciler(t, rt, p1, p2, d)
	r.Reconcile(ctx)
	time.Sleep(grace)
	f := r.Reconcile(ctx)
	got := strings.Join(ids(f.Orphans), " ")
	for _, want := range []string{"prefill/b", "router/c"} {
		if !strings.Contains(got, want) {
			t.Errorf("orphans %q lack %s", got, want)
		}
	}
	if len(f.Orphans) != 2 {
		t.Errorf("orphans %q, want exactly prefill/b and router/c", got)
	}
	if counted(r, RolePrefill) != 1 || counted(r, RoleRouter) != 1 || counted(r, RoleDecode) != 0 {
		t.Errorf("counts prefill %v router %v decode %v, want 1 1 0", counted(r, RolePrefill), counted(r, RoleRouter), counted(r, RoleDecode))
	}
	for _, o := range f.Orphans {
		if o.Role == RolePrefill && o.Worker != p2.Addr || o.Role == RoleRouter && o.Worker != d.Addr {
			t.Errorf("orphan %+v names the wrong worker", o)
		}
	}
}

// TestUnreachableWorkers: a worker that refuses connections or never
// answers costs a round at most the call timeout, shows its error, and
// neither creates orphans nor clears what was found on it.
func TestUnreachableWorkers(t *testing.T) {
	ctx := context.Background()
	hw, hung := serve(t, batonv1.WorkerRole_WORKER_ROLE_DECODE)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := l.Addr().String()
	l.Close()
	dead := Worker{Addr: deadAddr, Role: batonv1.WorkerRole_WORKER_ROLE_PREFILL, Conn: dial(t, deadAddr)}
	rt := &router{}
	rt.set(Entry{ID: "r-1", Decode: hung.Addr}, Entry{ID: "r-2", Prefill: deadAddr, Decode: hung.Addr})
	r, _ := newReconciler(t, rt, dead, hung)

	hw.set(false, "r-1", "r-2", "lost-1")
	if f := r.Reconcile(ctx); f.Suspects != 1 {
		t.Fatalf("first round: %+v", f)
	}
	hw.set(true)
	time.Sleep(grace)
	began := time.Now()
	f := r.Reconcile(ctx)
	if took := time.Since(began); took > 2*time.Second {
		t.Fatalf("a round with unreachable workers took %v; the call timeout is 200ms", took)
	}
	if len(f.Orphans) != 0 || len(f.Workers) != 2 || f.Workers[0].Error == "" || f.Workers[1].Error == "" {
		t.Fatalf("round with both workers unreachable: %+v", f)
	}
	// Back: the disagreement seen before the outage has lasted the grace
	// period, so it is an orphan now.
	hw.set(false, "r-1", "r-2", "lost-1")
	f = r.Reconcile(ctx)
	if got := ids(f.Orphans); len(got) != 1 || got[0] != "decode/lost-1" || f.Workers[1].Error != "" {
		t.Fatalf("after the worker came back: %+v", f)
	}
}

// TestRunStops: Run reconciles at once, keeps going, and returns promptly
// when its context ends, even in the middle of a round.
func TestRunStops(t *testing.T) {
	hw, hung := serve(t, batonv1.WorkerRole_WORKER_ROLE_DECODE)
	rt := &router{}
	logs := &logtest.Buffer{}
	r, err := New(Options{Router: rt.list, Workers: func() []Worker { return []Worker{hung} },
		Interval: 5 * time.Millisecond, Timeout: time.Minute, Logger: logs.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		hw.mu.Lock()
		calls := hw.calls
		hw.mu.Unlock()
		if calls >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Run made %d rounds in 5s", calls)
		}
		time.Sleep(time.Millisecond)
	}
	hw.set(true) // the next round hangs until cancelled
	time.Sleep(20 * time.Millisecond)
	cancel()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

func TestNewOptions(t *testing.T) {
	list := func() []Entry { return nil }
	workers := func() []Worker { return nil }
	for _, c := range []struct {
		name string
		o    Options
		want string
	}{
		{"defaults", Options{Router: list, Workers: workers}, ""},
		{"no router", Options{Workers: workers}, "required"},
		{"no workers", Options{Router: list}, "required"},
		{"negative grace", Options{Router: list, Workers: workers, Grace: -1}, "positive"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, err := New(c.o)
			if c.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if r.o.Interval != 10*time.Second || r.o.Grace != 10*time.Second || r.o.Timeout != 2*time.Second {
					t.Fatalf("defaults %+v", r.o)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want %q", err, c.want)
			}
		})
	}
	reg := prometheus.NewRegistry()
	if _, err := New(Options{Router: list, Workers: workers, Registry: reg}); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Options{Router: list, Workers: workers, Registry: reg}); err == nil {
		t.Fatal("registering the metrics twice gave no error")
	}
}

func TestFindingsJSON(t *testing.T) {
	b, err := json.Marshal(Findings{Orphans: []Orphan{{Role: RoleDecode, Worker: "d:1", ID: "x", UnmatchedSeconds: 12}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"role":"decode"`, `"request_id":"x"`, `"unmatched_seconds":12`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("%s lacks %s", b, want)
		}
	}
	if strings.Contains(string(b), `"at"`) {
		t.Errorf("%s shows a round that never ran", b)
	}
}
