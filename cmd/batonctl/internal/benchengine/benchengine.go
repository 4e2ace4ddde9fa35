// Package benchengine implements `batonctl bench-engine`: it measures the
// inference engine's throughput in-process, with the same continuous
// batching scheduler the services run, at one or more batch sizes.
//
// The flags follow llama-bench where they overlap (-p prompt tokens, -n
// generated tokens, -r repetitions), so that prompt-processing and
// token-generation tests read the same way; --batch is the number of
// sequences running together.
package benchengine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/gguf"
	"github.com/baton-serving/baton/engine/kvcache"
	"github.com/baton-serving/baton/engine/model"
	"github.com/baton-serving/baton/engine/modelfile"
	"github.com/baton-serving/baton/engine/sample"
	"github.com/baton-serving/baton/engine/sched"
	"github.com/baton-serving/baton/engine/tokenizer"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/kernels"
	"github.com/baton-serving/baton/kernels/quant"
	"github.com/baton-serving/baton/svckit"
	"github.com/baton-serving/baton/svckit/constrain"
	"github.com/baton-serving/baton/svckit/device"
)

// Summary is the one-line description of the command.
const Summary = "measure the engine's batched throughput (prompt and generation tokens/s per batch size)"

const help = `Usage: batonctl bench-engine --model PATH [-p 128] [-n 64] [--threads N] [-r 3] [--json]
       batonctl bench-engine --model PATH --batch B[,B…] [-n N] [-p P] [-r R] [flags]

Without --batch it measures one sequence as llama-bench does, calling the
model directly:

  ppP  a P-token prompt in one forward call (logits of its last token);
       pp_tokens_per_second = P / time.
  tgN  N forward calls of one token each, after an untimed one-token
       prompt; tg_tokens_per_second = N / time.

One untimed warm-up (a prompt and one generated token) precedes R timed
repetitions; mean and sample standard deviation are reported, with every
sample. With --json one object is printed:
  {"model":…,"threads":…,"kernels":…,"n_prompt":…,"n_gen":…,
   "pp_tokens_per_second":…,"pp_stddev":…,"pp_samples":[…],
   "tg_tokens_per_second":…,"tg_stddev":…,"tg_samples":[…],
   "bytes_per_token":…,"tg_gb_per_second":…,
   "max_rss_bytes_after_load":…,"load_average":[…], …}
and, with --membw, "read_gb_per_second" (the machine's read bandwidth with
the same threads, STREAM-style, best of 5 passes over 1 GiB) and
"tg_bandwidth_fraction" (tg_gb_per_second over it).

With --batch it runs the model in-process through the continuous-batching
scheduler and reports aggregate throughput for each batch size B (B
sequences running together, each with its own KV cache pages; -p defaults
to 0 there):

  tgN  B sequences start from a one-token prompt and each generate N tokens
       (end-of-generation tokens ignored); tg_tokens_per_second = B·N / time.
  ppP  B sequences each prefill a P-token prompt (in batched chunks) and
       sample one token; pp_tokens_per_second = B·P / time.

With --json-schema FILE or --grammar FILE every sequence is constrained
as a worker constrains a request with sampling.json_schema or
sampling.grammar (the mask in the sampler); a sequence that completes its
grammar ends early, and tg counts the tokens actually generated. Compare
with a run without it for the mask's cost.

Each test runs R times after one untimed warm-up. Decode throughput grows
with B because each step reads every weight matrix once for all B
sequences. With --json one JSON object is printed:
  {"model":…,"threads":…,"kv_type":…,"page_size":…,"load_average":[…],
   "results":[{"batch":B,"test":"tg64","n_prompt":0,"n_gen":64,
               "repetitions":R,"tg_tokens_per_second":…,"stddev":…,"samples":[…]}, …]}

Flags:`

// Exit codes, as the other batonctl commands use them.
const (
	exitOK          = 0
	exitFailed      = 1
	exitUsage       = 2
	exitInterrupted = 130
)

