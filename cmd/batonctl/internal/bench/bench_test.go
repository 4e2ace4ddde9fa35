package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/baton-serving/baton/cmd/batonctl/internal/bench/backend"
	"github.com/baton-serving/baton/cmd/batonctl/internal/bench/dataset"
	"github.com/baton-serving/baton/cmd/batonctl/internal/bench/load/loadtest"
	"github.com/baton-serving/baton/cmd/batonctl/internal/bench/measure"
)

// step is one scripted event of a fake stream: wait, then send a chunk of
// tokens (or, with tokens 0, end the stream).
type step struct {
	wait   time.Duration
	tokens int
}

type script struct {
	steps   []step
	in, out int
	err     error
}

// fakeBackend plays a script per prompt (keyed by the prompt's first id)
// on the fake clock: the event source with known timings.
type fakeBackend struct {
	clock   *loadtest.Clock
	scripts map[int32]script
	mu      sync.Mutex
	reqs    []backend.Request
}

func (f *fakeBackend) Model(context.Context) (backend.Model, error) {
	return backend.Model{ID: "fake", VocabSize: 10, ContextLength: 100}, nil
}

func (f *fakeBackend) Generate(_ context.Context, req backend.Request, onChunk backend.OnChunk) (backend.Result, error) {
	f.mu.Lock()
	f.reqs = append(f.reqs, req)
	f.mu.Unlock()
	s := f.scripts[req.PromptIDs[0]]
	for _, st := range s.steps {
		f.clock.Advance(st.wait)
		if st.tokens > 0 {
			onChunk(st.tokens)
		}
	}
	if s.err != nil {
		return backend.Result{}, s.err
	}
	return backend.Result{InputTokens: s.in, OutputTokens: s.out, ServerTTFT: 0.0185}, nil
}

func (f *fakeBackend) Close() error { return nil }

const ms = time.Millisecond

// fixture: a warm-up request, then three measured ones whose figures
// TestExecuteExact works out by hand.
func fixture() (*fakeBackend, []dataset.Prompt) {
	f := &fakeBackend{clock: loadtest.NewClock(time.Unix(5000, 0)), scripts: map[int32]script{
		9: {steps: []step{{ms, 1}}, in: 1, out: 1}, // warm-up
		// chunks at 20, 30, 40; ends at 42.
		0: {steps: []step{{20 * ms, 1}, {10 * ms, 1}, {10 * ms, 1}, {2 * ms, 0}}, in: 8, out: 3},
		// a 2-token chunk at 30, one token at 45; ends at 45.
		1: {steps: []step{{30 * ms, 2}, {15 * ms, 1}}, in: 4, out: 3},
		// refused after 5.
		2: {steps: []step{{5 * ms, 0}}, err: errors.New("http 503: busy")},
	}}
	ps := []dataset.Prompt{{IDs: []int32{9}, OutputLen: 1}, {IDs: []int32{0, 5}, OutputLen: 3},
		{IDs: []int32{1}, OutputLen: 3}, {IDs: []int32{2}, OutputLen: 3}}
	return f, ps
}

func baseOptions() options {
	return options{backend: "grpc", router: "fake:1", dataset: "random", inputLen: 8, outputLen: 3, numPrompts: 3,
		warmup: 1, concurrencies: []int{1}, burstiness: 1, rates: []float64{math.Inf(1)}, seed: 40, ignoreEOS: true, label: "test"}
}

func f64(v float64) *float64 { return &v }

