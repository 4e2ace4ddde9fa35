package runcmd

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/model"
	"github.com/baton-serving/baton/engine/sample"
	"github.com/baton-serving/baton/engine/tokenizer"
	"github.com/baton-serving/baton/svckit"
	"github.com/baton-serving/baton/svckit/device"
)

// RunSummary is the one-line description of `batonctl run`.
const RunSummary = "generate text from a prompt with a local GGUF model"

const runHelp = `Usage: batonctl run --prompt TEXT [flags]

Generates a continuation of TEXT with the model, streaming it to stdout.
The prompt is tokenized with the model's BOS prepended and special-token
text (such as "<s>") recognised.

Generation stops after -n tokens, when the context window is full, on a
--stop string (which is not printed), or on an end-of-generation token as
the GGUF metadata defines them (tokenizer EOS, EOT and the like). It does not
stop on BOS, as llama.cpp does not: the llama2.c "stories" models emit BOS
(id 1) between stories and carry on with a new one.

With --temperature 0 the most likely token is always taken (greedy);
otherwise the filters apply in llama.cpp's order: penalties, top-k, top-p,
min-p, temperature. Defaults are llama.cpp's.

With --json nothing is streamed; one JSON object is printed at the end:
  {"prompt_ids":[…],"generated_ids":[…],"text":"…",
   "prompt_tokens_per_second":…,"generation_tokens_per_second":…,
   "stop_reason":"length|eog|stop|context|cancelled",
   "finish_reason":"length|stop|abort","seed":…}
finish_reason is stop_reason in the words of "batonctl generate --json" and
the API: eog and stop are "stop", length and context "length", cancelled
"abort".

Flags:`

type runOptions struct {
	model, prompt     string
	n, threads, ctx   int
	params            sample.Params
	seed              string
	stops             []string
	json, noParseSpec bool
	numerics          model.Numerics
	device            device.Spec
}

type runResult struct {
	PromptIDs     []int32 `json:"prompt_ids"`
	GeneratedIDs  []int32 `json:"generated_ids"`
	Text          string  `json:"text"`
	PromptTPS     float64 `json:"prompt_tokens_per_second"`
	GenerationTPS float64 `json:"generation_tokens_per_second"`
	StopReason    string  `json:"stop_reason"`
	FinishReason  string  `json:"finish_reason"` // StopReason as generate and the API name it
	Seed          uint64  `json:"seed"`
	Device        string  `json:"device"` // what it ran on: "cpu" or "cuda:N"
}

// finishReason maps a stop reason to the finish reason "batonctl generate"
// reports for the same end on the serving path (decode-svc's finish).
func finishReason(stop string) string {
	switch stop {
	case "eog", "stop":
		return "stop"
	case "length", "context":
		return "length"
	case "cancelled":
		return "abort"
	}
	return ""
}