type options struct {
	model            string
	batches          []int
	n, p, reps       int
	threads          int
	device           device.Spec
	kvType           string
	pageSize         int
	json             bool
	kvDType          quant.Type
	maxBatch, maxLen int
	// batched is set by --batch: the scheduler mode.
	batched bool
	pSet    bool // -p was given

	cpuProfile string
	// membw is the buffer size of the read-bandwidth measurement; 0 skips it.
	membw int64

	// jsonSchema and grammar are --json-schema and --grammar: files whose
	// JSON Schema or GBNF constrains every sequence of the batched tests.
	jsonSchema, grammar string
}

// Result is one test at one batch size.
type Result struct {
	Batch       int       `json:"batch"`
	Test        string    `json:"test"`
	NPrompt     int       `json:"n_prompt"`
	NGen        int       `json:"n_gen"`
	Repetitions int       `json:"repetitions"`
	TGPerSecond *float64  `json:"tg_tokens_per_second,omitempty"`
	PPPerSecond *float64  `json:"pp_tokens_per_second,omitempty"`
	Stddev      float64   `json:"stddev"`
	Samples     []float64 `json:"samples"`
	// GeneratedPerSeq is the mean number of tokens a sequence generated in
	// the timed tg runs: N, unless a --json-schema or --grammar ended it
	// sooner.
	GeneratedPerSeq float64 `json:"generated_per_seq,omitempty"`
}

// Report is the whole output.
type Report struct {
	Model        string    `json:"model"`
	Architecture string    `json:"architecture"`
	Layers       int       `json:"layers"`
	Dim          int       `json:"dim"`
	Threads      int       `json:"threads"`
	Device       string    `json:"device"` // "cpu" or "cuda:N", then the backend's description
	KVType       string    `json:"kv_type"`
	PageSize     int       `json:"page_size"`
	LoadAverage  []float64 `json:"load_average,omitempty"`
	Results      []Result  `json:"results"`
}