// TestExecuteExact checks the benchmark's arithmetic end to end, from a
// stream with known timings to the report, against values worked out by
// hand; equality is exact.
func TestExecuteExact(t *testing.T) {
	f, ps := fixture()
	o := baseOptions()
	o.slo = measure.SLO{TTFT: 25 * ms, TPOT: 12 * ms}
	rep, err := execute(context.Background(), o, backend.Model{ID: "fake"}, f, f.clock, ps, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Runs) != 1 {
		t.Fatalf("%d runs", len(rep.Runs))
	}
	run := rep.Runs[0]
	want := measure.Summary{
		Completed: 2, Failed: 1, Errors: []measure.ErrorCount{{Message: "http 503: busy", Count: 1}},
		// from the first request sent (after the warm-up) to the last end: 42 + 45 + 5 ms.
		DurationSeconds: 0.092, InputTokens: 12, OutputTokens: 6,
		RequestThroughput: 2 / 0.092, InputThroughput: 12 / 0.092, OutputThroughput: 6 / 0.092, TotalThroughput: 18 / 0.092,
		Concurrency: (42.0 + 45) / 92,
		TTFT:        measure.Dist{N: 2, Mean: 25, Median: 25, P90: 20 + 10*0.9, P99: 20 + 10*0.99, Min: 20, Max: 30},
		// (40-20)/2 = 10 and (45-30)/2 = 7.5.
		TPOT: measure.Dist{N: 2, Mean: 8.75, Median: 8.75, P90: 7.5 + 2.5*0.9, P99: 7.5 + 2.5*0.99, Min: 7.5, Max: 10},
		// 10, 10 from the first request, 15 from the second (its 2-token
		// chunk came first, so it has no gap before it).
		ITL: measure.Dist{N: 3, Mean: 35.0 / 3, Median: 10, P90: 10 + 5*0.8, P99: 10 + 5*0.98, Min: 10, Max: 15},
		E2E: measure.Dist{N: 2, Mean: 43.5, Median: 43.5, P90: 42 + 3*0.9, P99: 42 + 3*0.99, Min: 42, Max: 45},
		// Only the first request meets ttft ≤ 25 and tpot ≤ 12.
		Good: 1, Goodput: 1 / 0.092,
	}
	if !reflect.DeepEqual(run.Summary, want) {
		t.Errorf("summary:\n got %+v\nwant %+v", run.Summary, want)
	}
	wantReqs := []RequestRep{
		{SentMS: 0, InputTokens: 8, OutputTokens: 3, TTFTMS: f64(20), TPOTMS: f64(10), E2EMS: 42, ITLMS: []float64{10, 10}, ServerTTFTMS: f64(18.5)},
		{SentMS: 42, InputTokens: 4, OutputTokens: 3, TTFTMS: f64(30), TPOTMS: f64(7.5), E2EMS: 45, ITLMS: []float64{15}, ServerTTFTMS: f64(18.5)},
		{SentMS: 87, E2EMS: 5, ITLMS: []float64{}, Error: "http 503: busy"},
	}
	if !reflect.DeepEqual(run.Requests, wantReqs) {
		t.Errorf("requests:\n got %+v\nwant %+v", run.Requests, wantReqs)
	}
	if run.RequestRate != nil || run.RateLabel != "inf" {
		t.Errorf("rate %v %q, want null and inf", run.RequestRate, run.RateLabel)
	}
	// Every request carries the options.
	for i, r := range f.reqs {
		if !r.IgnoreEOS || r.MaxTokens != ps[i].OutputLen || !reflect.DeepEqual(r.PromptIDs, ps[i].IDs) {
			t.Errorf("request %d sent as %+v", i, r)
		}
	}
	if f.reqs[1].Seed != 40 || f.reqs[2].Seed != 41 {
		t.Errorf("seeds %d, %d: want the run's seed plus the request's index", f.reqs[1].Seed, f.reqs[2].Seed)
	}
}

// jsonFields are the documented top-level and per-run field names.
var (
	reportFields = []string{"label", "backend", "router", "model", "context_length", "dataset", "random_input_len",
		"random_output_len", "random_range_ratio", "num_prompts", "warmup", "burstiness",
		"ignore_eos", "temperature", "seed", "slo", "date", "runs"}
	runFields = []string{"request_rate", "request_rate_label", "max_concurrency", "completed", "failed", "errors", "duration_s",
		"total_input_tokens", "total_output_tokens", "request_throughput", "input_throughput", "output_throughput",
		"total_token_throughput", "mean_concurrency", "ttft", "tpot", "itl", "e2e", "good_requests", "goodput", "requests"}
	distFields    = []string{"count", "mean_ms", "median_ms", "p90_ms", "p99_ms", "min_ms", "max_ms"}
	requestFields = []string{"sent_ms", "input_tokens", "output_tokens", "ttft_ms", "tpot_ms", "e2e_ms", "itl_ms"}
)

