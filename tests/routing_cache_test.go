//go:build e2e

package tests

import (
	"math"
	"testing"
	"time"

	"github.com/baton-serving/baton/engine/refdata"
)

// TestCacheAwareRouting replays the same 8 conversations of 4 turns
// through a colocated fleet of two decode workers, once with
// --decode-policy round-robin and once with cache-aware: cache-aware sends
// each turn back to the worker holding the conversation's earlier turns,
// so the workers reuse far more of the prompts (the hit rate the workers
// report in usage, and the router's own count of pages held), at the same
// output. Then a decode worker holding cached pages is killed with
// SIGKILL: the router forgets its index at once and the conversations go
// on on the other.
func TestCacheAwareRouting(t *testing.T) {
	const pageSize = 16 // the workers' default --page-size
	model := refdata.Model(t)
	rates := map[string]float64{}
	var last *fleet
	for _, policy := range []string{"round-robin", "cache-aware"} {
		f := startFleet(t, 0, 2, map[string][]string{"router": {"--decode-policy", policy, "--canary-interval", "0"}})
		res := runBench(t, "--router", f.router.grpc, "--model", model, "--dataset", "multi-turn", "--num-conversations", "8",
			"--num-turns", "4", "--prefix-len", "64", "--random-input-len", "32", "--random-output-len", "16",
			"--think-time", "10ms", "--ignore-eos", "--warmup", "0", "--seed", "11")
		run := res.Runs[0]
		if run.Completed != 32 || run.Failed != 0 {
			t.Fatalf("%s: %d completed, %d failed (%v)", policy, run.Completed, run.Failed, run.Errors)
		}
		m := metrics(t, f.router.http)
		routerRate := m["baton_router_prefix_pages_held_total"] / m["baton_router_prefix_pages_total"]
		reportedRate := m["baton_router_prefix_pages_reported_total"] / m["baton_router_prefix_pages_total"]
		t.Logf("%s: cache hit rate %.3f (%d prompt tokens of %d reused); router's index: %.3f of the reusable pages held (%.3f by the workers' reports alone); output %.1f tok/s",
			policy, run.CacheHitRate, run.CachedTokens, run.TotalInputTokens, routerRate, reportedRate, run.OutputThroughput)
		// What a cache could reuse at best: each turn's full pages of the
		// previous turn's prompt (the answers in the history are the
		// dataset's, not the server's, so nothing past them matches).
		prev := map[[2]int]int{}
		for _, r := range run.Requests {
			prev[[2]int{*r.Conversation, *r.Turn}] = r.InputTokens
		}
		ceiling := 0
		for _, r := range run.Requests {
			if *r.Turn > 0 {
				ceiling += prev[[2]int{*r.Conversation, *r.Turn - 1}] / pageSize * pageSize
			}
		}
		share := float64(run.CachedTokens) / float64(ceiling)
		t.Logf("%s: %.2f of the %d reusable prompt tokens reused", policy, share, ceiling)
		// The router's estimate of what its picks held is what the
		// workers then reused (pages against tokens: the same share, up
		// to each prompt's last partial page).
		if math.Abs(routerRate-run.CacheHitRate) > 0.1 {
			t.Errorf("%s: the router estimates %.3f of the reusable pages held, the workers reused %.3f of the prompt tokens", policy, routerRate, run.CacheHitRate)
		}
		rates[policy] = share
		last = f
	}
	// Cache-aware reuses nearly everything reusable; round-robin, whose
	// turns land on the worker holding the previous one half the time,
	// clearly less.
	if ca, rr := rates["cache-aware"], rates["round-robin"]; ca < 0.9 || ca <= rr {
		t.Errorf("cache-aware reused %.2f of the reusable prompt tokens, round-robin %.2f; want ≥ 0.9 and more than round-robin", ca, rr)
	} else {
		t.Logf("cache-aware reused %.2f× what round-robin did", ca/max(rr, 1e-9))
	}

	// kill -9 a decode worker that holds cached pages.
	f := last
	var victim, other *node
	for _, n := range f.decodes {
		if w, ok := f.view(t).worker(n.grpc); ok && w.CachePages > 0 && victim == nil {
			victim = n
		} else {
			other = n
		}
	}
	if victim == nil || other == nil {
		t.Fatalf("no decode worker's cache is indexed: %+v", f.view(t).Decode.Workers)
	}
	f.kill9(t, victim)
	deadline := time.Now().Add(10 * time.Second)
	for {
		w, ok := f.view(t).worker(victim.grpc)
		if ok && w.CachePages == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("10 s after kill -9 the router still indexes %d pages of %s", w.CachePages, victim.grpc)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if m := metricsByWorker(t, f.router.http, "baton_router_cache_index_pages"); m[victim.grpc] != 0 {
		t.Errorf("baton_router_cache_index_pages{worker=%q} = %v after kill -9, want 0", victim.grpc, m[victim.grpc])
	}
	res := runBench(t, "--router", f.router.grpc, "--model", model, "--dataset", "multi-turn", "--num-conversations", "4",
		"--num-turns", "2", "--prefix-len", "64", "--random-input-len", "32", "--random-output-len", "16",
		"--think-time", "10ms", "--ignore-eos", "--warmup", "0", "--seed", "11")
	if run := res.Runs[0]; run.Completed != 8 || run.Failed != 0 {
		t.Fatalf("after kill -9: %d completed, %d failed (%v)", run.Completed, run.Failed, run.Errors)
	}
	if w, ok := f.view(t).worker(victim.grpc); !ok || w.CachePages != 0 || w.Routable {
		t.Errorf("the killed worker (listed %v): %+v", ok, w)
	}
}

// metricsByWorker reads one metric's values by their worker label.
func metricsByWorker(t testing.TB, httpAddr, name string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	f, ok := scrape(t, httpAddr)[name]
	if !ok {
		t.Fatalf("%s: no %s", httpAddr, name)
	}
	for _, m := range f.GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "worker" {
				out[l.GetValue()] = m.GetGauge().GetValue()
			}
		}
	}
	return out
}
