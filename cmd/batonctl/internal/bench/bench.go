// Package bench implements `batonctl bench`, a serving benchmark of a
// running router in the manner of sglang's bench_serving and vLLM's
// `bench serve`: it sends a data set of prompts over gRPC or the OpenAI
// HTTP API on an arrival schedule, measures every request's time to first
// token, inter-token latencies, time per output token and end-to-end
// latency from the client's side, and reports throughputs, latency
// percentiles and goodput as a table, as JSON and as PNG charts.
//
// Subpackages hold the parts: dataset (prompts), backend (the two APIs),
// load (arrivals and concurrency), measure (the exact arithmetic) and
// charts (the PNGs).
package bench

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/baton-serving/baton/cmd/batonctl/internal/bench/backend"
	"github.com/baton-serving/baton/cmd/batonctl/internal/bench/dataset"
	"github.com/baton-serving/baton/cmd/batonctl/internal/bench/load"
	"github.com/baton-serving/baton/cmd/batonctl/internal/bench/measure"
	"github.com/baton-serving/baton/cmd/batonctl/internal/loopback"
	"github.com/baton-serving/baton/engine/gguf"
	"github.com/baton-serving/baton/engine/modelfile"
	"github.com/baton-serving/baton/engine/tokenizer"
)

// Summary is the one-line description of the command.
const Summary = "benchmark a running router under load (TTFT, TPOT, ITL, throughput, goodput)"

const help = `Usage: batonctl bench [flags]
       batonctl bench --from-json FILE[,FILE…] [--plot DIR] [--json]

Sends --num-prompts requests to a running router and measures them from the
client's side, as sglang's bench_serving and vLLM's "bench serve" do:

  TTFT  time from sending a request to its first output chunk
  ITL   gaps between output chunks; a gRPC event of k tokens counts as k
        gaps of 1/k of it (the OpenAI API does not say how many tokens a
        text chunk holds: one gap per chunk)
  TPOT  (last chunk − first chunk) / (output tokens − 1), per request
  E2E   time from sending a request to the end of its stream

and reports request and token throughputs over the run's duration (first
request sent to last request ended), mean/median/p90/p99 of each latency,
and goodput: requests per second meeting every objective of --slo.

Load: requests arrive at --request-rate per second (Poisson, or gamma gaps
of shape --burstiness; "inf" sends them all at once), at most
--max-concurrency in flight. A closed loop of C users is
"--request-rate inf --max-concurrency C". Comma-separated lists of rates
and of concurrency bounds run the benchmark once per pair (a sweep), on the
same prompts.

Data sets (token ids from the model's own vocabulary, so prompt lengths are
exact; --model names the GGUF the router serves, default $BATON_MODEL, else
../shared/models/stories260K.gguf):
  random         --random-input-len tokens (BOS included) and
                 --random-output-len, spread uniformly by
                 --random-range-ratio r over [len·(1−r), len·(1+r)]
  sharegpt       --dataset-path FILE in ShareGPT format: first question as
                 the prompt, the answer's length as the output length
  shared-prefix  --num-groups groups whose prompts share a --prefix-len
                 prefix, each followed by a random --random-input-len suffix
  multi-turn     --num-conversations conversations of --num-turns turns,
                 replayed turn by turn: each has its own --prefix-len system
                 prompt; a turn's prompt is the conversation so far (every
                 earlier message and a --random-output-len answer) plus a
                 new --random-input-len message, sent --think-time after
                 the previous turn ended (the rate paces first turns;
                 conversations × turns requests, so not --num-prompts)

A cancel storm: --cancel-fraction f cancels that share of the measured
requests (chosen by --seed), each at a random moment up to --cancel-within
after it was sent, as clients that give up do. A cancelled request counts
as "cancelled", neither completed nor failed; one that ended first counts
as it ended. Read the workers' baton_kv_pages_used and
baton_kv_pages_leaked afterwards: both return to 0.

The report gives the cache hit rate (prompt tokens the server says it
reused / prompt tokens) and, over gRPC, the KV bytes that crossed from
prefill to decode per request.

Output: a table per rate on stdout (and a sweep table), or with --json one
JSON object on stdout instead; --output FILE also writes the JSON to FILE;
--plot DIR writes PNG charts. docs/benchmarks.md lists every JSON field.
--from-json re-reads saved results (several files overlay in the charts).

Flags:`

