package bench

import (
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/baton-serving/baton/cmd/batonctl/internal/bench/backend"
	"github.com/baton-serving/baton/cmd/batonctl/internal/bench/charts"
	"github.com/baton-serving/baton/cmd/batonctl/internal/bench/dataset"
	"github.com/baton-serving/baton/cmd/batonctl/internal/bench/measure"
)

// Report is the JSON result of one `batonctl bench`: the configuration
// and one entry per request rate. docs/benchmarks.md documents each field.
type Report struct {
	Label            string   `json:"label"`
	Backend          string   `json:"backend"`
	Router           string   `json:"router"`
	Model            string   `json:"model"`
	ModelFingerprint string   `json:"model_fingerprint,omitempty"`
	ContextLength    int      `json:"context_length"`
	Dataset          string   `json:"dataset"`
	DatasetPath      string   `json:"dataset_path,omitempty"`
	RandomInputLen   int      `json:"random_input_len"`
	RandomOutputLen  int      `json:"random_output_len"`
	RandomRangeRatio float64  `json:"random_range_ratio"`
	PrefixLen        int      `json:"prefix_len,omitempty"`
	NumGroups        int      `json:"num_groups,omitempty"`
	Conversations    int      `json:"num_conversations,omitempty"`
	Turns            int      `json:"num_turns,omitempty"`
	ThinkTimeMS      float64  `json:"think_time_ms,omitempty"`
	NumPrompts       int      `json:"num_prompts"`
	Warmup           int      `json:"warmup"`
	Burstiness       float64  `json:"burstiness"`
	IgnoreEOS        bool     `json:"ignore_eos"`
	Temperature      float64  `json:"temperature"`
	Seed             uint64   `json:"seed"`
	SLO              string   `json:"slo"`
	Date             string   `json:"date"`
	Runs             []RunRep `json:"runs"`
}

// RunRep is one rate's figures (measure.Summary's fields, inline) and its
// requests.
type RunRep struct {
	// RequestRate is the offered rate; null for inf (all at once).
	RequestRate *float64 `json:"request_rate"`
	RateLabel   string   `json:"request_rate_label"`
	// MaxConcurrency bounds the requests in flight; 0 for no bound.
	MaxConcurrency int `json:"max_concurrency"`
	// Interrupted marks a run cut short by Ctrl-C.
	Interrupted bool `json:"interrupted,omitempty"`
	measure.Summary
	// CachedTokens are the prompt tokens of completed requests that the
	// server reported reused; CacheHitRate divides them by those
	// requests' prompt tokens.
	CachedTokens int     `json:"cached_tokens"`
	CacheHitRate float64 `json:"cache_hit_rate"`
	// KVBytesPerRequest is the mean of kv_transfer_bytes over completed
	// requests; null when the backend does not report it (openai).
	KVBytesPerRequest *float64     `json:"kv_transfer_bytes_per_request"`
	Requests          []RequestRep `json:"requests"`
}

// RequestRep is one request as measured.
type RequestRep struct {
	// SentMS is when it was sent, after the run's first request.
	SentMS       float64 `json:"sent_ms"`
	InputTokens  int     `json:"input_tokens"`
	OutputTokens int     `json:"output_tokens"`
	// TTFTMS and TPOTMS are null for a failed request; TPOTMS also for a
	// one-token output.
	TTFTMS *float64  `json:"ttft_ms"`
	TPOTMS *float64  `json:"tpot_ms"`
	E2EMS  float64   `json:"e2e_ms"`
	ITLMS  []float64 `json:"itl_ms"`
	// ServerTTFTMS is the router's own TTFT (gRPC only): the client's
	// TTFT minus it is the network and client overhead.
	ServerTTFTMS *float64 `json:"server_ttft_ms,omitempty"`
	// CachedTokens are the prompt tokens the server reported reused.
	CachedTokens int `json:"cached_tokens"`
	// KVTransferBytes crossed from prefill to decode for the prompt
	// (gRPC only; 0 colocated).
	KVTransferBytes *uint64 `json:"kv_transfer_bytes,omitempty"`
	// ServerStagesMS is where the server says the request's time went
	// (gRPC only).
	ServerStagesMS *StagesMS `json:"server_stages_ms,omitempty"`
	// Conversation and Turn place a multi-turn request.
	Conversation *int   `json:"conversation,omitempty"`
	Turn         *int   `json:"turn,omitempty"`
	Error        string `json:"error,omitempty"`
	// Cancelled marks a request the bench cancelled (--cancel-fraction).
	Cancelled bool `json:"cancelled,omitempty"`
}