// Run is the `batonctl run` command.
func Run(ctx context.Context, stdout, stderr io.Writer, args []string) int {
	o := runOptions{params: sample.Defaults()}
	p := &o.params
	// llama.cpp's defaults.
	p.Temperature, p.TopK, p.TopP, p.MinP = 0.8, 40, 0.95, 0.05
	fs := flag.NewFlagSet("batonctl run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.model, "model", "", modelFlagHelp)
	fs.StringVar(&o.prompt, "prompt", "", "the prompt text")
	fs.IntVar(&o.n, "n", 64, "maximum number of tokens to generate")
	float32Var(fs, &p.Temperature, "temperature", "sampling temperature; 0 = greedy")
	fs.IntVar(&p.TopK, "top-k", p.TopK, "keep the K most likely tokens (0 = off)")
	float32Var(fs, &p.TopP, "top-p", "keep the most likely tokens up to this total probability (1 = off)")
	float32Var(fs, &p.MinP, "min-p", "drop tokens less likely than this fraction of the best one (0 = off)")
	float32Var(fs, &p.RepeatPenalty, "repeat-penalty", "divide positive / multiply negative logits of recent tokens (1 = off)")
	fs.IntVar(&p.PenaltyLastN, "repeat-last-n", p.PenaltyLastN, "how many recent tokens (prompt included) the penalties look at; -1 = all")
	float32Var(fs, &p.FrequencyPenalty, "frequency-penalty", "subtract this per occurrence of a recent token, in [-2, 2]")
	float32Var(fs, &p.PresencePenalty, "presence-penalty", "subtract this once for any recent token, in [-2, 2]")
	fs.StringVar(&o.seed, "seed", "", "random seed, an unsigned integer (default: random)")
	fs.Var(&o.device, "device", device.FlagHelp)
	fs.IntVar(&o.threads, "threads", 0, "goroutines for the matrix products on the CPU (default: GOMAXPROCS)")
	fs.IntVar(&o.ctx, "ctx-size", 0, "context window (default: the model's context_length)")
	fs.TextVar(&o.numerics, "numerics", model.NumericsDefault,
		"arithmetic: default, or llamacpp to reproduce llama.cpp's outputs exactly (F32 models only, slow, --threads ignored)")
	fs.Func("stop", "stop at this text, which is not printed (repeatable)", func(s string) error {
		if s == "" {
			return errors.New("empty stop string")
		}
		o.stops = append(o.stops, s)
		return nil
	})
	fs.BoolVar(&o.json, "json", false, "print one JSON object with ids, text and speeds instead of streaming")
	fs.BoolVar(&o.noParseSpec, "no-parse-special", false, "treat special-token text in the prompt as plain text")
	fs.Usage = func() {
		fmt.Fprintln(stderr, runHelp)
		fs.PrintDefaults()
	}
	if err := svckit.ParseArgs(fs, args); err != nil {
		return flagErr(stderr, "run", err)
	}
	if err := o.check(); err != nil {
		return flagErr(stderr, "run", err)
	}
	res, err := run(ctx, o, stdout, stderr)
	if errors.Is(err, device.ErrUnavailable) {
		return flagErr(stderr, "run", err)
	}
	if res != nil {
		res.FinishReason = finishReason(res.StopReason)
	}
	if res != nil && o.json {
		enc := json.NewEncoder(stdout)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(res); err != nil {
			fmt.Fprintf(stderr, "batonctl run: %s\n", oneLine(err))
			return exitFailed
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "batonctl run: %s\n", oneLine(err))
		return exitFailed
	}
	if !o.json {
		fmt.Fprintln(stdout)
		fmt.Fprintf(stderr, "prompt: %d tokens, %.1f tokens/s; generated: %d tokens, %.1f tokens/s; stop: %s; seed: %d\n",
			len(res.PromptIDs), res.PromptTPS, len(res.GeneratedIDs), res.GenerationTPS, res.StopReason, res.Seed)
	}
	if res.StopReason == "cancelled" {
		return exitInterrupted
	}
	return exitOK
}

// float32Var defines a float32 flag whose default is *p's current value.
func float32Var(fs *flag.FlagSet, p *float32, name, usage string) {
	fs.Func(name, fmt.Sprintf("%s (default %v)", usage, *p), func(s string) error {
		v, err := strconv.ParseFloat(s, 32)
		if err != nil {
			return fmt.Errorf("not a number: %q", s)
		}
		*p = float32(v)
		return nil
	})
}

func (o *runOptions) check() error {
	if o.n < 0 {
		return fmt.Errorf("-n %d: want ≥ 0", o.n)
	}
	if o.threads < 0 {
		return fmt.Errorf("--threads %d: want ≥ 0", o.threads)
	}
	if o.ctx < 0 {
		return fmt.Errorf("--ctx-size %d: want ≥ 0", o.ctx)
	}
	if o.seed == "" {
		o.params.Seed = rand.Uint64()
	} else {
		s, err := strconv.ParseUint(o.seed, 10, 64)
		if err != nil {
			return fmt.Errorf("--seed %q: want an unsigned integer", o.seed)
		}
		o.params.Seed = s
	}
	if err := o.params.Validate(); err != nil {
		return err
	}
	if o.numerics != model.NumericsDefault && o.device.Kind == device.CUDA {
		return fmt.Errorf("--numerics %s computes on the host: it cannot run with --device %s", o.numerics, o.device)
	}
	return nil
}

// run generates. It returns the result so far together with an error that
// happened mid-way; a nil result means nothing was generated.
func run(ctx context.Context, o runOptions, stdout, stderr io.Writer) (*runResult, error) {
	f, err := openModel(ctx, o.model, stderr)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	tok, err := tokenizer.FromGGUF(f)
	if err != nil {
		return nil, err
	}
	dev := o.device
	if o.numerics != model.NumericsDefault {
		dev = device.Spec{Kind: device.CPU} // the host numerics need no backend
	}
	choice, err := device.Open(dev, o.threads)
	if err != nil {
		return nil, fmt.Errorf("--device %s: %w", o.device, err)
	}
	defer choice.Backend.Close()
	if o.device.Kind != device.CPU && !o.json {
		fmt.Fprintf(stderr, "device: %s (%s)\n", choice, choice.Reason)
	}
	mo := model.Options{Backend: choice.Backend, ContextLength: o.ctx, Numerics: o.numerics}
	if o.numerics != model.NumericsDefault {
		mo.Backend, mo.Threads = nil, o.threads
	}
	m, err := model.Load(f, mo)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	cfg := m.Config()

	ids := tok.Encode(o.prompt, tokenizer.EncodeOptions{AddSpecial: true, ParseSpecial: !o.noParseSpec})
	if len(ids) == 0 {
		return nil, fmt.Errorf("the prompt is empty and the model adds no BOS token: %w", engine.ErrInvalidInput)
	}
	if len(ids) >= cfg.ContextLength {
		return nil, fmt.Errorf("the prompt has %d tokens, which leaves no room in the context window of %d: %w",
			len(ids), cfg.ContextLength, engine.ErrContextOverflow)
	}
	maxNew := min(o.n, cfg.ContextLength-len(ids))
	cache, err := model.NewContiguousCache(cfg, len(ids)+maxNew)
	if err != nil {
		return nil, err
	}
	defer cache.Close() // pages on a GPU's memory are freed before the backend closes
	smp, err := sample.New(o.params)
	if err != nil {
		return nil, err
	}
	smp.Accept(ids...)
	stopper, err := sample.NewStopper(o.stops, nil)
	if err != nil {
		return nil, err
	}
	dec := tok.NewStreamDecoder()

	res := &runResult{PromptIDs: ids, GeneratedIDs: []int32{}, Seed: o.params.Seed, StopReason: "length", Device: choice.Label()}
	emit := func(s string) {
		res.Text += s
		if !o.json && s != "" {
			io.WriteString(stdout, s)
		}
	}
	logits := make([]float32, cfg.Vocab)
	start := time.Now()
	if err := m.Forward(ids, 0, cache, logits); err != nil {
		return nil, err
	}
	res.PromptTPS = rate(len(ids), time.Since(start))

	start = time.Now()
	pos := len(ids)
	stopped := false
	for len(res.GeneratedIDs) < maxNew {
		if ctx.Err() != nil {
			res.StopReason = "cancelled"
			break
		}
		t, err := smp.Sample(logits)
		if err != nil {
			return res, err
		}
		if tok.IsEOG(t.ID) {
			res.StopReason = "eog"
			break
		}
		res.GeneratedIDs = append(res.GeneratedIDs, t.ID)
		smp.Accept(t.ID)
		text, stop := stopper.Push(t.ID, dec.Next(t.ID))
		emit(text)
		if stop {
			res.StopReason, stopped = "stop", true
			break
		}
		if len(res.GeneratedIDs) == maxNew {
			if maxNew < o.n {
				res.StopReason = "context"
			}
			break
		}
		if err := m.Forward([]int32{t.ID}, pos, cache, logits); err != nil {
			return res, err
		}
		pos++
	}
	res.GenerationTPS = rate(len(res.GeneratedIDs), time.Since(start))
	if !stopped {
		// Bytes the decoder held back may still complete a stop string.
		text, stop := stopper.Push(-1, dec.Flush())
		emit(text)
		if stop {
			res.StopReason = "stop"
		} else {
			emit(stopper.Flush())
		}
	}
	return res, nil
}

func rate(n int, d time.Duration) float64 {
	if n == 0 || d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}
