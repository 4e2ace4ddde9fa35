package svckit

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/baton-serving/baton/engine"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/svckit/workerapi"
	"github.com/baton-serving/baton/tracing"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParseFlags(t *testing.T) {
	env := func(m map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
	}
	cases := []struct {
		name    string
		args    []string
		env     map[string]string
		want    Config
		wantErr string
	}{
		{"defaults", nil, nil, Config{GRPCAddr: "127.0.0.1:1", HTTPAddr: "127.0.0.1:2", ShutdownTimeout: 10 * time.Second}, ""},
		{"env overrides default", nil, map[string]string{"BATON_GRPC_ADDR": "0.0.0.0:9", "BATON_SHUTDOWN_TIMEOUT": "3s"},
			Config{GRPCAddr: "0.0.0.0:9", HTTPAddr: "127.0.0.1:2", ShutdownTimeout: 3 * time.Second}, ""},
		{"flag wins over env", []string{"--grpc-addr", "1.2.3.4:5"}, map[string]string{"BATON_GRPC_ADDR": "0.0.0.0:9"},
			Config{GRPCAddr: "1.2.3.4:5", HTTPAddr: "127.0.0.1:2", ShutdownTimeout: 10 * time.Second}, ""},
		{"bad env value names the variable", nil, map[string]string{"BATON_SHUTDOWN_TIMEOUT": "x"}, Config{}, "BATON_SHUTDOWN_TIMEOUT"},
		{"unknown flag", []string{"--bogus"}, nil, Config{}, "bogus"},
		{"positional argument", []string{"extra"}, nil, Config{}, `unexpected argument "extra"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var cfg Config
			fs := NewFlagSet("x", "test", io.Discard)
			cfg.AddFlags(fs, Config{GRPCAddr: "127.0.0.1:1", HTTPAddr: "127.0.0.1:2"})
			err := ParseFlags(fs, c.args, env(c.env))
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err = %v, want one mentioning %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.GRPCAddr != c.want.GRPCAddr || cfg.HTTPAddr != c.want.HTTPAddr || cfg.ShutdownTimeout != c.want.ShutdownTimeout {
				t.Errorf("got %+v, want %+v", cfg, c.want)
			}
		})
	}
}

func TestParseFlagsHelpShowsEnv(t *testing.T) {
	var out strings.Builder
	var cfg Config
	fs := NewFlagSet("x", "test", &out)
	cfg.AddFlags(fs, Config{})
	if err := ParseFlags(fs, []string{"--help"}, nil); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("err = %v, want ErrHelp", err)
	}
	for _, w := range []string{"-grpc-addr", "$BATON_GRPC_ADDR", "$BATON_SHUTDOWN_TIMEOUT", "(default 10s)"} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("usage lacks %q:\n%s", w, out.String())
		}
	}
}

func TestValidateAddr(t *testing.T) {
	for addr, ok := range map[string]bool{
		"127.0.0.1:80": true, ":0": true, "[::1]:65535": true, "localhost": false,
		"1.2.3.4:65536": false, "1.2.3.4:http": false, "": false,
	} {
		if err := ValidateAddr(addr); (err == nil) != ok {
			t.Errorf("ValidateAddr(%q) = %v, want ok=%v", addr, err, ok)
		}
	}
}

func TestCode(t *testing.T) {
	cases := []struct {
		err  error
		want codes.Code
	}{
		{nil, codes.OK},
		{fmt.Errorf("waiting: %w", context.Canceled), codes.Canceled},
		{fmt.Errorf("step: %w", context.DeadlineExceeded), codes.DeadlineExceeded},
		{fmt.Errorf("top_p: %w", engine.ErrInvalidInput), codes.InvalidArgument},
		{fmt.Errorf("prompt of 600 tokens: %w", engine.ErrContextOverflow), codes.InvalidArgument},
		{fmt.Errorf("need 9 pages: %w", engine.ErrKVCacheFull), codes.ResourceExhausted},
		{fmt.Errorf("arch qwen3: %w", engine.ErrUnsupported), codes.FailedPrecondition},
		{ErrDraining, codes.Unavailable},
		{status.Error(codes.AlreadyExists, "dup"), codes.AlreadyExists},
		{fmt.Errorf("wrapped: %w", status.Error(codes.NotFound, "x")), codes.NotFound},
		{errors.New("mystery"), codes.Internal},
	}
	for _, c := range cases {
		if got := Code(c.err); got != c.want {
			t.Errorf("Code(%v) = %v, want %v", c.err, got, c.want)
		}
		if c.err != nil {
			st := status.Convert(Status(c.err))
			_, isStatus := status.FromError(c.err)
			if st.Code() != c.want || (!isStatus && st.Message() != c.err.Error()) {
				t.Errorf("Status(%v) = %v", c.err, st)
			}
		}
	}
}

// TestServerLifecycle runs a real Server on loopback: it must report SERVING
// once started, follow readiness checks, refuse new RPCs with UNAVAILABLE and
// report NOT_SERVING while draining, and return cleanly.
func TestServerLifecycle(t *testing.T) {
	logger := slog.New(slog.DiscardHandler)
	tp, err := tracing.Init(context.Background(), "svckit-test", logger)
	if err != nil {
		t.Fatal(err)
	}
	defer tp.Shutdown(context.Background())
	srv, err := NewServer("svckit-test", Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", ShutdownTimeout: 5 * time.Second}, logger, tp, ServerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	batonv1.RegisterWorkerServiceServer(srv.GRPC, workerapi.New(&workerapi.Idle{Role: batonv1.WorkerRole_WORKER_ROLE_DECODE, Ready: srv.Ready}))
	var broken atomic.Pointer[string] // the failing check's message, nil when passing
	checkErr := func(context.Context) error {
		if msg := broken.Load(); msg != nil {
			return errors.New(*msg)
		}
		return nil
	}
	srv.AddReadinessCheck("scheduler", checkErr)

	conn, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	health := healthpb.NewHealthClient(conn)
	worker := batonv1.NewWorkerServiceClient(conn)

	type drainObs struct {
		rpcCode codes.Code
		health  healthpb.HealthCheckResponse_ServingStatus
		ready   int
	}
	drained := make(chan drainObs, 1)
	srv.OnDrain(func(ctx context.Context) {
		var o drainObs
		_, err := worker.GetLoad(ctx, &batonv1.GetLoadRequest{})
		o.rpcCode = status.Code(err)
		if r, err := health.Check(ctx, &healthpb.HealthCheckRequest{}); err == nil {
			o.health = r.GetStatus()
		}
		o.ready = httpStatus(t, "http://"+srv.HTTPAddr()+"/health/ready")
		drained <- o
	})

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()

	waitFor(t, func() bool {
		r, err := health.Check(context.Background(), &healthpb.HealthCheckRequest{Service: "baton.v1.WorkerService"})
		return err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING
	})
	if c := httpStatus(t, "http://"+srv.HTTPAddr()+"/health/ready"); c != http.StatusOK {
		t.Fatalf("/health/ready = %d while serving", c)
	}
	if c := httpStatus(t, "http://"+srv.HTTPAddr()+"/health"); c != http.StatusOK {
		t.Fatalf("/health = %d", c)
	}
	load, err := worker.GetLoad(context.Background(), &batonv1.GetLoadRequest{})
	if err != nil || !load.GetLoad().GetReady() {
		t.Fatalf("GetLoad = %v, %v; want ready", load, err)
	}

	// A failing readiness check turns both health surfaces NOT_SERVING, and
	// recovery turns them back.
	msg := "no progress for 12s"
	broken.Store(&msg)
	resp, err := http.Get("http://" + srv.HTTPAddr() + "/health/ready")
	if err != nil {
		t.Fatal(err)
	}
	var body struct {
		Status  string            `json:"status"`
		Failing map[string]string `json:"failing"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || body.Failing["scheduler"] != "no progress for 12s" {
		t.Errorf("/health/ready with failing check = %d %+v", resp.StatusCode, body)
	}
	waitFor(t, func() bool {
		r, err := health.Check(context.Background(), &healthpb.HealthCheckRequest{})
		return err == nil && r.GetStatus() == healthpb.HealthCheckResponse_NOT_SERVING
	})
	broken.Store(nil)
	waitFor(t, func() bool {
		r, err := health.Check(context.Background(), &healthpb.HealthCheckRequest{})
		return err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING
	})

	cancel()
	o := <-drained
	if o.rpcCode != codes.Unavailable {
		t.Errorf("RPC while draining: %v, want UNAVAILABLE", o.rpcCode)
	}
	if o.health != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("health while draining: %v, want NOT_SERVING", o.health)
	}
	if o.ready != http.StatusServiceUnavailable {
		t.Errorf("/health/ready while draining: %d, want 503", o.ready)
	}
	if err := <-done; err != nil {
		t.Errorf("Run = %v, want nil", err)
	}
}

func TestNewServerPortInUse(t *testing.T) {
	logger := slog.New(slog.DiscardHandler)
	tp, _ := tracing.Init(context.Background(), "svckit-test", logger)
	defer tp.Shutdown(context.Background())
	a, err := NewServer("a", Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", ShutdownTimeout: time.Second}, logger, tp, ServerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.closeListeners()
	_, err = NewServer("b", Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: a.HTTPAddr(), ShutdownTimeout: time.Second}, logger, tp, ServerOptions{})
	if err == nil || !strings.Contains(err.Error(), "--http-addr "+a.HTTPAddr()) || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("err = %v", err)
	}
}

func httpStatus(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Errorf("GET %s: %v", url, err)
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Profiles are served only when asked for, and only on the admin
// listener: they reveal the process's internals.
func TestPprofOnlyWithFlag(t *testing.T) {
	logger := slog.New(slog.DiscardHandler)
	tp, _ := tracing.Init(context.Background(), "svckit-test", logger)
	defer tp.Shutdown(context.Background())
	for _, on := range []bool{false, true} {
		srv, err := NewServer("p", Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", ShutdownTimeout: time.Second, Pprof: on}, logger, tp, ServerOptions{})
		if err != nil {
			t.Fatal(err)
		}
		rec := httptest.NewRecorder()
		srv.Admin.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/debug/pprof/goroutine?debug=1", nil))
		srv.closeListeners()
		want := http.StatusNotFound
		if on {
			want = http.StatusOK
		}
		if rec.Code != want {
			t.Errorf("--pprof=%v: GET /debug/pprof/goroutine = %d, want %d", on, rec.Code, want)
		}
	}
}