func hasFields(t *testing.T, what string, m map[string]any, names []string) {
	t.Helper()
	for _, n := range names {
		if _, ok := m[n]; !ok {
			t.Errorf("%s: no field %q in %v", what, n, keys(m))
		}
	}
}

func keys(m map[string]any) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

func TestEmitJSONAndTables(t *testing.T) {
	f, ps := fixture()
	o := baseOptions()
	o.slo = measure.SLO{TTFT: 25 * ms}
	rep, err := execute(context.Background(), o, backend.Model{ID: "fake"}, f, f.clock, ps, nil)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	o.asJSON = true
	o.output = filepath.Join(t.TempDir(), "res.json")
	if err := emit(o, []*Report{rep}, &out); err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(out.Bytes(), &m); err != nil {
		t.Fatalf("stdout is not one JSON object: %v\n%s", err, out.String())
	}
	hasFields(t, "report", m, reportFields)
	run := m["runs"].([]any)[0].(map[string]any)
	hasFields(t, "run", run, runFields)
	for _, d := range []string{"ttft", "tpot", "itl", "e2e"} {
		hasFields(t, d, run[d].(map[string]any), distFields)
	}
	hasFields(t, "request", run["requests"].([]any)[0].(map[string]any), requestFields)
	if run["request_rate"] != nil || run["goodput"].(float64) != 1/0.092 {
		t.Errorf("request_rate %v goodput %v", run["request_rate"], run["goodput"])
	}
	file, err := os.ReadFile(o.output)
	if err != nil || !bytes.Equal(file, out.Bytes()) {
		t.Errorf("--output file differs from stdout (%v)", err)
	}

	out.Reset()
	o.asJSON, o.output = false, ""
	if err := emit(o, []*Report{rep}, &out); err != nil {
		t.Fatal(err)
	}
	table := out.String()
	for _, want := range []string{"2 / 1", "Request throughput (req/s)", "21.74",
		"Goodput [ttft:25] (req/s)", "TTFT", "25.00", "http 503: busy", "rate inf req/s"} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
}

func TestSweepChartsAndReplay(t *testing.T) {
	f, ps := fixture()
	o := baseOptions()
	o.rates = []float64{50, 100, math.Inf(1)}
	o.slo = measure.SLO{TTFT: 25 * ms}
	rep, err := execute(context.Background(), o, backend.Model{ID: "fake"}, f, f.clock, ps, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Runs) != 3 || *rep.Runs[0].RequestRate != 50 || rep.Runs[2].RequestRate != nil {
		t.Fatalf("runs %+v", rep.Runs)
	}
	// The same requests at every rate. (Their timings are not checked:
	// arrival waits and streams share the one virtual clock.)
	for _, run := range rep.Runs {
		if run.Completed != 2 || run.Failed != 1 || run.OutputTokens != 6 || len(run.Requests) != 3 {
			t.Errorf("rate %s: %+v", run.RateLabel, run.Summary)
		}
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "pd.json")
	b, _ := json.Marshal(rep)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	rep.Label = "colocated"
	b, _ = json.Marshal(rep)
	path2 := filepath.Join(dir, "col.json")
	if err := os.WriteFile(path2, b, 0o644); err != nil {
		t.Fatal(err)
	}
	plots := filepath.Join(dir, "plots")
	var stdout, stderr bytes.Buffer
	if code := Run(context.Background(), &stdout, &stderr, []string{"--from-json", path + "," + path2, "--plot", plots}); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	for _, name := range []string{"ttft_cdf.png", "tpot_cdf.png", "itl_cdf.png", "e2e_cdf.png", "output_throughput_vs_rate.png",
		"request_throughput_vs_rate.png", "ttft_p99_vs_rate.png", "tpot_median_vs_rate.png", "goodput_vs_rate.png"} {
		if st, err := os.Stat(filepath.Join(plots, name)); err != nil || st.Size() < 1000 {
			t.Errorf("%s: %v", name, err)
		}
	}
	if !strings.Contains(stdout.String(), "test: sweep") || !strings.Contains(stdout.String(), "colocated: sweep") {
		t.Errorf("replayed tables lack the sweeps:\n%s", stdout.String())
	}
}

