// Package workertest runs Baton's worker services in-process for tests: a
// service is configured, opened, registered and run as svckit.Main would run
// it, and its gRPC server is also served over an in-memory listener
// (bufconn), so that tests and the workers they connect reach each other
// without ports. It also writes the tiny model the workers load and reads
// what a test asserts on: the WorkerService load report, the metrics
// registry and the freeze hook.
package workertest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/baton-serving/baton/engine/testmodel"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/kernels/quant"
	"github.com/baton-serving/baton/svckit"
	"github.com/baton-serving/baton/tracing"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
)

// ModelSpec is the shape of the model Model writes: small enough that a
// prompt computes in milliseconds under the race detector, with a context
// window of 128 tokens (8 pages of 16).
var ModelSpec = testmodel.Spec{Dim: 32, Hidden: 64, Layers: 2, Heads: 4, KVHeads: 2, Vocab: 300, Context: 128, Type: quant.F32, Seed: 3}

// Model writes the test model into a temporary directory and returns its
// path. Workers that load the same file share its fingerprint.
func Model(t testing.TB) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tiny.gguf")
	if err := testmodel.Write(path, ModelSpec); err != nil {
		t.Fatal(err)
	}
	return path
}

// Worker is one running service.
type Worker struct {
	Server *svckit.Server
	// Conn reaches the worker's gRPC server over the in-memory listener.
	Conn *grpc.ClientConn
	lis  *bufconn.Listener
}

// Start configures svc from args (as flags, without the environment),
// opens, registers and runs it until the test ends. The shared flags
// default to loopback ports chosen by the system and a 5-second shutdown;
// logs go to the test's log when BATON_TEST_LOGS is set.
func Start(t testing.TB, name string, svc svckit.Service, args ...string) *Worker {
	t.Helper()
	var cfg svckit.Config
	fs := svckit.NewFlagSet(name, "in-process test worker", io.Discard)
	cfg.AddFlags(fs, svckit.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", ShutdownTimeout: 5 * time.Second})
	svc.AddFlags(fs)
	noEnv := func(string) (string, bool) { return "", false }
	if err := svckit.ParseFlags(fs, args, noEnv); err != nil {
		t.Fatalf("%s flags: %v", name, err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if err := svc.Validate(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	logger := slog.New(slog.DiscardHandler)
	if os.Getenv("BATON_TEST_LOGS") != "" {
		logger = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug})).With("svc", name)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tp, err := tracing.Init(ctx, name, logger)
	if err != nil {
		t.Fatal(err)
	}
	var sopts svckit.ServerOptions
	if o, ok := svc.(interface{ GRPCServerOptions() []grpc.ServerOption }); ok {
		sopts.GRPCOptions = o.GRPCServerOptions()
	}
	srv, err := svckit.NewServer(name, cfg, logger, tp, sopts)
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Open(ctx, &svckit.Deps{Logger: logger, Tracing: tp, Config: cfg, Registry: srv.Registry}); err != nil {
		t.Fatalf("%s: open: %v", name, err)
	}
	if err := svc.Register(srv); err != nil {
		t.Fatalf("%s: register: %v", name, err)
	}
	w := &Worker{Server: srv, lis: bufconn.Listen(1 << 20)}
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.GRPC.Serve(w.lis) }) // ends with Run's graceful stop
	runErr := make(chan error, 1)
	wg.Go(func() { runErr <- srv.Run(ctx) })
	w.Conn, err = grpc.NewClient("passthrough:///"+w.Addr(), w.DialOption(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = w.Conn.Close()
		cancel()
		if err := <-runErr; err != nil {
			t.Errorf("%s: run: %v", name, err)
		}
		wg.Wait()
		if err := svc.Close(); err != nil {
			t.Errorf("%s: close: %v", name, err)
		}
		_ = tp.Shutdown(context.Background())
	})
	return w
}

// Addr is the worker's gRPC address: what another worker names it by. The
// in-memory listener answers for it (see Dialer).
func (w *Worker) Addr() string { return w.Server.GRPCAddr() }

// DialOption dials this worker over its in-memory listener, whatever the
// address.
func (w *Worker) DialOption() grpc.DialOption {
	return grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return w.lis.DialContext(ctx) })
}

// Dialer returns a dial option that reaches each of workers by its Addr,
// and the listeners in extra by their keys, over memory; other addresses
// fail.
func Dialer(workers []*Worker, extra map[string]*bufconn.Listener) grpc.DialOption {
	lis := map[string]*bufconn.Listener{}
	for _, w := range workers {
		lis[w.Addr()] = w.lis
	}
	for a, l := range extra {
		lis[a] = l
	}
	return grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		l, ok := lis[addr]
		if !ok {
			return nil, fmt.Errorf("workertest: no in-memory listener for %s", addr)
		}
		return l.DialContext(ctx)
	})
}

// Load is the worker's WorkerService load report.
func (w *Worker) Load(t testing.TB) *batonv1.LoadReport {
	t.Helper()
	r, err := batonv1.NewWorkerServiceClient(w.Conn).GetLoad(context.Background(), &batonv1.GetLoadRequest{})
	if err != nil {
		t.Fatalf("GetLoad: %v", err)
	}
	return r.GetLoad()
}

// WaitIdle waits up to d for the worker to hold no request and no KV page,
// and fails the test with what is left otherwise.
func (w *Worker) WaitIdle(t testing.TB, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		l := w.Load(t)
		if l.GetPagesUsed() == 0 && l.GetQueuedRequests()+l.GetRunningRequests()+l.GetTransferringRequests() == 0 {
			return
		}
		if time.Now().After(deadline) {
			rs, _ := batonv1.NewWorkerServiceClient(w.Conn).ListRequests(context.Background(), &batonv1.WorkerServiceListRequestsRequest{})
			t.Fatalf("%s not idle after %v: %d pages used, load %v, requests %v", w.Server.Name, d, l.GetPagesUsed(), l, rs.GetRequests())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Counter is the value of the counter (or gauge) name with exactly the
// given label values (name=value pairs), 0 when it has not been set.
func (w *Worker) Counter(t testing.TB, name string, labels ...string) float64 {
	t.Helper()
	fams, err := w.Server.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	metrics:
		for _, m := range f.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue metrics
				}
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}

// WaitCounter waits up to d for Counter(name, labels...) to reach want.
func (w *Worker) WaitCounter(t testing.TB, d time.Duration, want float64, name string, labels ...string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		got := w.Counter(t, name, labels...)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s%v = %v after %v, want %v", w.Server.Name, name, labels, got, d, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Freeze holds the worker's forward passes (the --debug-hooks freeze hook)
// until Thaw or the end of the test.
func (w *Worker) Freeze(t testing.TB) {
	t.Helper()
	w.hook(t, "/debug/freeze?for=1m")
	t.Cleanup(func() { w.hook(t, "/debug/unfreeze") })
}

// Thaw ends a freeze.
func (w *Worker) Thaw(t testing.TB) {
	t.Helper()
	w.hook(t, "/debug/unfreeze")
}

func (w *Worker) hook(t testing.TB, path string) {
	t.Helper()
	rec := httptest.NewRecorder()
	w.Server.Admin.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, nil)) // test hooks are on the admin listener
	if rec.Code != http.StatusOK {
		t.Fatalf("POST %s: %d %s (does the worker run with --debug-hooks?)", path, rec.Code, rec.Body)
	}
}

// testWriter sends log lines to the test's log.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}
