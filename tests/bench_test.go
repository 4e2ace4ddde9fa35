//go:build e2e

package tests

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/baton-serving/baton/engine/refdata"
)

// benchResult is the part of `batonctl bench --json` these tests read
// (docs/benchmarks.md documents every field).
type benchResult struct {
	Backend string `json:"backend"`
	Model   string `json:"model"`
	Runs    []struct {
		RateLabel         string    `json:"request_rate_label"`
		RequestRate       *float64  `json:"request_rate"`
		Completed         int       `json:"completed"`
		Failed            int       `json:"failed"`
		Errors            []any     `json:"errors"`
		DurationS         float64   `json:"duration_s"`
		TotalInputTokens  int       `json:"total_input_tokens"`
		TotalOutputTokens int       `json:"total_output_tokens"`
		RequestThroughput float64   `json:"request_throughput"`
		OutputThroughput  float64   `json:"output_throughput"`
		TotalThroughput   float64   `json:"total_token_throughput"`
		TTFT              benchDist `json:"ttft"`
		TPOT              benchDist `json:"tpot"`
		ITL               benchDist `json:"itl"`
		E2E               benchDist `json:"e2e"`
		Good              int       `json:"good_requests"`
		Goodput           float64   `json:"goodput"`
		CachedTokens      int       `json:"cached_tokens"`
		CacheHitRate      float64   `json:"cache_hit_rate"`
		KVBytesPerRequest *float64  `json:"kv_transfer_bytes_per_request"`
		Requests          []struct {
			InputTokens  int       `json:"input_tokens"`
			OutputTokens int       `json:"output_tokens"`
			TTFTMS       *float64  `json:"ttft_ms"`
			TPOTMS       *float64  `json:"tpot_ms"`
			E2EMS        float64   `json:"e2e_ms"`
			ITLMS        []float64 `json:"itl_ms"`
			ServerTTFTMS *float64  `json:"server_ttft_ms"`
			CachedTokens int       `json:"cached_tokens"`
			KVBytes      *uint64   `json:"kv_transfer_bytes"`
			Conversation *int      `json:"conversation"`
			Turn         *int      `json:"turn"`
			Error        string    `json:"error"`
		} `json:"requests"`
	} `json:"runs"`
}

type benchDist struct {
	N      int     `json:"count"`
	Mean   float64 `json:"mean_ms"`
	Median float64 `json:"median_ms"`
	P90    float64 `json:"p90_ms"`
	P99    float64 `json:"p99_ms"`
	Min    float64 `json:"min_ms"`
	Max    float64 `json:"max_ms"`
}

func (d benchDist) check(t *testing.T, name string, n int) {
	t.Helper()
	if d.N != n || !(d.Min <= d.Median && d.Median <= d.P90 && d.P90 <= d.P99 && d.P99 <= d.Max) ||
		d.Mean < d.Min || d.Mean > d.Max || d.Min < 0 {
		t.Errorf("%s: %+v (want %d values, ordered percentiles)", name, d, n)
	}
}

// ttftHistogram is baton:time_to_first_token_seconds from one service,
// summed over its label sets.
type ttftHistogram struct {
	bounds []float64 // upper bounds, +Inf last
	counts []uint64  // cumulative
	sum    float64
	count  uint64
}

func readTTFT(t *testing.T, httpAddr string) ttftHistogram {
	t.Helper()
	f := scrape(t, httpAddr)["baton:time_to_first_token_seconds"]
	if f == nil || len(f.GetMetric()) == 0 {
		t.Fatalf("%s exports no baton:time_to_first_token_seconds", httpAddr)
	}
	var h ttftHistogram
	for _, m := range f.GetMetric() {
		hist := m.GetHistogram()
		h.sum += hist.GetSampleSum()
		h.count += hist.GetSampleCount()
		for i, b := range hist.GetBucket() {
			if len(h.bounds) <= i {
				h.bounds = append(h.bounds, b.GetUpperBound())
				h.counts = append(h.counts, 0)
			}
			h.counts[i] += b.GetCumulativeCount()
		}
	}
	if n := len(h.bounds); n == 0 || !math.IsInf(h.bounds[n-1], 1) {
		h.bounds = append(h.bounds, math.Inf(1))
		h.counts = append(h.counts, h.count)
	}
	return h
}