func newReport(o options, m backend.Model) *Report {
	r := &Report{
		Label: o.label, Backend: o.backend, Router: o.router, Model: m.ID, ModelFingerprint: m.Fingerprint,
		ContextLength: m.ContextLength, Dataset: o.dataset, NumPrompts: o.numPrompts, Warmup: o.warmup,
		Burstiness: o.burstiness, IgnoreEOS: o.ignoreEOS,
		Temperature: o.temperature, Seed: o.seed, SLO: o.slo.String(), Date: time.Now().UTC().Format(time.RFC3339),
		RandomInputLen: o.inputLen, RandomOutputLen: o.outputLen, RandomRangeRatio: o.rangeRatio,
		Runs: []RunRep{},
	}
	switch o.dataset {
	case "sharegpt":
		r.DatasetPath, r.RandomInputLen, r.RandomOutputLen = o.datasetPath, 0, o.sharegptOutputLen
	case "shared-prefix":
		r.PrefixLen, r.NumGroups = o.prefixLen, o.numGroups
	case "multi-turn":
		r.PrefixLen, r.Conversations, r.Turns, r.ThinkTimeMS = o.prefixLen, o.conversations, o.turns, millis(o.think)
	}
	return r
}

func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// StagesMS are a request's per-stage server times in milliseconds
// (Timing's fields: decode's page reservation, prefill's queue and compute,
// the KV transfer and decoding).
type StagesMS struct {
	PreallocWait float64 `json:"prealloc_wait"`
	PrefillQueue float64 `json:"prefill_queue"`
	Prefill      float64 `json:"prefill"`
	KVTransfer   float64 `json:"kv_transfer"`
	Decode       float64 `json:"decode"`
}

// newRun makes a run's report of its samples; ps and results are indexed
// by Sample.Index.
func newRun(rate float64, conc int, samples []measure.Sample, start, end time.Time, ps []dataset.Prompt, results []backend.Result, slo measure.SLO, interrupted bool) RunRep {
	run := RunRep{RateLabel: rateLabel(rate), MaxConcurrency: conc, Interrupted: interrupted,
		Summary: measure.Summarize(samples, start, end, slo), Requests: make([]RequestRep, len(samples))}
	if !math.IsInf(rate, 1) {
		run.RequestRate = &rate
	}
	multiTurn := dataset.Dependencies(ps) != nil
	for i := range samples {
		s := &samples[i]
		r := RequestRep{SentMS: millis(s.Start.Sub(start)), InputTokens: s.InputTokens, OutputTokens: s.OutputTokens,
			E2EMS: millis(s.E2E()), Error: s.Err, ITLMS: []float64{}, Cancelled: s.Cancelled}
		if s.OK() {
			ttft := millis(s.TTFT())
			r.TTFTMS = &ttft
			if t, ok := s.TPOT(); ok {
				r.TPOTMS = &t
			}
			r.ITLMS = s.ITL()
		} else if r.Error == "" {
			r.Error = "stream ended without output"
		}
		if k := s.Index; k < len(results) {
			res := results[k]
			if res.ServerTTFT > 0 {
				v := res.ServerTTFT * 1000
				r.ServerTTFTMS = &v
			}
			r.CachedTokens = res.CachedTokens
			if res.HasKVTransferBytes {
				b := res.KVTransferBytes
				r.KVTransferBytes = &b
			}
			if st := res.Stages; st != nil {
				r.ServerStagesMS = &StagesMS{PreallocWait: 1000 * st.PreallocWait, PrefillQueue: 1000 * st.PrefillQueue,
					Prefill: 1000 * st.Prefill, KVTransfer: 1000 * st.KVTransfer, Decode: 1000 * st.Decode}
			}
		}
		if k := s.Index; multiTurn && k < len(ps) {
			c, t := ps[k].Conversation, ps[k].Turn
			r.Conversation, r.Turn = &c, &t
		}
		run.Requests[i] = r
	}
	run.cacheFigures(samples)
	return run
}

// cacheFigures sums the completed requests' cache reuse and KV transfer.
func (run *RunRep) cacheFigures(samples []measure.Sample) {
	var prompt, kvReqs int
	var kv float64
	for i := range samples {
		if !samples[i].OK() {
			continue
		}
		r := &run.Requests[i]
		prompt += r.InputTokens
		run.CachedTokens += r.CachedTokens
		if r.KVTransferBytes != nil {
			kv += float64(*r.KVTransferBytes)
			kvReqs++
		}
	}
	if prompt > 0 {
		run.CacheHitRate = float64(run.CachedTokens) / float64(prompt)
	}
	if kvReqs > 0 {
		v := kv / float64(kvReqs)
		run.KVBytesPerRequest = &v
	}
}

func rateLabel(rate float64) string { return charts.RateLabel(rate) }

func concurrencyLabel(c int) string {
	if c == 0 {
		return "unbounded"
	}
	return fmt.Sprint(c)
}

