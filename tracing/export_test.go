package tracing

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestCollectorDownIsQuiet: with the collector refusing connections, making
// spans stays cheap (export is asynchronous and drops what it cannot send),
// and the export errors are logged a bounded number of times, not per span
// or per batch.
func TestCollectorDownIsQuiet(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close() // connections to addr are now refused
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+addr)
	t.Setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "50") // ms per export, retries included
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "5")     // ms: many export attempts in the test
	var logs syncBuffer
	p, err := Init(context.Background(), "test-svc", slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	const spans = 2000
	for i := range spans {
		ctx, root := p.Tracer("t").Start(context.Background(), "rpc")
		_, child := Start(ctx, SpanDecode)
		child.End()
		root.End()
		if i%200 == 0 {
			time.Sleep(20 * time.Millisecond) // let batches go out (and fail)
		}
	}
	took := time.Since(start)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = p.Shutdown(ctx)
	if per := took / spans; per > time.Millisecond {
		t.Errorf("%v per span pair with the collector down; export must not slow requests", per)
	}
	n := strings.Count(logs.String(), "opentelemetry error")
	if n < 1 || n > 2 {
		t.Errorf("logged %d export errors, want 1 or 2 (rate-limited):\n%s", n, logs.String())
	}
	t.Logf("%d span pairs in %v; %d log lines:\n%s", spans, took, n, logs.String())
}