// options are the parsed flags.
type options struct {
	backend, router, apiKey, modelRef string
	dataset, datasetPath              string
	inputLen, outputLen               int
	rangeRatio                        float64
	prefixLen, numGroups              int
	conversations, turns              int
	think                             time.Duration
	sharegptOutputLen                 int
	rates                             []float64
	burstiness                        float64
	concurrencies                     []int // 0: no limit
	numPrompts, warmup                int
	seed                              uint64
	ignoreEOS                         bool
	temperature                       float64
	slo                               measure.SLO
	requestTimeout                    time.Duration
	cancelFraction                    float64
	cancelWithin                      time.Duration
	asJSON                            bool
	output, plotDir, label            string
	fromJSON                          []string
}

// Run is `batonctl bench`; it returns the exit code.
func Run(ctx context.Context, stdout, stderr io.Writer, args []string) int {
	o, code := parse(stderr, args)
	if code >= 0 {
		return code
	}
	if len(o.fromJSON) > 0 {
		return replay(o, stdout, stderr)
	}
	var progress io.Writer
	if modelfile.IsTerminal(stderr) {
		progress = stderr
	}
	rep, err := benchmark(ctx, o, progress)
	if rep != nil && len(rep.Runs) > 0 {
		if werr := emit(o, []*Report{rep}, stdout); werr != nil {
			fmt.Fprintf(stderr, "batonctl bench: %v\n", werr)
			return 1
		}
	}
	switch {
	case ctx.Err() != nil:
		fmt.Fprintln(stderr, "batonctl bench: interrupted")
		return 130
	case err != nil:
		fmt.Fprintf(stderr, "batonctl bench: %v\n", err)
		return 1
	}
	for _, r := range rep.Runs {
		// A storm that cancelled every request it sent (--cancel-fraction
		// 1) completed none by design.
		if r.Completed == 0 && (r.Cancelled == 0 || r.Failed > 0) {
			fmt.Fprintf(stderr, "batonctl bench: no request completed at rate %s, concurrency %s\n", r.RateLabel, concurrencyLabel(r.MaxConcurrency))
			return 1
		}
	}
	return 0
}