func TestConcurrencySweep(t *testing.T) {
	f, ps := fixture()
	o := baseOptions()
	o.concurrencies = []int{1, 2, 0}
	rep, err := execute(context.Background(), o, backend.Model{ID: "fake"}, f, f.clock, ps, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Runs) != 3 || rep.Runs[0].MaxConcurrency != 1 || rep.Runs[1].MaxConcurrency != 2 || rep.Runs[2].MaxConcurrency != 0 {
		t.Fatalf("runs %+v", rep.Runs)
	}
	dir := t.TempDir()
	files, err := writeCharts(dir, []*Report{rep})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		names = append(names, filepath.Base(f))
	}
	want := []string{"ttft_cdf.png", "tpot_cdf.png", "itl_cdf.png", "e2e_cdf.png", "output_throughput_vs_concurrency.png",
		"request_throughput_vs_concurrency.png", "ttft_p99_vs_concurrency.png", "tpot_median_vs_concurrency.png"}
	if !reflect.DeepEqual(names, want) {
		t.Errorf("charts %v, want %v", names, want)
	}
	var out bytes.Buffer
	printReport(&out, rep)
	if !strings.Contains(out.String(), "concurrency unbounded") || !strings.Contains(out.String(), "test: sweep") {
		t.Errorf("tables:\n%s", out.String())
	}
}

func TestWarmupFailureStops(t *testing.T) {
	f, ps := fixture()
	f.scripts[9] = script{err: errors.New("down")}
	o := baseOptions()
	_, err := execute(context.Background(), o, backend.Model{}, f, f.clock, ps, nil)
	if err == nil || !strings.Contains(err.Error(), "warm-up request failed: down") {
		t.Errorf("error %v", err)
	}
}

func TestProgressBar(t *testing.T) {
	var buf bytes.Buffer
	p := newProgressBar(&buf, "rate 8", 4)
	p.update(1, 0)
	p.update(4, 1)
	p.finish()
	s := buf.String()
	if !strings.Contains(s, "rate 8 [#######-----------------------] 1/4") || !strings.Contains(s, "4/4 (1 failed)") || !strings.HasSuffix(s, "\n") {
		t.Errorf("progress output %q", s)
	}
	var nilBar *progressBar
	nilBar.update(1, 1)
	nilBar.finish()
	newProgressBar(nil, "x", 1).update(1, 0)
}

func TestParseFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"--backend", "rest"}, 2, "want grpc or openai"},
		{[]string{"--dataset", "x"}, 2, "want random, sharegpt, shared-prefix or multi-turn"},
		{[]string{"--dataset", "multi-turn", "--num-prompts", "10"}, 2, "--num-conversations × --num-turns requests"},
		{[]string{"--dataset", "multi-turn", "--num-turns", "0"}, 2, "--num-turns 0"},
		{[]string{"--dataset", "multi-turn", "--num-conversations", "-1"}, 2, "--num-conversations -1"},
		{[]string{"--dataset", "multi-turn", "--think-time", "-1s"}, 2, "--think-time"},
		{[]string{"--dataset", "sharegpt"}, 2, "needs --dataset-path"},
		{[]string{"--request-rate", "1,0"}, 2, "--request-rate"},
		{[]string{"--request-rate", "fast"}, 2, "--request-rate"},
		{[]string{"--slo", "ttft"}, 2, "--slo"},
		{[]string{"--max-concurrency", "4,-1"}, 2, "--max-concurrency"},
		{[]string{"--num-prompts", "0"}, 2, "--num-prompts"},
		{[]string{"--burstiness", "0"}, 2, "--burstiness"},
		{[]string{"--temperature", "3"}, 2, "--temperature"},
		{[]string{"--cancel-fraction", "1.5"}, 2, "--cancel-fraction 1.5: want 0-1"},
		{[]string{"--cancel-within", "0s"}, 2, "--cancel-within 0s: want > 0"},
		{[]string{"extra"}, 2, "unexpected argument"},
		{[]string{"--help"}, 0, "Usage: batonctl bench"},
		{[]string{"--from-json", "/nonexistent/x.json"}, 1, "--from-json"},
	} {
		var stdout, stderr bytes.Buffer
		if code := Run(context.Background(), &stdout, &stderr, tc.args); code != tc.code || !strings.Contains(stderr.String(), tc.msg) {
			t.Errorf("%v: exit %d, stderr %q; want %d and %q", tc.args, code, stderr.String(), tc.code, tc.msg)
		}
	}
	var stderr bytes.Buffer
	o, code := parse(&stderr, []string{"--backend", "openai", "--request-rate", "1, 2.5,INF", "--max-concurrency", "1,16"})
	if code != -1 || o.router != "127.0.0.1:8080" || !reflect.DeepEqual(o.rates, []float64{1, 2.5, math.Inf(1)}) || o.label != "openai" ||
		!reflect.DeepEqual(o.concurrencies, []int{1, 16}) || o.maxConcurrency() != 16 {
		t.Errorf("parse: %+v, %d, %s", o, code, stderr.String())
	}
	if o, code := parse(&stderr, []string{"--dataset", "multi-turn", "--num-conversations", "3", "--num-turns", "5"}); code != -1 || o.numPrompts != 15 {
		t.Errorf("multi-turn: %d requests, exit %d", o.numPrompts, code)
	}
	if o, _ := parse(&stderr, nil); o.router != "127.0.0.1:8081" {
		t.Errorf("default gRPC router %q", o.router)
	}
}

