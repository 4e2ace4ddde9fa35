package model

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/baton-serving/baton/engine/gguf"
)

// Model-level benchmarks on real-sized GGUF files, such as those
// `batonctl gen-model --preset llama-110m|tinyllama-1.1b` writes. They are
// skipped unless BATON_BENCH_MODEL lists the files (comma-separated), since
// the shapes worth measuring are hundreds of megabytes to gigabytes:
//
//	BATON_BENCH_MODEL=/tmp/llama-110m-f32.gguf,/tmp/tinyllama-q8_0.gguf \
//	  go test -run '^$' -bench Shape -benchtime 3x ./model/
//
// Each runs at 1 thread and at GOMAXPROCS threads. pp128 reports prompt
// tokens/s; tg reports generated tokens/s and the weight bandwidth, the
// file's tensor bytes over the time per token (every weight is read once
// per decode step; an untied embedding is counted too, which overstates
// the bandwidth by one embedding matrix).

func benchFiles(b *testing.B) []string {
	env := os.Getenv("BATON_BENCH_MODEL")
	if env == "" {
		b.Skip("BATON_BENCH_MODEL is not set: no model files to benchmark")
	}
	return strings.Split(env, ",")
}

func benchThreads() []int {
	if n := runtime.GOMAXPROCS(0); n > 1 {
		return []int{1, n}
	}
	return []int{1}
}

// openBench opens one file and loads it with threads threads.
func openBench(b *testing.B, path string, threads int) (Model, int64) {
	b.Helper()
	f, err := gguf.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { f.Close() })
	m, err := Load(f, Options{Threads: threads})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { m.Close() })
	var bytes int64
	for i := range f.Tensors {
		bytes += int64(f.Tensors[i].Size)
	}
	return m, bytes
}

func BenchmarkShapePP128(b *testing.B) {
	for _, path := range benchFiles(b) {
		for _, threads := range benchThreads() {
			b.Run(fmt.Sprintf("%s/threads=%d", filepath.Base(path), threads), func(b *testing.B) {
				m, _ := openBench(b, path, threads)
				cfg := m.Config()
				cache, err := NewContiguousCache(cfg, 128)
				if err != nil {
					b.Fatal(err)
				}
				prompt := make([]int32, 128)
				for i := range prompt {
					prompt[i] = int32((i*7919 + 13) % cfg.Vocab)
				}
				logits := make([]float32, cfg.Vocab)
				for b.Loop() {
					if err := m.Forward(prompt, 0, cache, logits); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(len(prompt)*b.N)/b.Elapsed().Seconds(), "tokens/s")
			})
		}
	}
}

func BenchmarkShapeTG(b *testing.B) {
	for _, path := range benchFiles(b) {
		for _, threads := range benchThreads() {
			b.Run(fmt.Sprintf("%s/threads=%d", filepath.Base(path), threads), func(b *testing.B) {
				m, bytes := openBench(b, path, threads)
				cfg := m.Config()
				const ctx = 64
				cache, err := NewContiguousCache(cfg, ctx)
				if err != nil {
					b.Fatal(err)
				}
				logits := make([]float32, cfg.Vocab)
				pos := 0
				for b.Loop() {
					if pos == ctx {
						pos = 0 // start over: decode positions 0…ctx-1
					}
					if err := m.Forward([]int32{int32((pos*31 + 7) % cfg.Vocab)}, pos, cache, logits); err != nil {
						b.Fatal(err)
					}
					pos++
				}
				perToken := b.Elapsed().Seconds() / float64(b.N)
				b.ReportMetric(1/perToken, "tokens/s")
				b.ReportMetric(float64(bytes)/perToken/1e9, "GB/s")
			})
		}
	}
}