// parse reads the flags; code is the exit code to return at once, or -1.
func parse(stderr io.Writer, args []string) (o options, code int) {
	fs := flag.NewFlagSet("batonctl bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.backend, "backend", "grpc", "router API: grpc (RouterService.Generate) or openai (POST /v1/completions, streamed)")
	fs.StringVar(&o.router, "router", "", "router address (default "+loopback.RouterGRPC+" for grpc, "+loopback.RouterHTTP+" for openai: batonctl up's default ports)")
	fs.StringVar(&o.apiKey, "api-key", os.Getenv("BATON_API_KEY"), "bearer token for a router started with --api-keys-file (default $BATON_API_KEY)")
	fs.StringVar(&o.modelRef, "model", "", "GGUF model the router serves, for its vocabulary (default: $BATON_MODEL, else "+modelfile.DefaultHelp+")")
	fs.StringVar(&o.dataset, "dataset", "random", "prompts: random, sharegpt, shared-prefix or multi-turn")
	fs.StringVar(&o.datasetPath, "dataset-path", "", "ShareGPT JSON file (--dataset sharegpt)")
	fs.IntVar(&o.inputLen, "random-input-len", 32, "prompt tokens, BOS included (random); suffix tokens after the shared prefix (shared-prefix); each turn's new message (multi-turn)")
	fs.IntVar(&o.outputLen, "random-output-len", 64, "tokens to generate per request (random, shared-prefix, multi-turn)")
	fs.Float64Var(&o.rangeRatio, "random-range-ratio", 0, "spread lengths uniformly over [len·(1−r), len·(1+r)], 0 ≤ r < 1")
	fs.IntVar(&o.prefixLen, "prefix-len", 32, "shared prefix tokens, BOS included (shared-prefix); each conversation's system prompt (multi-turn)")
	fs.IntVar(&o.numGroups, "num-groups", 4, "number of distinct prefixes (shared-prefix)")
	fs.IntVar(&o.conversations, "num-conversations", 8, "conversations side by side (multi-turn)")
	fs.IntVar(&o.turns, "num-turns", 4, "turns per conversation (multi-turn)")
	fs.DurationVar(&o.think, "think-time", 500*time.Millisecond, "pause between a turn's end and the next turn (multi-turn)")
	fs.IntVar(&o.sharegptOutputLen, "sharegpt-output-len", 0, "fixed output length for sharegpt (0: each answer's length)")
	rates := fs.String("request-rate", "inf", "requests per second, Poisson arrivals; inf sends all at once; a comma-separated list sweeps")
	fs.Float64Var(&o.burstiness, "burstiness", 1, "shape of the gamma-distributed arrival gaps: 1 Poisson, < 1 burstier, > 1 more regular")
	concurrency := fs.String("max-concurrency", "0", "most requests in flight (0: no limit); a comma-separated list sweeps")
	fs.IntVar(&o.numPrompts, "num-prompts", 100, "requests per run")
	fs.IntVar(&o.warmup, "warmup", 1, "unmeasured requests sent first")
	fs.Uint64Var(&o.seed, "seed", 0, "seed of the prompts, the arrivals and the requests' sampling")
	fs.BoolVar(&o.ignoreEOS, "ignore-eos", false, "generate exactly the output length, through end-of-generation tokens")
	fs.Float64Var(&o.temperature, "temperature", 0, "sampling temperature (0: greedy)")
	slo := fs.String("slo", "", "goodput objectives in milliseconds, e.g. ttft:200,tpot:50 (also e2e)")
	fs.DurationVar(&o.requestTimeout, "request-timeout", 10*time.Minute, "cancel a request running longer (0: no limit)")
	fs.Float64Var(&o.cancelFraction, "cancel-fraction", 0, "cancel this fraction of the measured requests (0-1, chosen by --seed), each at a uniformly random moment of --cancel-within after it is sent: a cancel storm")
	fs.DurationVar(&o.cancelWithin, "cancel-within", 2*time.Second, "window of the cancels after each request is sent (--cancel-fraction)")
	fs.BoolVar(&o.asJSON, "json", false, "print one JSON object on stdout instead of the tables")
	fs.StringVar(&o.output, "output", "", "also write the JSON results to this file")
	fs.StringVar(&o.plotDir, "plot", "", "write PNG charts into this directory")
	fs.StringVar(&o.label, "label", "", "name of this configuration in the results and charts (default: the backend)")
	fromJSON := fs.String("from-json", "", "comma-separated result files to report and plot instead of running")
	fs.Usage = func() { fmt.Fprintln(stderr, help); fs.PrintDefaults() }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return o, 0
		}
		return o, 2
	}
	bad := func(format string, a ...any) (options, int) {
		fmt.Fprintf(stderr, "batonctl bench: "+format+"\n", a...)
		return o, 2
	}
	if fs.NArg() > 0 {
		return bad("unexpected argument %q (flags start with --)", fs.Arg(0))
	}
	if *fromJSON != "" {
		o.fromJSON = strings.Split(*fromJSON, ",")
		return o, -1
	}
	switch o.backend {
	case "grpc":
		if o.router == "" {
			o.router = loopback.RouterGRPC
		}
	case "openai":
		if o.router == "" {
			o.router = loopback.RouterHTTP
		}
	default:
		return bad("--backend %q: want grpc or openai", o.backend)
	}
	switch o.dataset {
	case "random", "shared-prefix":
	case "multi-turn":
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		switch {
		case set["num-prompts"]:
			return bad("--num-prompts: the multi-turn data set sends --num-conversations × --num-turns requests")
		case o.conversations < 1:
			return bad("--num-conversations %d: want ≥ 1", o.conversations)
		case o.turns < 1:
			return bad("--num-turns %d: want ≥ 1", o.turns)
		case o.think < 0:
			return bad("--think-time %v: want ≥ 0", o.think)
		}
		o.numPrompts = o.conversations * o.turns
	case "sharegpt":
		if o.datasetPath == "" {
			return bad("--dataset sharegpt needs --dataset-path FILE")
		}
	default:
		return bad("--dataset %q: want random, sharegpt, shared-prefix or multi-turn", o.dataset)
	}
	var err error
	if o.rates, err = parseRates(*rates); err != nil {
		return bad("--request-rate: %v", err)
	}
	if o.concurrencies, err = parseConcurrencies(*concurrency); err != nil {
		return bad("--max-concurrency: %v", err)
	}
	if o.slo, err = measure.ParseSLO(*slo); err != nil {
		return bad("--slo: %v", err)
	}
	switch {
	case o.numPrompts < 1:
		return bad("--num-prompts %d: want ≥ 1", o.numPrompts)
	case o.warmup < 0:
		return bad("--warmup %d: want ≥ 0", o.warmup)
	case !(o.burstiness > 0) || math.IsInf(o.burstiness, 0):
		return bad("--burstiness %v: want a positive number", o.burstiness)
	case o.temperature < 0 || o.temperature > 2 || math.IsNaN(o.temperature):
		return bad("--temperature %v: want 0-2", o.temperature)
	case o.requestTimeout < 0:
		return bad("--request-timeout %v: want ≥ 0", o.requestTimeout)
	case !(o.cancelFraction >= 0 && o.cancelFraction <= 1):
		return bad("--cancel-fraction %v: want 0-1", o.cancelFraction)
	case o.cancelWithin <= 0:
		return bad("--cancel-within %v: want > 0", o.cancelWithin)
	}
	if o.label == "" {
		o.label = o.backend
	}
	return o, -1
}