// turnBackend answers every request after 10 ms with one token, reporting
// half the prompt as cached and 100 KV bytes per uncached prompt token.
type turnBackend struct {
	clock *loadtest.Clock
	mu    sync.Mutex
	sent  []int // first prompt id of each request, in sending order
}

func (f *turnBackend) Model(context.Context) (backend.Model, error) {
	return backend.Model{ID: "fake", VocabSize: 10, ContextLength: 100}, nil
}

func (f *turnBackend) Generate(_ context.Context, req backend.Request, onChunk backend.OnChunk) (backend.Result, error) {
	f.mu.Lock()
	f.sent = append(f.sent, int(req.PromptIDs[0]))
	f.mu.Unlock()
	f.clock.Advance(10 * ms)
	onChunk(1)
	n := len(req.PromptIDs)
	return backend.Result{InputTokens: n, OutputTokens: 1, CachedTokens: n / 2,
		KVTransferBytes: uint64(100 * (n - n/2)), HasKVTransferBytes: true}, nil
}

func (f *turnBackend) Close() error { return nil }

// TestExecuteMultiTurn: turns follow their conversation's previous turn
// after the think time; the report places each request in its
// conversation and sums the server's cache reuse and KV transfer.
func TestExecuteMultiTurn(t *testing.T) {
	f := &turnBackend{clock: loadtest.NewClock(time.Unix(5000, 0))}
	// Two conversations (first ids 0 and 1) of two turns; no warm-up.
	ps := []dataset.Prompt{
		{IDs: []int32{0, 5, 5, 5}, OutputLen: 1, Conversation: 0, After: -2},
		{IDs: []int32{1, 6}, OutputLen: 1, Conversation: 1, After: -1},
		{IDs: []int32{0, 5, 5, 5, 7, 7}, OutputLen: 1, Conversation: 0, Turn: 1, After: 0},
		{IDs: []int32{1, 6, 8, 8}, OutputLen: 1, Conversation: 1, Turn: 1, After: 1},
	}
	o := baseOptions()
	o.dataset, o.warmup, o.numPrompts, o.think, o.conversations, o.turns = "multi-turn", 0, 4, 50*ms, 2, 2
	rep, err := execute(context.Background(), o, backend.Model{ID: "fake"}, f, f.clock, ps, nil)
	if err != nil {
		t.Fatal(err)
	}
	run := rep.Runs[0]
	if run.Completed != 4 || run.CachedTokens != 2+1+3+2 {
		t.Fatalf("completed %d, cached %d", run.Completed, run.CachedTokens)
	}
	if want := 8.0 / 16; run.CacheHitRate != want {
		t.Errorf("cache hit rate %v, want %v", run.CacheHitRate, want)
	}
	if run.KVBytesPerRequest == nil || *run.KVBytesPerRequest != 100*8/4.0 {
		t.Errorf("KV bytes per request %v, want 200", run.KVBytesPerRequest)
	}
	for _, r := range run.Requests {
		if r.Conversation == nil || r.Turn == nil || r.KVTransferBytes == nil {
			t.Fatalf("request %+v not placed in its conversation", r)
		}
	}
	byTurn := map[[2]int]RequestRep{}
	for _, r := range run.Requests {
		byTurn[[2]int{*r.Conversation, *r.Turn}] = r
	}
	for c := range 2 {
		first, second := byTurn[[2]int{c, 0}], byTurn[[2]int{c, 1}]
		if second.SentMS < first.SentMS+first.E2EMS+50 {
			t.Errorf("conversation %d: turn 2 sent at %v ms, turn 1 sent at %v ms and took %v ms (think 50 ms)", c, second.SentMS, first.SentMS, first.E2EMS)
		}
	}
	if rep.Conversations != 2 || rep.Turns != 2 || rep.ThinkTimeMS != 50 {
		t.Errorf("report configuration %+v", rep)
	}
}

