package enginehost

import (
	"context"
	"flag"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/baton-serving/baton/engine/sample"
	"github.com/baton-serving/baton/engine/sched"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/svckit"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestPrefixCacheFlags: the defaults, the environment-free parse, and a
// fraction outside [0, 1] refused naming the flag.
func TestPrefixCacheFlags(t *testing.T) {
	parse := func(args ...string) (Flags, error) {
		var f Flags
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		f.AddFlags(fs)
		if err := fs.Parse(args); err != nil {
			return f, err
		}
		return f, f.Validate()
	}
	f, err := parse()
	if err != nil || !f.PrefixCache || f.PrefixCacheMaxFraction != 1 {
		t.Fatalf("defaults: %+v %v", f, err)
	}
	if f, err := parse("--prefix-cache=false", "--prefix-cache-max-fraction", "0.25"); err != nil || f.PrefixCache || f.PrefixCacheMaxFraction != 0.25 {
		t.Fatalf("set: %+v %v", f, err)
	}
	// The environment overrides, as for every flag.
	var ef Flags
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	ef.AddFlags(fs)
	env := map[string]string{"BATON_PREFIX_CACHE": "false", "BATON_PREFIX_CACHE_MAX_FRACTION": "0.5"}
	if err := svckit.ParseFlags(fs, nil, func(k string) (string, bool) { v, ok := env[k]; return v, ok }); err != nil || ef.PrefixCache || ef.PrefixCacheMaxFraction != 0.5 {
		t.Fatalf("from the environment: %+v %v", ef, err)
	}
	for _, bad := range []string{"-0.1", "1.5", "NaN"} {
		if _, err := parse("--prefix-cache-max-fraction", bad); err == nil || !strings.Contains(err.Error(), "--prefix-cache-max-fraction") {
			t.Errorf("fraction %s: %v", bad, err)
		}
	}
}

// TestPrefixCacheHost: a host reuses a prompt's pages for the same prompt
// (CachedTokens, baton:cache_hit_rate, baton:prefix_cache_pages), POST
// /debug/cache/flush evicts them all and the pool is empty afterwards; with
// --prefix-cache=false nothing is cached.
func TestPrefixCacheHost(t *testing.T) {
	run := func(h *Host) sched.Usage {
		t.Helper()
		p := sample.Defaults()
		p.Temperature = 0
		prompt := make([]int32, 40)
		for i := range prompt {
			prompt[i] = int32(100 + i)
		}
		st, err := h.Sched.Submit(context.Background(), sched.Request{Prompt: prompt, MaxTokens: 4, Params: p, IgnoreEOS: true})
		if err != nil {
			t.Fatal(err)
		}
		timeout := time.After(time.Minute)
		for {
			select {
			case ev := <-st.Events():
				if ev.Kind == sched.EventDone {
					return ev.Usage
				}
			case <-timeout:
				t.Fatal("request did not finish")
			}
		}
	}
	h, srv := openTestHost(t, "--page-size", "4")
	if u := run(h); u.CachedTokens != 0 {
		t.Fatalf("first request reused %d tokens", u.CachedTokens)
	}
	if u := run(h); u.CachedTokens != 36 {
		t.Fatalf("second request reused %d tokens, want 36 (9 full pages, the last one computed)", u.CachedTokens)
	}
	// The scheduler reports a request's end to the metrics just after its
	// last event: wait for it.
	for deadline := time.Now().Add(10 * time.Second); testutil.ToFloat64(h.Metrics.cacheHitRate) != 36.0/80 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	if rate := testutil.ToFloat64(h.Metrics.cacheHitRate); rate != 36.0/80 {
		t.Errorf("baton:cache_hit_rate %v, want %v", rate, 36.0/80)
	}
	if pages := testutil.ToFloat64(h.Metrics.prefixPages); pages == 0 {
		t.Error("baton:prefix_cache_pages is 0")
	}
	code, body := post(t, srv.Admin, "/debug/cache/flush")
	if code != http.StatusOK || !strings.Contains(body, `"cached":0`) || strings.Contains(body, `"evicted":0`) {
		t.Fatalf("flush: %d %s", code, body)
	}
	if rep := h.Sched.Audit(); !rep.OK() || rep.PagesUsed != 0 {
		t.Fatalf("after the flush: %+v", rep)
	}
	if code, body := post(t, srv.Admin, "/debug/cache/flush"); code != http.StatusOK || !strings.Contains(body, `"evicted":0`) {
		t.Fatalf("second flush: %d %s", code, body)
	}

	off, _ := openTestHost(t, "--page-size", "4", "--prefix-cache=false")
	run(off)
	if u := run(off); u.CachedTokens != 0 || off.Pool.Stats().Used != 0 {
		t.Fatalf("--prefix-cache=false reused %d tokens, %d pages used", u.CachedTokens, off.Pool.Stats().Used)
	}
}

// TestCacheHitWindow: the hit rate covers the last hitWindowSize requests.
func TestCacheHitWindow(t *testing.T) {
	m := newMetrics(prometheus.NewRegistry(), batonv1.WorkerRole_WORKER_ROLE_DECODE)
	m.RequestDone(sched.Summary{ID: "a", Usage: sched.Usage{PromptTokens: 10, CachedTokens: 10}})
	m.RequestDone(sched.Summary{ID: "canary-1", Usage: sched.Usage{PromptTokens: 10}})
	if r := testutil.ToFloat64(m.cacheHitRate); r != 1 {
		t.Fatalf("rate %v, want 1 (canaries left out)", r)
	}
	for range hitWindowSize {
		m.RequestDone(sched.Summary{ID: "b", Usage: sched.Usage{PromptTokens: 10}})
	}
	if r := testutil.ToFloat64(m.cacheHitRate); r != 0 {
		t.Fatalf("rate %v after a window of misses, want 0", r)
	}
}