// parseRates reads "1,2,4,inf".
func parseRates(s string) ([]float64, error) {
	var rates []float64
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if strings.EqualFold(f, "inf") {
			rates = append(rates, math.Inf(1))
			continue
		}
		r, err := strconv.ParseFloat(f, 64)
		if err != nil || !(r > 0) || math.IsInf(r, 0) {
			return nil, fmt.Errorf("%q: want a positive number of requests per second or inf", f)
		}
		rates = append(rates, r)
	}
	return rates, nil
}

// parseConcurrencies reads "1,4,8,16".
func parseConcurrencies(s string) ([]int, error) {
	var cs []int
	for _, f := range strings.Split(s, ",") {
		c, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || c < 0 {
			return nil, fmt.Errorf("%q: want a number of requests ≥ 0 (0: no limit)", f)
		}
		cs = append(cs, c)
	}
	return cs, nil
}

// maxConcurrency is the largest bound of the sweep, 0 when one is unbounded.
func (o *options) maxConcurrency() int {
	m := 0
	for _, c := range o.concurrencies {
		if c == 0 {
			return 0
		}
		m = max(m, c)
	}
	return m
}

// vocabulary loads the tokenizer of the model named by --model (or the
// default), which the data sets draw from.
func vocabulary(ctx context.Context, ref string) (*tokenizer.Tokenizer, error) {
	ref = modelfile.FromEnv(ref)
	if ref == "" {
		return nil, fmt.Errorf("prompts are token ids of the model's vocabulary: pass --model PATH (the GGUF the router serves) or set %s", modelfile.EnvModel)
	}
	path, err := modelfile.Resolve(ctx, ref, modelfile.Options{})
	if err != nil {
		return nil, fmt.Errorf("--model: %w", err)
	}
	f, err := gguf.Open(path)
	if err != nil {
		return nil, fmt.Errorf("--model %s: %w", path, err)
	}
	defer f.Close()
	tok, err := tokenizer.FromGGUF(f)
	if err != nil {
		return nil, fmt.Errorf("--model %s: %w", path, err)
	}
	return tok, nil
}

// prompts makes n prompts of the chosen data set.
func prompts(o options, v dataset.Vocab, ctxLen, n int) ([]dataset.Prompt, error) {
	var (
		ps  []dataset.Prompt
		err error
	)
	switch o.dataset {
	case "random":
		ps, err = dataset.Random(v, dataset.RandomOptions{N: n, InputLen: o.inputLen, OutputLen: o.outputLen,
			RangeRatio: o.rangeRatio, Seed: o.seed})
	case "shared-prefix":
		ps, err = dataset.SharedPrefix(v, dataset.SharedPrefixOptions{N: n, Groups: o.numGroups, PrefixLen: o.prefixLen,
			SuffixLen: o.inputLen, OutputLen: o.outputLen, RangeRatio: o.rangeRatio, Seed: o.seed})
	case "multi-turn":
		ps, err = multiTurn(o, v, n)
	case "sharegpt":
		ps, err = dataset.ShareGPT(v, o.datasetPath, dataset.ShareGPTOptions{N: n, OutputLen: o.sharegptOutputLen,
			ContextLen: ctxLen, Seed: o.seed})
	}
	if err != nil {
		return nil, fmt.Errorf("--dataset %s: %w", o.dataset, err)
	}
	return ps, dataset.Fit(ps, ctxLen)
}