// Run is the `batonctl bench-engine` command.
func Run(ctx context.Context, stdout, stderr io.Writer, args []string) int {
	o := options{batches: []int{1}}
	fs := flag.NewFlagSet("batonctl bench-engine", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.model, "model", "", "GGUF model: a path or hf://OWNER/REPO/FILE.gguf (default: $BATON_MODEL, else "+modelfile.DefaultHelp+")")
	fs.Func("batch", "sequences running together; a comma-separated list runs each (default 1)", func(s string) error {
		o.batches, o.batched = o.batches[:0], true
		for f := range strings.SplitSeq(s, ",") {
			b, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || b < 1 {
				return fmt.Errorf("batch size %q: want an integer ≥ 1", f)
			}
			o.batches = append(o.batches, b)
		}
		return nil
	})
	fs.IntVar(&o.n, "n", 64, "tokens each sequence generates in the tg test (0 skips it)")
	fs.IntVar(&o.p, "p", 0, "prompt tokens of each sequence in the pp test (0 skips it; default 128 without --batch)")
	fs.IntVar(&o.reps, "r", 3, "timed repetitions of each test")
	fs.Var(&o.device, "device", device.FlagHelp)
	fs.IntVar(&o.threads, "threads", 0, "goroutines for the matrix products and attention on the CPU (default: GOMAXPROCS, the usable cores)")
	fs.StringVar(&o.kvType, "kv-type", "F32", "KV cache element type: F32 or F16")
	fs.IntVar(&o.pageSize, "page-size", kvcache.DefaultPageSize, "KV cache positions per page")
	fs.BoolVar(&o.json, "json", false, "print one JSON object instead of a table")
	fs.BoolFunc("membw", "also measure the machine's memory read bandwidth (the decode ceiling) with the same threads, over a 1 GiB buffer, and report tg against it (without --batch)", func(v string) error {
		on, err := strconv.ParseBool(v)
		if err != nil {
			return err
		}
		o.membw = 0
		if on {
			o.membw = 1 << 30
		}
		return nil
	})
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run (go tool pprof format) to this file")
	fs.StringVar(&o.jsonSchema, "json-schema", "", "constrain every sequence of the --batch tests to JSON valid against the JSON Schema in this file, as sampling.json_schema does on the workers [$"+svckit.EnvName("json-schema")+"]")
	fs.StringVar(&o.grammar, "grammar", "", "constrain every sequence of the --batch tests to the GBNF grammar in this file, as sampling.grammar does on the workers [$"+svckit.EnvName("grammar")+"]")
	fs.Usage = func() {
		fmt.Fprintln(stderr, help)
		fs.PrintDefaults()
	}
	if err := svckit.ParseArgs(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		fmt.Fprintf(stderr, "batonctl bench-engine: %v\n", err)
		return exitUsage
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	o.pSet = set["p"]
	// The constraint files also come from the environment, for scripts
	// that run the same command with and without one.
	for name, v := range map[string]*string{"json-schema": &o.jsonSchema, "grammar": &o.grammar} {
		if env, ok := os.LookupEnv(svckit.EnvName(name)); ok && !set[name] {
			*v = env
		}
	}
	if err := o.check(); err != nil {
		fmt.Fprintf(stderr, "batonctl bench-engine: %v (see --help)\n", err)
		return exitUsage
	}
	if o.cpuProfile != "" {
		pf, err := os.Create(o.cpuProfile)
		if err != nil {
			fmt.Fprintf(stderr, "batonctl bench-engine: %v\n", err)
			return exitFailed
		}
		defer pf.Close()
		if err := pprof.StartCPUProfile(pf); err != nil {
			fmt.Fprintf(stderr, "batonctl bench-engine: CPU profile: %v\n", err)
			return exitFailed
		}
		defer pprof.StopCPUProfile()
	}
	var rep any
	var err error
	if o.batched {
		rep, err = bench(ctx, o, stderr)
	} else {
		rep, err = single(ctx, o)
	}
	if err != nil {
		fmt.Fprintf(stderr, "batonctl bench-engine: %s\n", strings.Join(strings.Fields(err.Error()), " "))
		if ctx.Err() != nil {
			return exitInterrupted
		}
		if errors.Is(err, device.ErrUnavailable) {
			return exitUsage
		}
		return exitFailed
	}
	if o.json {
		enc := json.NewEncoder(stdout)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(rep); err != nil {
			fmt.Fprintf(stderr, "batonctl bench-engine: %v\n", err)
			return exitFailed
		}
		return exitOK
	}
	if r, ok := rep.(*Report); ok {
		printTable(stdout, r)
	} else {
		printSingle(stdout, rep.(*SingleReport))
	}
	return exitOK
}

func (o *options) check() error {
	if !o.pSet && !o.batched {
		o.p = 128
	}
	switch {
	case o.n < 0 || o.p < 0:
		return fmt.Errorf("-n %d -p %d: want ≥ 0", o.n, o.p)
	case o.n == 0 && o.p == 0:
		return errors.New("-n 0 and -p 0 leave nothing to measure")
	case o.reps < 1:
		return fmt.Errorf("-r %d: want ≥ 1", o.reps)
	case o.threads < 0:
		return fmt.Errorf("--threads %d: want ≥ 0", o.threads)
	case o.pageSize < 1:
		return fmt.Errorf("--page-size %d: want ≥ 1", o.pageSize)
	case o.membw > 0 && o.batched:
		return errors.New("--membw measures beside the single-sequence tests: drop --batch")
	case o.jsonSchema != "" && o.grammar != "":
		return errors.New("--json-schema and --grammar: give at most one")
	case (o.jsonSchema != "" || o.grammar != "") && !o.batched:
		return errors.New("--json-schema and --grammar constrain the scheduler's sequences: add --batch")
	}
	switch strings.ToUpper(o.kvType) {
	case "F32":
		o.kvDType = quant.F32
	case "F16":
		o.kvDType = quant.F16
	default:
		return fmt.Errorf("--kv-type %q: want F32 or F16", o.kvType)
	}
	for _, b := range o.batches {
		o.maxBatch = max(o.maxBatch, b)
	}
	// The longest sequence: the tg test's 1-token prompt plus n, or the pp
	// test's p plus (in the scheduler) its one sampled token.
	o.maxLen = max(1+o.n, o.p+1)
	if !o.batched {
		o.maxLen = max(1+o.n, o.p)
	}
	return nil
}

// loaded is the model under test: its file, kept open for the tokenizer
// and the weight statistics, and the loaded weights.
type loaded struct {
	path string
	file *gguf.File
	m    model.Model
	cfg  model.Config
	dev  device.Choice
	// pools are the KV page pools on dev, closed before the backend.
	pools []*kvcache.Pool
}

// loadModel resolves --model (or $BATON_MODEL), opens and loads the file,
// and checks that sequences of o.maxLen positions fit its context window.
func loadModel(ctx context.Context, o options) (*loaded, error) {
	ref := modelfile.FromEnv(o.model)
	if ref == "" {
		return nil, fmt.Errorf("no model: pass --model PATH or set %s", modelfile.EnvModel)
	}
	path, err := modelfile.Resolve(ctx, ref, modelfile.Options{})
	if err != nil {
		return nil, err
	}
	f, err := gguf.Open(path)
	if err != nil {
		return nil, err
	}
	dev, err := device.Open(o.device, o.threads)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("--device %s: %w", o.device, err)
	}
	m, err := model.Load(f, model.Options{Backend: dev.Backend})
	if err != nil {
		dev.Backend.Close()
		f.Close()
		return nil, err
	}
	cfg := m.Config()
	if o.maxLen > cfg.ContextLength {
		m.Close()
		dev.Backend.Close()
		f.Close()
		return nil, fmt.Errorf("sequences of %d positions do not fit the context window of %d: %w", o.maxLen, cfg.ContextLength, engine.ErrContextOverflow)
	}
	return &loaded{path: path, file: f, m: m, cfg: cfg, dev: dev}, nil
}

