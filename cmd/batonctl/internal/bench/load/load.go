// Package load drives a benchmark's requests: it releases them on an
// arrival schedule (Poisson, or gamma-distributed gaps for bursty traffic,
// or all at once), keeps at most a given number in flight, and records for
// each one when it was sent, when each chunk of its output arrived and when
// it ended.
package load

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/baton-serving/baton/cmd/batonctl/internal/bench/measure"
)

// Clock tells the time and waits; tests substitute one they advance by hand.
type Clock interface {
	Now() time.Time
	// Sleep waits d or until ctx ends, returning ctx's error then.
	Sleep(ctx context.Context, d time.Duration) error
}

// RealClock is the system clock.
type RealClock struct{}

// Now implements Clock.
func (RealClock) Now() time.Time { return time.Now() }

// Sleep implements Clock.
func (RealClock) Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Intervals returns the n gaps before each request's arrival (the first is
// before the first request). With rate +Inf (or ≤ 0) every gap is 0: all
// requests arrive at once. Otherwise gaps are gamma-distributed with shape
// burstiness and mean 1/rate, as vLLM's and sglang's benchmarks draw them:
// burstiness 1 is a Poisson process, below 1 burstier, above 1 more regular.
func Intervals(n int, rate, burstiness float64, seed uint64) []time.Duration {
	gaps := make([]time.Duration, n)
	if math.IsInf(rate, 1) || rate <= 0 {
		return gaps
	}
	rng := rand.New(rand.NewPCG(seed, 4))
	for i := range gaps {
		var x float64 // in units of the mean gap
		if burstiness == 1 {
			x = rng.ExpFloat64()
		} else {
			x = gamma(rng, burstiness) / burstiness
		}
		gaps[i] = time.Duration(x / rate * float64(time.Second))
	}
	return gaps
}

// gamma draws from Gamma(shape, 1) by Marsaglia and Tsang's method; a shape
// under 1 is boosted by one and corrected with a uniform power.
func gamma(rng *rand.Rand, shape float64) float64 {
	if shape < 1 {
		u := rng.Float64()
		for u == 0 {
			u = rng.Float64()
		}
		return gamma(rng, shape+1) * math.Pow(u, 1/shape)
	}
	d := shape - 1.0/3
	c := 1 / math.Sqrt(9*d)
	for {
		x := rng.NormFloat64()
		v := 1 + c*x
		if v <= 0 {
			continue
		}
		v = v * v * v
		u := rng.Float64()
		if u < 1-0.0331*x*x*x*x || math.Log(u) < 0.5*x*x+d*(1-v+math.Log(v)) {
			return d * v
		}
	}
}

// Do runs request i to its end, calling onChunk as output arrives, and
// returns the prompt and output token counts.
type Do func(ctx context.Context, i int, onChunk func(tokens int)) (inTokens, outTokens int, err error)

// Config shapes a run.
type Config struct {
	// Gaps are the arrival gaps (Intervals); nil sends everything at once.
	// Requests that wait for another (After) take no gap.
	Gaps []time.Duration
	// MaxConcurrency bounds the requests in flight (0: no bound). A
	// request whose arrival finds the bound reached is sent when one
	// ends; its timings start when it is sent.
	MaxConcurrency int
	// After, when set, names for each request the earlier request (a
	// smaller index) that must end before it arrives, -1 for none: a
	// conversation's next turn follows its previous one. Such a request
	// arrives Think after that one ends, whether it succeeded or not.
	After []int
	// Think is the user's pause between a turn's end and the next turn.
	Think time.Duration
	// Clock defaults to RealClock.
	Clock Clock
	// Progress, when set, is called after each request ends with the
	// numbers ended and failed so far (from one goroutine at a time).
	Progress func(done, failed int)
}

