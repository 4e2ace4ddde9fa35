package sched

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/baton-serving/baton/engine/kvcache"
	"github.com/baton-serving/baton/engine/testmodel"
	"github.com/baton-serving/baton/kernels/quant"
)

// benchModel loads $BATON_BENCH_MODEL, or writes the llama-110m preset shape
// (Q8_0, about 120 MB) and loads that; the setup is not timed.
func benchModel(b *testing.B) testModel {
	if path := os.Getenv("BATON_BENCH_MODEL"); path != "" {
		return loadGGUF(b, path, 0)
	}
	s, _ := testmodel.Preset("llama-110m")
	path := filepath.Join(b.TempDir(), "llama-110m.gguf")
	if err := testmodel.Write(path, s); err != nil {
		b.Fatal(err)
	}
	return loadGGUF(b, path, 0)
}

// BenchmarkDecodeBatch measures aggregate decode throughput with B
// sequences generating together (one-token prompts, 32 tokens each, EOS
// ignored): the tokens/s metric is what `batonctl bench-engine` reports as
// tg_tokens_per_second. Batching reads each weight matrix once per step for
// all B sequences, which is where the speed-up over B = 1 comes from.
func BenchmarkDecodeBatch(b *testing.B) {
	tm := benchModel(b)
	const n = 32
	for _, batch := range []int{1, 4, 16, 64} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			l := tm.cfg().KVLayout(kvcache.DefaultPageSize, quant.F32)
			pool, err := kvcache.New(l, batch*l.PagesFor(n+1))
			if err != nil {
				b.Fatal(err)
			}
			s := newSched(b, Config{Model: tm.m, Pool: pool, MaxSeqs: batch, MaxBatchTokens: max(batch, 16), EventBuffer: n + 2})
			req := Request{Prompt: []int32{1}, MaxTokens: n, Params: greedy(), IgnoreEOS: true}
			for b.Loop() {
				streams := make([]*Stream, batch)
				for i := range streams {
					if streams[i], err = s.Submit(context.Background(), req); err != nil {
						b.Fatal(err)
					}
				}
				var wg sync.WaitGroup
				for _, st := range streams {
					wg.Go(func() {
						for range st.Events() {
						}
					})
				}
				wg.Wait()
			}
			b.ReportMetric(float64(batch*n*b.N)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}