// multiTurn makes the multi-turn prompts: the warm-up's first, single
// turns of conversations of their own (a warm-up request waits for
// nothing), then the measured conversations.
func multiTurn(o options, v dataset.Vocab, n int) ([]dataset.Prompt, error) {
	mt := dataset.MultiTurnOptions{Conversations: o.conversations, Turns: o.turns, SystemLen: o.prefixLen,
		UserLen: o.inputLen, OutputLen: o.outputLen, RangeRatio: o.rangeRatio, Seed: o.seed}
	ps, err := dataset.MultiTurn(v, mt)
	if err != nil || n == len(ps) {
		return ps, err
	}
	mt.Conversations, mt.Turns, mt.Seed = n-len(ps), 1, o.seed^0x9e3779b97f4a7c15
	warm, err := dataset.MultiTurn(v, mt)
	return append(warm, ps...), err
}

// benchmark connects, makes the prompts and runs every rate.
func benchmark(ctx context.Context, o options, progress io.Writer) (*Report, error) {
	b, err := backend.New(backend.Options{Kind: o.backend, Addr: o.router, APIKey: o.apiKey,
		MaxConns: max(o.maxConcurrency(), min(o.numPrompts, 256))})
	if err != nil {
		return nil, err
	}
	defer b.Close()
	infoCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	model, err := b.Model(infoCtx)
	cancel()
	if err != nil {
		return nil, err
	}
	tok, err := vocabulary(ctx, o.modelRef)
	if err != nil {
		return nil, err
	}
	if model.VocabSize != 0 && tok.VocabSize() != model.VocabSize {
		return nil, fmt.Errorf("--model has a %d-token vocabulary but the router serves %s with %d tokens: pass the model the router serves",
			tok.VocabSize(), model.ID, model.VocabSize)
	}
	ps, err := prompts(o, tok, model.ContextLength, o.warmup+o.numPrompts)
	if err != nil {
		return nil, err
	}
	return execute(ctx, o, model, b, load.RealClock{}, ps, progress)
}

// execute warms up with ps[:o.warmup], then runs ps[o.warmup:] at every
// rate and concurrency bound (rates outer). It returns the runs done so far
// along with an error.
func execute(ctx context.Context, o options, model backend.Model, b backend.Backend, clock load.Clock, ps []dataset.Prompt, progress io.Writer) (*Report, error) {
	rep := newReport(o, model)
	if o.warmup > 0 {
		bar := newProgressBar(progress, "warm-up", o.warmup)
		samples, _, _, err := runOnce(ctx, o, b, clock, ps[:o.warmup], math.Inf(1), o.maxConcurrency(), bar, nil, nil)
		bar.finish()
		if err != nil {
			return rep, err
		}
		for _, s := range samples {
			if !s.OK() {
				return rep, fmt.Errorf("warm-up request failed: %s", s.Err)
			}
		}
	}
	measured := ps[o.warmup:]
	cancels := cancelPlan(len(measured), o.cancelFraction, o.cancelWithin, o.seed)
	for _, rate := range o.rates {
		for _, conc := range o.concurrencies {
			label := "rate " + rateLabel(rate)
			if len(o.concurrencies) > 1 {
				label += " concurrency " + concurrencyLabel(conc)
			}
			bar := newProgressBar(progress, label, len(measured))
			results := make([]backend.Result, len(measured))
			samples, start, end, err := runOnce(ctx, o, b, clock, measured, rate, conc, bar, results, cancels)
			bar.finish()
			rep.Runs = append(rep.Runs, newRun(rate, conc, samples, start, end, measured, results, o.slo, err != nil))
			if err != nil {
				return rep, err
			}
		}
	}
	return rep, nil
}

// cancelPlan says, for each of n requests, after how long the bench
// cancels it (0: never): a fraction of them, chosen by seed, each at a
// uniformly random moment of within (at least 1 µs, so that 0 stays
// "never").
func cancelPlan(n int, fraction float64, within time.Duration, seed uint64) []time.Duration {
	if fraction <= 0 {
		return nil
	}
	rng := rand.New(rand.NewPCG(seed, 0xca9ce1))
	plan := make([]time.Duration, n)
	for i := range plan {
		// Both draws for every request, so that a request's moment does
		// not depend on whether the ones before it were chosen.
		chosen, at := rng.Float64() < fraction, time.Duration(rng.Int64N(int64(within)))
		if chosen {
			plan[i] = max(at, time.Microsecond)
		}
	}
	return plan
}

