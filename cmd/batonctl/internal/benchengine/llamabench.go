package benchengine

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"time"

	"github.com/baton-serving/baton/engine/gguf"
	"github.com/baton-serving/baton/engine/model"
	"github.com/baton-serving/baton/kernels/quant"
	"github.com/baton-serving/baton/kernels/vec"
)

// SingleReport is the output of the llama-bench-style mode (no --batch):
// one sequence, prompt processing and token generation measured as
// llama-bench measures them.
type SingleReport struct {
	Model        string `json:"model"`
	Architecture string `json:"architecture"`
	// WeightType is the type of most weight bytes (F32, F16, Q8_0, …).
	WeightType string `json:"weight_type"`
	Params     int64  `json:"params"`
	FileBytes  int64  `json:"file_bytes"`
	// BytesPerToken is what a decode step reads: every weight tensor,
	// except that only one row of an untied token embedding is read.
	BytesPerToken int64     `json:"bytes_per_token"`
	Threads       int       `json:"threads"`
	Kernels       string    `json:"kernels"`
	Device        string    `json:"device"` // "cpu" or "cuda:N", then the backend's description
	KVType        string    `json:"kv_type"`
	PageSize      int       `json:"page_size"`
	LoadAverage   []float64 `json:"load_average,omitempty"`
	// MaxRSSAfterLoad is the process's peak resident set (getrusage
	// ru_maxrss) right after the model is loaded, before any token runs;
	// MaxRSS is the peak at the end, which counts the mapped weights the
	// runs touched.
	MaxRSSAfterLoad int64 `json:"max_rss_bytes_after_load,omitempty"`
	MaxRSS          int64 `json:"max_rss_bytes,omitempty"`

	NPrompt     int `json:"n_prompt"`
	NGen        int `json:"n_gen"`
	Repetitions int `json:"repetitions"`

	PPPerSecond float64   `json:"pp_tokens_per_second"`
	PPStddev    float64   `json:"pp_stddev"`
	PPSamples   []float64 `json:"pp_samples"`
	TGPerSecond float64   `json:"tg_tokens_per_second"`
	TGStddev    float64   `json:"tg_stddev"`
	TGSamples   []float64 `json:"tg_samples"`
	// TGGBPerSecond is tg_tokens_per_second × bytes_per_token: the weight
	// bandwidth decode achieved.
	TGGBPerSecond float64 `json:"tg_gb_per_second"`
	// With --membw: the machine's read bandwidth measured right after the
	// tests with the same threads (GB/s), and tg_gb_per_second over it,
	// the fraction of the decode ceiling reached.
	ReadGBPerSecond     float64 `json:"read_gb_per_second,omitempty"`
	TGBandwidthFraction float64 `json:"tg_bandwidth_fraction,omitempty"`
}

// weightStats sums the file's tensors: parameters, bytes, the bytes a
// decode step reads, and the type holding the most bytes.
func weightStats(f *gguf.File) (params, total, perToken int64, typ string) {
	byType := map[quant.Type]int64{}
	var embdSkip int64
	for i := range f.Tensors {
		t := &f.Tensors[i]
		n := int64(1)
		for _, d := range t.Dims {
			n *= int64(d)
		}
		params += n
		total += int64(t.Size)
		byType[t.Type] += int64(t.Size)
		if t.Name == "token_embd.weight" && len(t.Dims) == 2 && t.Dims[1] > 0 {
			embdSkip = int64(t.Size) - int64(t.Size)/int64(t.Dims[1])
		}
	}
	perToken = total
	if _, ok := f.Tensor("output.weight"); ok {
		perToken -= embdSkip
	}
	var best int64 = -1
	for t, b := range byType {
		if b > best {
			best, typ = b, t.String()
		}
	}
	return params, total, perToken, typ
}

