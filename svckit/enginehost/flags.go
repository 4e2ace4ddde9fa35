// Package enginehost runs Baton's inference engine inside a worker service:
// the flags that size it, loading the model, the KV cache page pool and the
// continuous-batching scheduler, the Prometheus metrics the scheduler
// reports, and the WorkerService view of it all. The prefill and decode
// workers each embed one Host.
package enginehost

import (
	"flag"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/baton-serving/baton/kernels/quant"
	"github.com/baton-serving/baton/svckit/device"
)

// Flags size the engine.
type Flags struct {
	// Device is what the engine computes on (--device; svckit/device).
	Device         device.Spec
	Threads        int
	KVCacheBytes   ByteSize
	PageSize       int
	KVDType        string
	ContextLength  int
	MaxBatchTokens int
	MaxSeqs        int
	MaxRequests    int
	StallTimeout   time.Duration
	// PrefixCache keeps computed full KV pages for later prompts that
	// start with the same tokens; PrefixCacheMaxFraction caps the share of
	// the pool they may keep.
	PrefixCache            bool
	PrefixCacheMaxFraction float64
	// DebugHooks serves test hooks such as POST /debug/freeze (freeze.go).
	DebugHooks bool
}

// AddFlags registers the engine flags.
func (f *Flags) AddFlags(fs *flag.FlagSet) {
	f.KVCacheBytes = 1 << 30
	fs.Var(&f.Device, "device", device.FlagHelp)
	fs.IntVar(&f.Threads, "threads", 0, "goroutines for a forward pass on the CPU (0: the number of usable cores)")
	fs.Var(&f.KVCacheBytes, "kv-cache-bytes", "memory for KV cache pages, in bytes or with a unit (512MiB, 4GiB); on a GPU, device memory")
	fs.IntVar(&f.PageSize, "page-size", 16, "tokens per KV cache page (must match across prefill and decode)")
	fs.StringVar(&f.KVDType, "kv-dtype", "f16", "KV cache element type: f16 or f32 (must match across prefill and decode)")
	fs.IntVar(&f.ContextLength, "context-length", 0, "context window in tokens (0: the model's own)")
	fs.IntVar(&f.MaxBatchTokens, "max-batch-tokens", 512, "tokens in one forward step: decode tokens plus prompt chunks")
	fs.IntVar(&f.MaxSeqs, "max-seqs", 128, "requests computing at once")
	fs.IntVar(&f.MaxRequests, "max-requests", 4096, "requests in flight, queued ones included; beyond it new requests get RESOURCE_EXHAUSTED")
	fs.DurationVar(&f.StallTimeout, "stall-timeout", 10*time.Second, "readiness turns NOT_SERVING when a forward step outlives its bound (4x its expected time at the measured speed, at least this) or requests the engine could compute wait this long without a step")
	fs.BoolVar(&f.PrefixCache, "prefix-cache", true, "keep computed KV cache pages after their request and reuse them for prompts that start with the same tokens (docs/prefix-cache.md)")
	fs.Float64Var(&f.PrefixCacheMaxFraction, "prefix-cache-max-fraction", 1.0, "share of the KV cache pages the prefix cache may keep, in [0, 1]; pages no request holds are evicted least recently used when requests need them")
	fs.BoolVar(&f.DebugHooks, "debug-hooks", false, "serve test hooks on the admin listener (--admin-addr; POST /debug/freeze stalls the scheduler): for chaos tests only, never in production")
}

// Validate checks the engine flags.
func (f *Flags) Validate() error {
	switch {
	case f.Threads < 0 || f.Threads > 4*runtime.NumCPU()+64:
		return fmt.Errorf("--threads: %d, want 0-%d", f.Threads, 4*runtime.NumCPU()+64)
	case f.KVCacheBytes <= 0:
		return fmt.Errorf("--kv-cache-bytes: must be positive")
	case f.PageSize < 1 || f.PageSize > 1024:
		return fmt.Errorf("--page-size: %d, want 1-1024", f.PageSize)
	case f.ContextLength < 0:
		return fmt.Errorf("--context-length: %d, want ≥ 0", f.ContextLength)
	case f.MaxBatchTokens < 1:
		return fmt.Errorf("--max-batch-tokens: %d, want ≥ 1", f.MaxBatchTokens)
	case f.MaxSeqs < 1:
		return fmt.Errorf("--max-seqs: %d, want ≥ 1", f.MaxSeqs)
	case f.StallTimeout <= 0:
		return fmt.Errorf("--stall-timeout: must be positive")
	case f.MaxRequests < 1:
		return fmt.Errorf("--max-requests: %d, want ≥ 1", f.MaxRequests)
	case !(f.PrefixCacheMaxFraction >= 0 && f.PrefixCacheMaxFraction <= 1): // NaN too
		return fmt.Errorf("--prefix-cache-max-fraction: %v, want a number in [0, 1]", f.PrefixCacheMaxFraction)
	}
	if _, err := f.dtype(); err != nil {
		return err
	}
	return nil
}

func (f *Flags) dtype() (quant.Type, error) {
	switch strings.ToLower(f.KVDType) {
	case "f16":
		return quant.F16, nil
	case "f32":
		return quant.F32, nil
	}
	return 0, fmt.Errorf("--kv-dtype: %q, want f16 or f32", f.KVDType)
}

// ByteSize is a flag value in bytes that accepts KiB/MiB/GiB (and KB/MB/GB)
// suffixes.
type ByteSize int64

func (b *ByteSize) String() string { return strconv.FormatInt(int64(*b), 10) }

// Set parses "1073741824", "512MiB", "4GiB", "100MB".
func (b *ByteSize) Set(s string) error {
	units := []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"B", 1}}
	num, mult := strings.TrimSpace(s), int64(1)
	for _, u := range units {
		if strings.HasSuffix(num, u.suffix) {
			num, mult = strings.TrimSpace(strings.TrimSuffix(num, u.suffix)), u.mult
			break
		}
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || v <= 0 || v*float64(mult) > 1<<50 {
		return fmt.Errorf("want a positive size such as 1073741824, 512MiB or 4GiB")
	}
	*b = ByteSize(v * float64(mult))
	return nil
}