// Close releases the weights, the KV pages, the backend, then the file the
// weights were loaded from.
func (l *loaded) Close() {
	l.m.Close()
	for _, p := range l.pools {
		p.Close()
	}
	l.dev.Backend.Close()
	l.file.Close()
}

// newPool allocates a page pool on the model's device, closed with it.
func (l *loaded) newPool(layout kernels.KVLayout, pages int) (*kvcache.Pool, error) {
	p, err := kvcache.NewOn(l.dev.Backend, layout, pages)
	if err != nil {
		return nil, err
	}
	l.pools = append(l.pools, p)
	return p, nil
}

// effectiveThreads is the thread count model.Load uses for --threads.
func effectiveThreads(threads int) int {
	if threads == 0 {
		return runtime.GOMAXPROCS(0)
	}
	return threads
}

func bench(ctx context.Context, o options, stderr io.Writer) (*Report, error) {
	lm, err := loadModel(ctx, o)
	if err != nil {
		return nil, err
	}
	defer lm.Close()
	path, f, m, cfg := lm.path, lm.file, lm.m, lm.cfg
	bos := int32(1)
	tok, err := tokenizer.FromGGUF(f)
	if err == nil && tok.BOS() >= 0 && int(tok.BOS()) < cfg.Vocab {
		bos = tok.BOS()
	}
	var constraint func() sample.Constraint
	if o.jsonSchema != "" || o.grammar != "" {
		if tok == nil {
			return nil, fmt.Errorf("--json-schema/--grammar need the model's tokenizer: %w", err)
		}
		if constraint, err = loadConstraint(o, tok, cfg.Vocab); err != nil {
			return nil, err
		}
	}
	layout := cfg.KVLayout(o.pageSize, o.kvDType)
	pool, err := lm.newPool(layout, o.maxBatch*layout.PagesFor(o.maxLen))
	if err != nil {
		return nil, err
	}
	threads := effectiveThreads(o.threads)
	rep := &Report{
		Model: path, Architecture: cfg.Architecture, Layers: cfg.Layers, Dim: cfg.Dim,
		Threads: threads, Device: lm.dev.String(), KVType: o.kvDType.String(), PageSize: o.pageSize,
		LoadAverage: loadAverage(), Results: []Result{},
	}
	for _, b := range o.batches {
		s, err := sched.New(sched.Config{
			Model: m, Pool: pool, Tokenizer: tok, MaxSeqs: b, MaxBatchTokens: max(sched.DefaultMaxBatchTokens, b),
			EventBuffer: o.maxLen + 4, AuditInterval: -1,
		})
		if err != nil {
			return nil, err
		}
		results, err := benchBatch(ctx, s, o, b, bos, cfg.Vocab, constraint)
		s.Close()
		if err != nil {
			return nil, err
		}
		rep.Results = append(rep.Results, results...)
		if !o.json {
			for _, r := range results {
				fmt.Fprintf(stderr, "batch %d %s: %.2f tokens/s", r.Batch, r.Test, mean(r.Samples))
				if r.GeneratedPerSeq > 0 {
					fmt.Fprintf(stderr, " (%.1f tokens per sequence)", r.GeneratedPerSeq)
				}
				fmt.Fprintln(stderr)
			}
		}
	}
	return rep, nil
}

