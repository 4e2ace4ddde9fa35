//go:build e2e

package tests

import (
	"context"
	"os"
	"sync"
	"sync/atomic"
	"testing"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"google.golang.org/protobuf/proto"
)

// BenchmarkTracingOverhead measures generation throughput through the router,
// PD on the shared test model, with tracing off (nothing sampled, nothing
// exported) and on (every request sampled, ratio 1.0, and exported to the
// Jaeger at BATON_JAEGER_OTLP). Each iteration runs 8 concurrent requests of
// 128 tokens; the figure is tokens/s. Without BATON_JAEGER_QUERY it is
// skipped.
//
//	BATON_JAEGER_QUERY=http://127.0.0.1:16686 BATON_JAEGER_OTLP=http://127.0.0.1:4317 \
//	  go test -tags e2e -run '^$' -bench TracingOverhead -benchtime 20x ./tests/
func BenchmarkTracingOverhead(b *testing.B) {
	if os.Getenv("BATON_JAEGER_QUERY") == "" {
		b.Skip("BATON_JAEGER_QUERY not set: no collector to export to")
	}
	otlp := os.Getenv("BATON_JAEGER_OTLP")
	if otlp == "" {
		otlp = "http://127.0.0.1:4317"
	}
	modes := []struct {
		name string
		env  []string
	}{
		{"off", []string{"OTEL_TRACES_SAMPLER=always_off"}},
		{"on", []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + otlp, "OTEL_TRACES_SAMPLER=traceidratio", "OTEL_TRACES_SAMPLER_ARG=1.0"}},
	}
	const concurrent, tokens = 8, 128
	for _, m := range modes {
		b.Run("tracing="+m.name, func(b *testing.B) {
			c := startClusterEnv(b, m.env, nil)
			client := c.client(b, c.router)
			req := &batonv1.GenerateRequest{Prompt: "Once upon a time", Sampling: &batonv1.SamplingParams{
				Temperature: proto.Float32(0), MaxNewTokens: tokens, IgnoreEos: true}}
			var generated atomic.Int64
			run := func() {
				var wg sync.WaitGroup
				for range concurrent {
					wg.Go(func() {
						resp, err := complete(context.Background(), client, req)
						if err != nil {
							b.Error(err)
							return
						}
						generated.Add(int64(len(resp.GetTokenIds())))
					})
				}
				wg.Wait()
			}
			run() // warm up
			generated.Store(0)
			b.ResetTimer()
			for range b.N {
				run()
			}
			b.ReportMetric(float64(generated.Load())/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}