// holdBackend keeps each request open until its context ends or hold
// passes (on the real clock, as the bench's cancels are), then completes
// it with one token.
type holdBackend struct{ hold time.Duration }

func (f *holdBackend) Model(context.Context) (backend.Model, error) {
	return backend.Model{ID: "hold", VocabSize: 10, ContextLength: 100}, nil
}

func (f *holdBackend) Generate(ctx context.Context, req backend.Request, onChunk backend.OnChunk) (backend.Result, error) {
	select {
	case <-ctx.Done():
		return backend.Result{}, ctx.Err()
	case <-time.After(f.hold):
	}
	onChunk(1)
	return backend.Result{InputTokens: len(req.PromptIDs), OutputTokens: 1}, nil
}

func (f *holdBackend) Close() error { return nil }

// TestCancelStorm: --cancel-fraction cancels the planned requests (and
// only those), which count as cancelled, neither completed nor failed.
func TestCancelStorm(t *testing.T) {
	o := baseOptions()
	o.warmup, o.numPrompts, o.cancelFraction, o.cancelWithin = 0, 40, 0.5, 5*ms
	ps := make([]dataset.Prompt, o.numPrompts)
	for i := range ps {
		ps[i] = dataset.Prompt{IDs: []int32{int32(i)}, OutputLen: 1}
	}
	plan := cancelPlan(len(ps), o.cancelFraction, o.cancelWithin, o.seed)
	want := 0
	for _, d := range plan {
		if d < 0 || d > o.cancelWithin {
			t.Fatalf("cancel at %v, outside (0, %v]", d, o.cancelWithin)
		}
		if d > 0 {
			want++
		}
	}
	if want < 10 || want > 30 {
		t.Fatalf("%d of 40 planned for a fraction of 0.5", want)
	}
	if !reflect.DeepEqual(plan, cancelPlan(len(ps), o.cancelFraction, o.cancelWithin, o.seed)) {
		t.Error("the plan is not a function of the seed")
	}
	if cancelPlan(len(ps), 0, o.cancelWithin, o.seed) != nil {
		t.Error("a plan without cancels")
	}
	// Held 300 ms unless cancelled (within 5 ms), all at once.
	o.concurrencies = []int{0}
	rep, err := execute(context.Background(), o, backend.Model{ID: "hold"}, &holdBackend{hold: 300 * ms}, nil, ps, nil)
	if err != nil || len(rep.Runs) != 1 {
		t.Fatalf("%d runs, %v", len(rep.Runs), err)
	}
	run := rep.Runs[0]
	if run.Cancelled != want || run.Completed != len(ps)-want || run.Failed != 0 || len(run.Errors) != 0 {
		t.Errorf("cancelled %d, completed %d, failed %d %v; want %d, %d, 0", run.Cancelled, run.Completed, run.Failed, run.Errors, want, len(ps)-want)
	}
	for i, r := range run.Requests {
		if r.Cancelled != (plan[i] > 0) {
			t.Errorf("request %d: cancelled %v, planned at %v", i, r.Cancelled, plan[i])
		}
		if r.Cancelled && !strings.Contains(r.Error, "cancelled by the bench") {
			t.Errorf("request %d: error %q", i, r.Error)
		}
	}
}