func (h ttftHistogram) minus(before ttftHistogram) ttftHistogram {
	d := ttftHistogram{bounds: h.bounds, counts: make([]uint64, len(h.counts)), sum: h.sum - before.sum, count: h.count - before.count}
	for i := range h.counts {
		d.counts[i] = h.counts[i] - before.counts[i]
	}
	return d
}

// clientSlack is how much later than a service the bench may see a first
// token and still agree with the service's histogram (checkTTFTAgrees).
const clientSlack = 0.025 // seconds

// checkTTFTAgrees checks the bench's TTFTs (seconds) against a service's
// histogram of the same requests, to the histogram's resolution. A
// service's interval lies inside the client's (it starts later and sees
// the first token sooner), so for every bucket bound le the bench can
// never have more requests at or below le than the service; and the
// client's overhead must not push a request beyond the next bucket (or
// clientSlack).
func checkTTFTAgrees(t *testing.T, service string, h ttftHistogram, bench []float64) {
	t.Helper()
	if int(h.count) != len(bench) {
		t.Fatalf("%s counted %d first tokens during the run, the bench %d requests", service, h.count, len(bench))
	}
	atOrBelow := func(le float64) uint64 {
		return uint64(sort.Search(len(bench), func(i int) bool { return bench[i] > le }))
	}
	for i, le := range h.bounds {
		next := math.Inf(1)
		if i+1 < len(h.bounds) {
			next = h.bounds[i+1]
		}
		// The bench sees each first token after the service does, by the
		// relay and its own scheduling: at the millisecond buckets that is
		// more than a bucket on a loaded 2-core machine (a request at 3 ms
		// in the router was 10.5 ms in the bench), so the later bound is
		// the next bucket or clientSlack past this one, whichever is later.
		upper := max(next, le+clientSlack)
		b, s, bNext := atOrBelow(le), h.counts[i], atOrBelow(upper)
		if b > s || s > bNext {
			t.Errorf("%s: %d requests with TTFT ≤ %gs, the bench %d (and %d ≤ %gs): disagree beyond one bucket or %v",
				service, s, le, b, bNext, upper, clientSlack)
		}
	}
	var total float64
	for _, v := range bench {
		total += v
	}
	if total < h.sum {
		t.Errorf("%s: TTFTs add up to %.6fs, more than the bench's %.6fs", service, h.sum, total)
	}
	t.Logf("%s: mean TTFT %.2f ms, the bench's %.2f ms; buckets %v counts %v",
		service, 1000*h.sum/float64(h.count), 1000*total/float64(len(bench)), h.bounds, h.counts)
}

// checkNested checks the decode worker's TTFT histogram against the
// router's: decode's interval of each request lies inside the router's
// (it starts after routing and ends before the router relays the token),
// so at every bound decode counts at least as many requests, and its sum is
// no larger. Decode's interval leaves out the router's routing and the
// prefill hand-off, which can be more than a bucket wide, so it is not held
// to the bench's values bucket by bucket.
func checkNested(t *testing.T, router, decode ttftHistogram) {
	t.Helper()
	if decode.count != router.count {
		t.Fatalf("decode counted %d first tokens, the router %d", decode.count, router.count)
	}
	for i, le := range router.bounds {
		if i >= len(decode.bounds) || decode.bounds[i] != le {
			t.Fatalf("decode's buckets %v differ from the router's %v", decode.bounds, router.bounds)
		}
		if decode.counts[i] < router.counts[i] {
			t.Errorf("TTFT ≤ %gs: decode counted %d requests, the router %d: decode's intervals must be the shorter", le, decode.counts[i], router.counts[i])
		}
	}
	if decode.sum > router.sum {
		t.Errorf("decode's TTFTs add up to %.6fs, more than the router's %.6fs", decode.sum, router.sum)
	}
	t.Logf("decode: mean TTFT %.2f ms; counts %v", 1000*decode.sum/float64(decode.count), decode.counts)
}

