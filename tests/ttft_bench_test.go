//go:build e2e

package tests

import (
	"context"
	"fmt"
	"os"
	"sort"
	"testing"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"google.golang.org/protobuf/proto"
)

// BenchmarkTTFT measures time to first token through the router for PD (the
// prompt computed by prefill and its KV cache streamed to decode) and for
// colocated generation (decode computes the prompt itself), side by side on
// the same decode worker, at prompt lengths 16, 128 and 512. The model comes
// from BATON_BENCH_MODEL (e.g. a llama-110m F32 file made by
// `batonctl gen-model --preset llama-110m --out /tmp/llama-110m-f32.gguf`);
// without it the benchmark is skipped.
//
//	BATON_BENCH_MODEL=/tmp/llama-110m-f32.gguf go test -tags e2e -run '^$' -bench TTFT -benchtime 10x ./tests/
func BenchmarkTTFT(b *testing.B) {
	path := os.Getenv("BATON_BENCH_MODEL")
	if path == "" {
		b.Skip("BATON_BENCH_MODEL not set")
	}
	c := startClusterModel(b, path, map[string][]string{
		"prefill": {"--context-length", "1024"}, "decode": {"--context-length", "1024"}, "router": {"--context-length", "1024"}})
	for _, n := range []int{16, 128, 512} {
		for _, mode := range []string{"colocated", "pd"} {
			b.Run(fmt.Sprintf("prompt=%d/%s", n, mode), func(b *testing.B) {
				client := c.client(b, c.router)
				if mode == "colocated" {
					client = c.client(b, c.colocated)
				}
				prompt := make([]uint32, n)
				for i := range prompt {
					prompt[i] = uint32(100 + i%200)
				}
				prompt[0] = 1
				var ttfts []time.Duration
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					start := time.Now()
					stream, err := client.Generate(context.Background(), &batonv1.GenerateRequest{PromptTokenIds: prompt,
						Sampling: &batonv1.SamplingParams{Temperature: proto.Float32(0), MaxNewTokens: 1}})
					if err != nil {
						b.Fatal(err)
					}
					for {
						ev, err := stream.Recv()
						if err != nil {
							b.Fatal(err)
						}
						if len(ev.GetEvent().GetTokenIds()) > 0 {
							ttfts = append(ttfts, time.Since(start))
							break
						}
					}
					for _, err := stream.Recv(); err == nil; _, err = stream.Recv() {
					}
				}
				sort.Slice(ttfts, func(i, j int) bool { return ttfts[i] < ttfts[j] })
				b.ReportMetric(float64(ttfts[len(ttfts)/2].Microseconds())/1000, "p50_ttft_ms")
			})
		}
	}
}