// loadConstraint compiles --json-schema or --grammar against the model's
// vocabulary, as a worker does, and returns a maker of fresh matchers.
func loadConstraint(o options, tok *tokenizer.Tokenizer, vocab int) (func() sample.Constraint, error) {
	file, sp := o.grammar, &batonv1.SamplingParams{}
	if o.jsonSchema != "" {
		file = o.jsonSchema
	}
	src, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	if len(bytes.TrimSpace(src)) == 0 {
		// An empty grammar or schema field means unconstrained: the
		// benchmark would report the unconstrained speed as constrained.
		return nil, fmt.Errorf("%s: the file is empty", file)
	}
	if o.jsonSchema != "" {
		sp.JsonSchema = string(src)
	} else {
		sp.Grammar = string(src)
	}
	c := constrain.New(tok, vocab, 1)
	if _, err := c.Constraint(sp); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return func() sample.Constraint {
		m, _ := c.Constraint(sp) // cached: compiled above
		return m
	}, nil
}

// benchBatch runs the tests at one batch size; constraint, when set, makes
// each sequence's grammar matcher.
func benchBatch(ctx context.Context, s *sched.Scheduler, o options, b int, bos int32, vocab int, constraint func() sample.Constraint) ([]Result, error) {
	var out []Result
	if o.p > 0 {
		// A fixed pseudo-random prompt: token ids spread over the
		// vocabulary, the same in every run.
		prompt := make([]int32, o.p)
		prompt[0] = bos
		for i := 1; i < o.p; i++ {
			prompt[i] = int32((i*7919 + 13) % vocab)
		}
		r, err := runTest(ctx, s, b, o.reps, sched.Request{Prompt: prompt, MaxTokens: 1, Params: greedy(), IgnoreEOS: true}, o.p, constraint, false)
		if err != nil {
			return nil, err
		}
		r.Test, r.NPrompt = fmt.Sprintf("pp%d", o.p), o.p
		r.PPPerSecond = ptr(mean(r.Samples))
		out = append(out, r)
	}
	if o.n > 0 {
		r, err := runTest(ctx, s, b, o.reps, sched.Request{Prompt: []int32{bos}, MaxTokens: o.n, Params: greedy(), IgnoreEOS: true}, o.n, constraint, true)
		if err != nil {
			return nil, err
		}
		r.Test, r.NGen = fmt.Sprintf("tg%d", o.n), o.n
		r.TGPerSecond = ptr(mean(r.Samples))
		out = append(out, r)
	}
	return out, nil
}