func runBench(t *testing.T, args ...string) benchResult {
	t.Helper()
	p := startProc(t, "batonctl", append([]string{"bench", "--json"}, args...)...)
	if code := p.wait(t, 3*time.Minute); code != 0 {
		t.Fatalf("batonctl bench exit %d:\n%s", code, p.Stderr())
	}
	var res benchResult
	if err := json.Unmarshal([]byte(p.Stdout()), &res); err != nil {
		t.Fatalf("--json output is not one JSON object: %v\n%s", err, p.Stdout())
	}
	if len(res.Runs) != 1 {
		t.Fatalf("%d runs, want 1", len(res.Runs))
	}
	return res
}

// TestBench runs `batonctl bench` against real services on stories260K
// and checks its figures, including its TTFTs against the router's
// baton:time_to_first_token_seconds histogram (and that against decode's).
func TestBench(t *testing.T) {
	model := refdata.Model(t)
	c := startCluster(t, nil)
	const n, in, out = 20, 24, 32
	routerBefore, decodeBefore := readTTFT(t, c.router.http), readTTFT(t, c.decode.http)
	plots := t.TempDir()
	res := runBench(t, "--router", c.router.grpc, "--model", model, "--num-prompts", "20", "--request-rate", "8",
		"--random-input-len", "24", "--random-output-len", "32", "--ignore-eos", "--warmup", "0", "--seed", "3",
		"--slo", "ttft:2000,tpot:500", "--plot", plots)
	routerRun, decodeRun := readTTFT(t, c.router.http).minus(routerBefore), readTTFT(t, c.decode.http).minus(decodeBefore)

	run := res.Runs[0]
	if res.Backend != "grpc" || res.Model == "" || run.RateLabel != "8" || run.RequestRate == nil || *run.RequestRate != 8 {
		t.Errorf("report: backend %q model %q rate %q/%v", res.Backend, res.Model, run.RateLabel, run.RequestRate)
	}
	if run.Completed != n || run.Failed != 0 || len(run.Errors) != 0 || len(run.Requests) != n {
		t.Fatalf("%d completed, %d failed (%v), %d requests", run.Completed, run.Failed, run.Errors, len(run.Requests))
	}
	// --ignore-eos: every request generates exactly its output length.
	var ttfts []float64
	itls := 0
	for i, r := range run.Requests {
		if r.InputTokens != in || r.OutputTokens != out || r.Error != "" || r.TTFTMS == nil || r.TPOTMS == nil {
			t.Fatalf("request %d: %+v", i, r)
		}
		if r.ServerTTFTMS == nil || *r.ServerTTFTMS > *r.TTFTMS || *r.TTFTMS > r.E2EMS {
			t.Errorf("request %d: server TTFT %v, client TTFT %v, E2E %v: want server ≤ client ≤ E2E", i, r.ServerTTFTMS, *r.TTFTMS, r.E2EMS)
		}
		if len(r.ITLMS) < 1 || len(r.ITLMS) > out-1 {
			t.Errorf("request %d: %d inter-token gaps for %d tokens", i, len(r.ITLMS), out)
		}
		itls += len(r.ITLMS)
		ttfts = append(ttfts, *r.TTFTMS/1000)
	}
	if run.TotalInputTokens != n*in || run.TotalOutputTokens != n*out {
		t.Errorf("tokens %d in, %d out; want %d, %d", run.TotalInputTokens, run.TotalOutputTokens, n*in, n*out)
	}
	near := func(name string, got, want float64) {
		if math.Abs(got-want) > 1e-9*math.Abs(want) {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	near("request_throughput", run.RequestThroughput, n/run.DurationS)
	near("output_throughput", run.OutputThroughput, n*out/run.DurationS)
	near("total_token_throughput", run.TotalThroughput, n*(in+out)/run.DurationS)
	// 20 requests at 8/s take about 2.5 s plus the last one's run.
	if run.DurationS < 0.5 || run.DurationS > 60 {
		t.Errorf("duration %v s", run.DurationS)
	}
	run.TTFT.check(t, "ttft", n)
	run.TPOT.check(t, "tpot", n)
	run.ITL.check(t, "itl", itls)
	run.E2E.check(t, "e2e", n)
	if run.Good != n || run.Goodput != run.RequestThroughput {
		t.Errorf("%d good requests, goodput %v under a loose SLO; want all, %v", run.Good, run.Goodput, run.RequestThroughput)
	}

	sort.Float64s(ttfts)
	checkTTFTAgrees(t, "router", routerRun, ttfts)
	checkNested(t, routerRun, decodeRun)

	for _, f := range []string{"ttft_cdf.png", "tpot_cdf.png", "itl_cdf.png", "e2e_cdf.png"} {
		if st, err := os.Stat(filepath.Join(plots, f)); err != nil || st.Size() < 1000 {
			t.Errorf("--plot: %s: %v", f, err)
		}
	}
}

// TestBenchOpenAI runs the bench over the OpenAI API as a closed loop.
func TestBenchOpenAI(t *testing.T) {
	model := refdata.Model(t)
	c := startCluster(t, nil)
	res := runBench(t, "--backend", "openai", "--router", c.colocated.http, "--model", model, "--num-prompts", "8",
		"--request-rate", "inf", "--max-concurrency", "4", "--random-input-len", "8", "--random-output-len", "16",
		"--ignore-eos", "--dataset", "shared-prefix", "--prefix-len", "16", "--num-groups", "2")
	run := res.Runs[0]
	if res.Backend != "openai" || run.RateLabel != "inf" || run.RequestRate != nil || run.Completed != 8 || run.Failed != 0 {
		t.Fatalf("report %+v", res)
	}
	for i, r := range run.Requests {
		if r.InputTokens != 24 || r.OutputTokens != 16 || r.TTFTMS == nil || r.ServerTTFTMS != nil {
			t.Errorf("request %d: %+v", i, r)
		}
	}
	run.TTFT.check(t, "ttft", 8)
	run.E2E.check(t, "e2e", 8)
}

// TestBenchMultiTurn replays conversations through PD: every later turn
// reuses the earlier turns' prompt at prefill (cached_tokens) and moves
// fewer KV bytes than its whole prompt, since decode holds the pages its
// previous turn left.
func TestBenchMultiTurn(t *testing.T) {
	model := refdata.Model(t)
	c := startCluster(t, nil)
	// 3 conversations of 3 turns: 16-token system prompts, 8-token
	// messages and answers (prompts of 24, 40 and 56 tokens).
	res := runBench(t, "--router", c.router.grpc, "--model", model, "--dataset", "multi-turn", "--num-conversations", "3",
		"--num-turns", "3", "--prefix-len", "16", "--random-input-len", "8", "--random-output-len", "8",
		"--think-time", "20ms", "--ignore-eos", "--warmup", "0", "--seed", "5")
	run := res.Runs[0]
	if run.Completed != 9 || run.Failed != 0 || len(run.Requests) != 9 {
		t.Fatalf("%d completed, %d failed (%v)", run.Completed, run.Failed, run.Errors)
	}
	perToken := 0.0
	for _, r := range run.Requests {
		if r.Turn != nil && *r.Turn == 0 && r.KVBytes != nil {
			perToken = float64(*r.KVBytes) / float64(r.InputTokens)
		}
	}
	if perToken == 0 {
		t.Fatal("no first turn reported its KV bytes")
	}
	for i, r := range run.Requests {
		if r.Conversation == nil || r.Turn == nil || r.KVBytes == nil {
			t.Fatalf("request %d: %+v", i, r)
		}
		if want := 24 + 16**r.Turn; r.InputTokens != want {
			t.Errorf("request %d (turn %d): %d prompt tokens, want %d", i, *r.Turn, r.InputTokens, want)
		}
		if *r.Turn == 0 {
			continue
		}
		if r.CachedTokens == 0 {
			t.Errorf("request %d (turn %d): prefill reused nothing of the earlier turns", i, *r.Turn)
		}
		if whole := perToken * float64(r.InputTokens); float64(*r.KVBytes) >= whole {
			t.Errorf("request %d (turn %d): %d KV bytes moved, its whole prompt is %v", i, *r.Turn, *r.KVBytes, whole)
		}
	}
	if run.CacheHitRate <= 0 || run.KVBytesPerRequest == nil {
		t.Errorf("cache hit rate %v, KV bytes per request %v", run.CacheHitRate, run.KVBytesPerRequest)
	}
}