// single runs the llama-bench-style tests: ppP (a P-token prompt in one
// forward call, logits of its last token) and tgN (N forward calls of one
// token each after a one-token prompt), each timed R times after an
// untimed warm-up, on one sequence over a paged KV cache.
func single(ctx context.Context, o options) (*SingleReport, error) {
	lm, err := loadModel(ctx, o)
	if err != nil {
		return nil, err
	}
	defer lm.Close()
	path, f, m, cfg := lm.path, lm.file, lm.m, lm.cfg
	rep := &SingleReport{
		Model: path, Architecture: cfg.Architecture, Threads: effectiveThreads(o.threads),
		Kernels: vec.Implementation(), Device: lm.dev.String(), KVType: o.kvDType.String(), PageSize: o.pageSize,
		FileBytes: int64(f.Size()), MaxRSSAfterLoad: maxRSS(),
		NPrompt: o.p, NGen: o.n, Repetitions: o.reps,
		PPSamples: []float64{}, TGSamples: []float64{},
	}
	rep.Params, _, rep.BytesPerToken, rep.WeightType = weightStats(f)
	layout := cfg.KVLayout(o.pageSize, o.kvDType)
	kv, err := lm.newPool(layout, layout.PagesFor(o.maxLen))
	if err != nil {
		return nil, err
	}
	table := kv.NewTable()
	if err := table.Grow(o.maxLen); err != nil {
		return nil, err
	}
	logits := make([]float32, cfg.Vocab)
	// Pseudo-random tokens, the same in every run, as llama-bench feeds.
	rng := rand.New(rand.NewPCG(1, 2))
	token := func() int32 { return int32(rng.IntN(cfg.Vocab)) }
	step := func(tokens []int32, pos int) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		return m.ForwardBatch(kv, []model.Chunk{{Tokens: tokens, Pos: pos, Pages: table.Pages(), Logits: logits}})
	}
	pp := func() (float64, error) {
		prompt := make([]int32, o.p)
		for i := range prompt {
			prompt[i] = token()
		}
		start := time.Now()
		if err := step(prompt, 0); err != nil {
			return 0, err
		}
		return float64(o.p) / time.Since(start).Seconds(), nil
	}
	tg := func(n int) (float64, error) {
		if err := step([]int32{token()}, 0); err != nil {
			return 0, err
		}
		start := time.Now()
		for i := range n {
			if err := step([]int32{token()}, 1+i); err != nil {
				return 0, err
			}
		}
		return float64(n) / time.Since(start).Seconds(), nil
	}

	// Warm up as llama-bench does: one prompt, one generated token.
	if o.p > 0 {
		if _, err := pp(); err != nil {
			return nil, err
		}
	}
	if o.n > 0 {
		if _, err := tg(1); err != nil {
			return nil, err
		}
	}
	rep.LoadAverage = loadAverage()
	for range o.reps {
		if o.p > 0 {
			v, err := pp()
			if err != nil {
				return nil, err
			}
			rep.PPSamples = append(rep.PPSamples, v)
		}
		if o.n > 0 {
			v, err := tg(o.n)
			if err != nil {
				return nil, err
			}
			rep.TGSamples = append(rep.TGSamples, v)
		}
	}
	rep.PPPerSecond, rep.PPStddev = mean(rep.PPSamples), stddev(rep.PPSamples)
	rep.TGPerSecond, rep.TGStddev = mean(rep.TGSamples), stddev(rep.TGSamples)
	rep.TGGBPerSecond = rep.TGPerSecond * float64(rep.BytesPerToken) / 1e9
	rep.MaxRSS = maxRSS()
	if o.membw > 0 {
		rep.ReadGBPerSecond = readBandwidth(o.membw, rep.Threads, 5) / 1e9
		if rep.ReadGBPerSecond > 0 && o.n > 0 {
			rep.TGBandwidthFraction = rep.TGGBPerSecond / rep.ReadGBPerSecond
		}
	}
	return rep, nil
}

func printSingle(w io.Writer, r *SingleReport) {
	fmt.Fprintf(w, "model: %s (%s %s, %.2f B params, %.2f GB read per token), device %s, %s kernels, %d threads, KV cache %s",
		r.Model, r.Architecture, r.WeightType, float64(r.Params)/1e9, float64(r.BytesPerToken)/1e9,
		r.Device, r.Kernels, r.Threads, r.KVType)
	if len(r.LoadAverage) == 3 {
		fmt.Fprintf(w, ", load average %.2f %.2f %.2f", r.LoadAverage[0], r.LoadAverage[1], r.LoadAverage[2])
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "| %7s | %-7s | %20s | %s\n", "threads", "test", "t/s", "samples")
	fmt.Fprintf(w, "| %7s | %-7s | %20s |\n", "------:", "-------", "-------------------:")
	row := func(test string, m, sd float64, samples []float64) {
		fmt.Fprintf(w, "| %7d | %-7s | %20s | %.4g\n", r.Threads, test, fmt.Sprintf("%.2f ± %.2f", m, sd), samples)
	}
	if r.NPrompt > 0 {
		row(fmt.Sprintf("pp%d", r.NPrompt), r.PPPerSecond, r.PPStddev, r.PPSamples)
	}
	if r.NGen > 0 {
		row(fmt.Sprintf("tg%d", r.NGen), r.TGPerSecond, r.TGStddev, r.TGSamples)
		fmt.Fprintf(w, "tg weight bandwidth: %.2f GB/s", r.TGGBPerSecond)
		if r.TGBandwidthFraction > 0 {
			fmt.Fprintf(w, ", %.0f%% of the read bandwidth", 100*r.TGBandwidthFraction)
		}
		fmt.Fprintln(w)
	}
	if r.ReadGBPerSecond > 0 {
		fmt.Fprintf(w, "read bandwidth (%d threads, measured after the tests): %.2f GB/s\n", r.Threads, r.ReadGBPerSecond)
	}
	if r.MaxRSSAfterLoad > 0 {
		fmt.Fprintf(w, "ru_maxrss: %.1f MB after load (%.1f%% of the file), %.1f MB at the end\n",
			float64(r.MaxRSSAfterLoad)/1e6, 100*float64(r.MaxRSSAfterLoad)/float64(max(r.FileBytes, 1)), float64(r.MaxRSS)/1e6)
	}
}