// runOnce sends ps at rate with at most conc in flight, later turns of a
// conversation after their previous turn; results[i], when results is not
// nil, receives what the server reported of request i; cancels[i], when
// cancels is not nil and it is not 0, is when the bench cancels request i
// after sending it.
func runOnce(ctx context.Context, o options, b backend.Backend, clock load.Clock, ps []dataset.Prompt, rate float64, conc int,
	bar *progressBar, results []backend.Result, cancels []time.Duration) ([]measure.Sample, time.Time, time.Time, error) {
	cfg := load.Config{
		Gaps:           load.Intervals(len(ps), rate, o.burstiness, o.seed),
		MaxConcurrency: conc,
		Clock:          clock,
		Progress:       bar.update,
		After:          dataset.Dependencies(ps),
		Think:          o.think,
	}
	return load.Run(ctx, cfg, len(ps), func(ctx context.Context, i int, onChunk func(int)) (int, int, error) {
		if o.requestTimeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, o.requestTimeout)
			defer cancel()
		}
		var storm context.Context
		if i < len(cancels) && cancels[i] > 0 {
			var cancel context.CancelCauseFunc
			ctx, cancel = context.WithCancelCause(ctx)
			defer cancel(nil)
			storm = ctx
			// The real clock, as gRPC's and net/http's cancellation are.
			stop := time.AfterFunc(cancels[i], func() { cancel(measure.ErrCancelled) })
			defer stop.Stop()
		}
		res, err := b.Generate(ctx, backend.Request{PromptIDs: ps[i].IDs, MaxTokens: ps[i].OutputLen,
			IgnoreEOS: o.ignoreEOS, Temperature: o.temperature, Seed: o.seed + uint64(i)}, onChunk)
		if err != nil && storm != nil && errors.Is(context.Cause(storm), measure.ErrCancelled) {
			err = fmt.Errorf("%w after %v: %v", measure.ErrCancelled, cancels[i], err)
		}
		if results != nil {
			results[i] = res
		}
		return res.InputTokens, res.OutputTokens, err
	})
}

// emit writes the results: tables or JSON on stdout, the JSON file, the
// charts.
func emit(o options, reps []*Report, stdout io.Writer) error {
	if o.asJSON {
		if len(reps) == 1 {
			if err := writeJSON(stdout, reps[0]); err != nil {
				return err
			}
		} else if err := writeJSON(stdout, struct {
			Reports []*Report `json:"reports"`
		}{reps}); err != nil {
			return err
		}
	} else {
		for _, r := range reps {
			printReport(stdout, r)
		}
	}
	if o.output != "" && len(reps) == 1 {
		f, err := os.Create(o.output)
		if err != nil {
			return fmt.Errorf("--output: %w", err)
		}
		werr := writeJSON(f, reps[0])
		if cerr := f.Close(); werr == nil {
			werr = cerr
		}
		if werr != nil {
			return fmt.Errorf("--output %s: %w", o.output, werr)
		}
	}
	if o.plotDir != "" {
		if err := os.MkdirAll(o.plotDir, 0o755); err != nil {
			return fmt.Errorf("--plot: %w", err)
		}
		files, err := writeCharts(o.plotDir, reps)
		if err != nil {
			return err
		}
		if !o.asJSON {
			fmt.Fprintf(stdout, "charts: %s\n", strings.Join(files, ", "))
		}
	}
	return nil
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", " ")
	return enc.Encode(v)
}

// replay reports and plots saved results.
func replay(o options, stdout, stderr io.Writer) int {
	var reps []*Report
	for _, path := range o.fromJSON {
		b, err := os.ReadFile(path)
		if err != nil {
			fmt.Fprintf(stderr, "batonctl bench: --from-json: %v\n", err)
			return 1
		}
		var r Report
		if err := json.Unmarshal(b, &r); err != nil {
			fmt.Fprintf(stderr, "batonctl bench: --from-json %s: %v\n", path, err)
			return 1
		}
		if r.Label == "" {
			r.Label = strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
		}
		reps = append(reps, &r)
	}
	o.output = ""
	if err := emit(o, reps, stdout); err != nil {
		fmt.Fprintf(stderr, "batonctl bench: %v\n", err)
		return 1
	}
	return 0
}