// runTest runs b copies of req together, once to warm up and reps times
// timed, counting perSeq tokens for each sequence, or with countGenerated
// the tokens each generated (a grammar may end a sequence early).
func runTest(ctx context.Context, s *sched.Scheduler, b, reps int, req sched.Request, perSeq int, constraint func() sample.Constraint, countGenerated bool) (Result, error) {
	res := Result{Batch: b, Repetitions: reps, Samples: []float64{}}
	for rep := -1; rep < reps; rep++ {
		start := time.Now()
		generated, err := runOnce(ctx, s, b, req, constraint)
		if err != nil {
			return res, err
		}
		tokens := b * perSeq
		if countGenerated {
			tokens = generated
		}
		if rep >= 0 {
			res.Samples = append(res.Samples, float64(tokens)/time.Since(start).Seconds())
			if countGenerated {
				res.GeneratedPerSeq += float64(generated) / float64(b*reps)
			}
		}
	}
	res.Stddev = stddev(res.Samples)
	return res, nil
}

// runOnce runs b copies of req (each with a fresh matcher from constraint,
// when set) and returns the tokens they generated.
func runOnce(ctx context.Context, s *sched.Scheduler, b int, req sched.Request, constraint func() sample.Constraint) (int, error) {
	streams := make([]*sched.Stream, 0, b)
	for range b {
		if constraint != nil {
			req.Constraint = constraint()
		}
		st, err := s.Submit(ctx, req)
		if err != nil {
			return 0, err
		}
		streams = append(streams, st)
	}
	errs := make([]error, b)
	generated := make([]int, b)
	var wg sync.WaitGroup
	for i, st := range streams {
		wg.Go(func() {
			for ev := range st.Events() {
				if ev.Kind == sched.EventDone {
					generated[i] = ev.Usage.CompletionTokens
					if ev.Err != nil {
						errs[i] = fmt.Errorf("sequence %d: %s: %w", i, ev.Finish, ev.Err)
					}
				}
			}
		})
	}
	wg.Wait()
	total := 0
	for _, g := range generated {
		total += g
	}
	return total, errors.Join(errs...)
}

func greedy() sample.Params {
	p := sample.Defaults()
	p.Temperature = 0
	return p
}

func ptr(v float64) *float64 { return &v }

func mean(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

func stddev(xs []float64) float64 {
	if len(xs) < 2 {
		return 0
	}
	m := mean(xs)
	var s float64
	for _, x := range xs {
		s += (x - m) * (x - m)
	}
	return math.Sqrt(s / float64(len(xs)-1))
}

// loadAverage reads the 1, 5 and 15 minute load averages where the system
// publishes them (Linux); benchmarks on a shared machine are only
// comparable with it.
func loadAverage() []float64 {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return nil
	}
	var out []float64
	for _, f := range strings.Fields(string(raw))[:3] {
		v, err := strconv.ParseFloat(f, 64)
		if err != nil {
			return nil
		}
		out = append(out, v)
	}
	return out
}

func printTable(w io.Writer, r *Report) {
	fmt.Fprintf(w, "model: %s (%s, %d layers, dim %d), %d threads, KV cache %s in pages of %d",
		r.Model, r.Architecture, r.Layers, r.Dim, r.Threads, r.KVType, r.PageSize)
	if len(r.LoadAverage) == 3 {
		fmt.Fprintf(w, ", load average %.2f %.2f %.2f", r.LoadAverage[0], r.LoadAverage[1], r.LoadAverage[2])
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "| %5s | %-7s | %20s |\n", "batch", "test", "tokens/s")
	fmt.Fprintf(w, "| %5s | %-7s | %20s |\n", "----:", "-------", "-------------------:")
	for _, res := range r.Results {
		fmt.Fprintf(w, "| %5d | %-7s | %20s |\n", res.Batch, res.Test, fmt.Sprintf("%.2f ± %.2f", mean(res.Samples), res.Stddev))
	}
}
