package svckit

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/baton-serving/baton/tracing"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// TestReadinessBlockedCheck: a readiness check that blocks (and ignores its
// context) must not freeze readiness. /health/ready answers promptly with
// 503 naming the check as timed out, gRPC health turns NOT_SERVING, and
// both recover once the check answers again.
func TestReadinessBlockedCheck(t *testing.T) {
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
	var blocked atomic.Bool
	release := make(chan struct{})
	released := false
	unblock := func() {
		if !released {
			released = true
			blocked.Store(false)
			close(release)
		}
	}
	defer unblock()
	srv.AddReadinessCheck("stuck", func(context.Context) error {
		if blocked.Load() {
			<-release // ignores its context, as a deadlocked check would
		}
		return nil
	})
	srv.AddReadinessCheck("fine", func(context.Context) error { return nil })

	conn, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	health := healthpb.NewHealthClient(conn)
	serving := func(want healthpb.HealthCheckResponse_ServingStatus) func() bool {
		return func() bool {
			r, err := health.Check(context.Background(), &healthpb.HealthCheckRequest{})
			return err == nil && r.GetStatus() == want
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	defer func() {
		unblock()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
	}()
	waitFor(t, serving(healthpb.HealthCheckResponse_SERVING))

	blocked.Store(true)
	client := &http.Client{Timeout: 5 * time.Second}
	start := time.Now()
	resp, err := client.Get("http://" + srv.HTTPAddr() + "/health/ready")
	if err != nil {
		t.Errorf("/health/ready with a blocked check: %v after %v, want a prompt 503", err, time.Since(start).Round(time.Millisecond))
	} else {
		var body struct {
			Status  string            `json:"status"`
			Failing map[string]string `json:"failing"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body.Failing["stuck"], "check stuck timed out") {
			t.Errorf("/health/ready with a blocked check = %d %+v, want 503 naming check stuck as timed out", resp.StatusCode, body)
		}
		if _, ok := body.Failing["fine"]; ok {
			t.Errorf("/health/ready: passing check reported failing: %+v", body)
		}
	}
	if !eventually(10*time.Second, serving(healthpb.HealthCheckResponse_NOT_SERVING)) {
		t.Errorf("gRPC health still not NOT_SERVING 10s after a check blocked")
	}

	unblock()
	waitFor(t, serving(healthpb.HealthCheckResponse_SERVING))
	if c := httpStatus(t, "http://"+srv.HTTPAddr()+"/health/ready"); c != http.StatusOK {
		t.Errorf("/health/ready after the check answered again = %d, want 200", c)
	}
}

// TestReadyHonoursContext: Ready returns by its context's deadline even
// while a check blocks longer than that.
func TestReadyHonoursContext(t *testing.T) {
	logger := slog.New(slog.DiscardHandler)
	tp, _ := tracing.Init(context.Background(), "svckit-test", logger)
	defer tp.Shutdown(context.Background())
	srv, err := NewServer("r", Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", ShutdownTimeout: time.Second}, logger, tp, ServerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.closeListeners()
	release := make(chan struct{})
	defer close(release)
	srv.AddReadinessCheck("stuck", func(context.Context) error { <-release; return nil })
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	got := make(chan map[string]string, 1)
	go func() { got <- srv.Ready(ctx) }()
	select {
	case failed := <-got:
		if failed["stuck"] == "" {
			t.Errorf("Ready = %v, want check stuck failing", failed)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Ready still blocked 5s after its context's 100ms deadline")
	}
}

// eventually polls cond until it holds or d passes.
func eventually(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}