// printReport writes a report's tables: one per run, then a sweep table
// when there are several runs.
func printReport(w io.Writer, r *Report) {
	for _, run := range r.Runs {
		printRun(w, r, &run)
	}
	if len(r.Runs) > 1 {
		printSweep(w, r)
	}
}

func printRun(w io.Writer, r *Report, run *RunRep) {
	conc := concurrencyLabel(run.MaxConcurrency)
	rate := run.RateLabel + " req/s"
	if r.Burstiness != 1 && run.RequestRate != nil {
		rate += fmt.Sprintf(" (burstiness %g)", r.Burstiness)
	}
	title := fmt.Sprintf(" %s %s · %s · rate %s · concurrency %s ", r.Backend, r.Router, r.Model, rate, conc)
	if r.Label != r.Backend {
		title = " " + r.Label + " ·" + title
	}
	fmt.Fprintf(w, "\n==%s%s\n", title, strings.Repeat("=", max(0, 76-len([]rune(title)))))
	if run.Interrupted {
		fmt.Fprintln(w, "INTERRUPTED: figures cover the requests sent before Ctrl-C")
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(name string, v any) { fmt.Fprintf(tw, "%s\t%v\n", name, v) }
	row("Requests completed / failed", fmt.Sprintf("%d / %d", run.Completed, run.Failed))
	if run.Cancelled > 0 {
		row("Requests cancelled by the bench", run.Cancelled)
	}
	row("Duration (s)", fmt.Sprintf("%.2f", run.DurationSeconds))
	row("Input / output tokens", fmt.Sprintf("%d / %d", run.InputTokens, run.OutputTokens))
	row("Request throughput (req/s)", fmt.Sprintf("%.2f", run.RequestThroughput))
	row("Input token throughput (tok/s)", fmt.Sprintf("%.1f", run.InputThroughput))
	row("Output token throughput (tok/s)", fmt.Sprintf("%.1f", run.OutputThroughput))
	row("Total token throughput (tok/s)", fmt.Sprintf("%.1f", run.TotalThroughput))
	row("Mean concurrency", fmt.Sprintf("%.2f", run.Concurrency))
	row("Cache hit rate", fmt.Sprintf("%.1f%% (%d prompt tokens reused)", 100*run.CacheHitRate, run.CachedTokens))
	if run.KVBytesPerRequest != nil {
		row("KV bytes transferred per request", fmt.Sprintf("%.0f", *run.KVBytesPerRequest))
	}
	if r.SLO != "" {
		share := 0.0
		if run.Completed+run.Failed > 0 {
			share = 100 * float64(run.Good) / float64(run.Completed+run.Failed)
		}
		row(fmt.Sprintf("Goodput [%s] (req/s)", r.SLO), fmt.Sprintf("%.2f (%d requests, %.1f%%)", run.Goodput, run.Good, share))
	}
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "latency (ms)\tmean\tmedian\tp90\tp99\tmin\tmax\tcount\t")
	for _, d := range []struct {
		name string
		d    measure.Dist
	}{{"TTFT", run.TTFT}, {"TPOT", run.TPOT}, {"ITL", run.ITL}, {"E2E", run.E2E}} {
		fmt.Fprintf(tw, "%s\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%d\t\n", d.name, d.d.Mean, d.d.Median, d.d.P90, d.d.P99, d.d.Min, d.d.Max, d.d.N)
	}
	tw.Flush()
	if len(run.Errors) > 0 {
		fmt.Fprintln(w, "\nfailures:")
		for _, e := range run.Errors {
			fmt.Fprintf(w, "  %5d  %s\n", e.Count, e.Message)
		}
	}
}

func printSweep(w io.Writer, r *Report) {
	fmt.Fprintf(w, "\n== %s: sweep %s\n", r.Label, strings.Repeat("=", 60))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "rate\tconc\treq/s\tout tok/s\tTTFT p50\tTTFT p99\tTPOT p50\tITL p99\tE2E p99\tfailed\t"
	if r.SLO != "" {
		head += "goodput\t"
	}
	fmt.Fprintln(tw, head)
	for _, run := range r.Runs {
		fmt.Fprintf(tw, "%s\t%s\t%.2f\t%.1f\t%.1f\t%.1f\t%.2f\t%.2f\t%.1f\t%d\t", run.RateLabel, concurrencyLabel(run.MaxConcurrency), run.RequestThroughput, run.OutputThroughput,
			run.TTFT.Median, run.TTFT.P99, run.TPOT.Median, run.ITL.P99, run.E2E.P99, run.Failed)
		if r.SLO != "" {
			fmt.Fprintf(tw, "%.2f\t", run.Goodput)
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
	fmt.Fprintln(w, "(latencies in ms)")
}