// Run sends n requests with do and returns one Sample per request sent, in
// request order (Sample.Index says which), the moment the first was sent
// and the moment the last ended. When ctx ends no more are sent, those in
// flight are cancelled, and the samples of the requests sent so far are
// returned with ctx's error.
func Run(ctx context.Context, cfg Config, n int, do Do) (samples []measure.Sample, start, end time.Time, err error) {
	clock := cfg.Clock
	if clock == nil {
		clock = RealClock{}
	}
	if len(cfg.After) != 0 && len(cfg.After) != n {
		return nil, start, end, fmt.Errorf("load: %d dependencies for %d requests", len(cfg.After), n)
	}
	for i, j := range cfg.After {
		if j >= i {
			return nil, start, end, fmt.Errorf("load: request %d waits for request %d, not an earlier one", i, j)
		}
	}
	samples = make([]measure.Sample, n)
	sent := make([]bool, n)
	ended := make([]chan struct{}, n) // closed when request i ends or is never sent
	for i := range ended {
		ended[i] = make(chan struct{})
	}
	var slots chan struct{}
	if cfg.MaxConcurrency > 0 {
		slots = make(chan struct{}, cfg.MaxConcurrency)
	}
	var (
		wg           sync.WaitGroup
		mu           sync.Mutex // guards done, failed, end, sent and Progress calls
		done, failed int
		arrival      time.Time
		first        = true
	)
	// send runs request i once it may go: it takes a slot, then runs on
	// its own goroutine. It reports false (and sends nothing) when ctx
	// ended first.
	send := func(i int) bool {
		if slots != nil {
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				return false
			}
		}
		s := &samples[i]
		s.Index = i
		s.Start = clock.Now()
		mu.Lock()
		sent[i] = true
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer close(ended[i])
			in, out, rerr := do(ctx, i, func(tokens int) {
				s.Chunks = append(s.Chunks, measure.Chunk{At: clock.Now(), Tokens: tokens})
			})
			s.End = clock.Now()
			s.InputTokens, s.OutputTokens = in, out
			if rerr != nil {
				s.Err = rerr.Error()
				s.Cancelled = errors.Is(rerr, measure.ErrCancelled)
			}
			// Count the request before freeing its slot, so that the
			// request taking the slot is counted after it and progress
			// reports completions in order.
			mu.Lock()
			done++
			if !s.OK() && !s.Cancelled {
				failed++
			}
			if s.End.After(end) {
				end = s.End
			}
			if cfg.Progress != nil {
				cfg.Progress(done, failed)
			}
			mu.Unlock()
			if slots != nil {
				<-slots
			}
		}()
		return true
	}
	for i := range n {
		if len(cfg.After) > 0 && cfg.After[i] >= 0 {
			// A later turn: it arrives Think after its previous turn.
			wg.Add(1)
			go func() {
				defer wg.Done()
				select {
				case <-ended[cfg.After[i]]:
				case <-ctx.Done():
					close(ended[i])
					return
				}
				if clock.Sleep(ctx, cfg.Think) != nil || !send(i) {
					close(ended[i])
				}
			}()
			continue
		}
		if first {
			arrival, first = clock.Now(), false
		}
		if i < len(cfg.Gaps) {
			arrival = arrival.Add(cfg.Gaps[i])
		}
		if err = clock.Sleep(ctx, arrival.Sub(clock.Now())); err != nil || !send(i) {
			if err == nil {
				err = ctx.Err()
			}
			// Nothing after this arrives; later turns waiting for an
			// unsent request see it ended.
			for j := i; j < n; j++ {
				if len(cfg.After) == 0 || cfg.After[j] < 0 {
					close(ended[j])
				}
			}
			break
		}
	}
	wg.Wait()
	if err == nil && slices.Contains(sent, false) {
		// Only an ended ctx keeps a later turn from being sent.
		err = ctx.Err()
	}
	out := samples[:0]
	for i := range samples {
		if sent[i] {
			if len(out) == 0 || samples[i].Start.Before(start) {
				start = samples[i].Start
			}
			out = append(out, samples[i])
		}
	}
	return out, start, end, err
}
