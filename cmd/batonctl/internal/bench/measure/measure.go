// Package measure turns the timestamps a benchmark client records for each
// request into the figures serving benchmarks report: time to first token
// (TTFT), time per output token (TPOT), inter-token latencies (ITL),
// end-to-end latency (E2E), throughputs and goodput.
//
// The arithmetic is exact: durations are integer nanoseconds, every derived
// value (means, interpolated percentiles, rates) is computed as a rational
// number and rounded to float64 once, at the end. A figure is therefore the
// float64 nearest to its mathematical value, and tests can compare it with a
// hand-computed constant for equality.
package measure

import (
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strings"
	"time"
)

// Chunk is one streamed response event that carried output.
type Chunk struct {
	// At is when the client received it.
	At time.Time
	// Tokens is the number of output tokens the chunk carries, or 0 when
	// the API does not say (an OpenAI text chunk): it then counts as one
	// gap in the inter-token latencies.
	Tokens int
}

// Sample is one request as the client saw it.
type Sample struct {
	// Index is the request's position in the run's list.
	Index int
	// Start is when the request was sent; End when its stream ended.
	Start, End time.Time
	// Chunks are the events that carried output, in arrival order.
	Chunks []Chunk
	// InputTokens and OutputTokens are the prompt's and the completion's
	// lengths in tokens.
	InputTokens, OutputTokens int
	// Err is why the request failed; "" for a request that completed.
	Err string
	// Cancelled marks a request the bench cancelled on purpose
	// (--cancel-fraction) before it ended: neither completed nor failed.
	Cancelled bool
}

// ErrCancelled is the cause of a request the bench cancelled on purpose.
var ErrCancelled = errors.New("cancelled by the bench (--cancel-fraction)")

// OK reports whether the request completed with at least one output chunk.
func (s *Sample) OK() bool { return s.Err == "" && len(s.Chunks) > 0 }

// ns is a duration in nanoseconds as an exact rational.
func ns(d time.Duration) *big.Rat { return new(big.Rat).SetInt64(int64(d)) }

// TTFT is the time from sending the request to its first output chunk.
func (s *Sample) TTFT() time.Duration { return s.Chunks[0].At.Sub(s.Start) }

// E2E is the time from sending the request to the end of its stream.
func (s *Sample) E2E() time.Duration { return s.End.Sub(s.Start) }

// tpot is the mean time per output token after the first, in nanoseconds:
// (last chunk − first chunk) / (output tokens − 1). ok is false for a
// request with fewer than two output tokens, which has no TPOT.
func (s *Sample) tpot() (r *big.Rat, ok bool) {
	if s.OutputTokens < 2 {
		return nil, false
	}
	span := s.Chunks[len(s.Chunks)-1].At.Sub(s.Chunks[0].At)
	return new(big.Rat).SetFrac64(int64(span), int64(s.OutputTokens-1)), true
}

// TPOT is tpot in float64 milliseconds; ok as tpot's.
func (s *Sample) TPOT() (ms float64, ok bool) {
	r, ok := s.tpot()
	if !ok {
		return 0, false
	}
	return toMS(r), true
}

// itl appends the inter-token latencies of the request in nanoseconds: for
// each chunk after the first, the gap since the previous chunk, split
// evenly over the tokens it carries (a chunk of k tokens yields k entries
// of gap/k, so the entries of a fully counted stream add up to the time from
// first to last chunk).
func (s *Sample) itl(out []*big.Rat) []*big.Rat {
	for i := 1; i < len(s.Chunks); i++ {
		gap := int64(s.Chunks[i].At.Sub(s.Chunks[i-1].At))
		k := max(s.Chunks[i].Tokens, 1)
		for range k {
			out = append(out, new(big.Rat).SetFrac64(gap, int64(k)))
		}
	}
	return out
}

// ITL returns the request's inter-token latencies in milliseconds.
func (s *Sample) ITL() []float64 {
	rs := s.itl(nil)
	out := make([]float64, len(rs))
	for i, r := range rs {
		out[i] = toMS(r)
	}
	return out
}

var nsPerMS = big.NewRat(1_000_000, 1)

// toMS converts nanoseconds to float64 milliseconds, rounding once.
func toMS(r *big.Rat) float64 {
	f, _ := new(big.Rat).Quo(r, nsPerMS).Float64()
	return f
}

// SLO is a service-level objective per request; a zero field is not checked.
type SLO struct {
	TTFT, TPOT, E2E time.Duration
}

// IsZero reports whether no objective is set.
func (o SLO) IsZero() bool { return o == SLO{} }

// ParseSLO reads "ttft:MS,tpot:MS,e2e:MS" (any subset, milliseconds, decimals
// allowed) as vLLM's --goodput and sglang's SLO options spell them.
func ParseSLO(s string) (SLO, error) {
	var o SLO
	if strings.TrimSpace(s) == "" {
		return o, nil
	}
	for _, part := range strings.Split(s, ",") {
		name, val, ok := strings.Cut(strings.TrimSpace(part), ":")
		if !ok {
			return SLO{}, fmt.Errorf("%q: want NAME:MILLISECONDS (ttft, tpot or e2e)", part)
		}
		r, ok := new(big.Rat).SetString(strings.TrimSpace(val))
		if !ok || r.Sign() <= 0 {
			return SLO{}, fmt.Errorf("%q: %q is not a positive number of milliseconds", part, val)
		}
		r.Mul(r, nsPerMS)
		if !r.IsInt() || !r.Num().IsInt64() {
			return SLO{}, fmt.Errorf("%q: not a whole number of nanoseconds within range", part)
		}
		d := time.Duration(r.Num().Int64())
		switch strings.ToLower(strings.TrimSpace(name)) {
		case "ttft":
			o.TTFT = d
		case "tpot":
			o.TPOT = d
		case "e2e", "e2el":
			o.E2E = d
		default:
			return SLO{}, fmt.Errorf("%q: unknown objective %q (want ttft, tpot or e2e)", part, name)
		}
	}
	return o, nil
}

// String is the SLO in ParseSLO's syntax.
func (o SLO) String() string {
	var parts []string
	add := func(name string, d time.Duration) {
		if d > 0 {
			parts = append(parts, fmt.Sprintf("%s:%g", name, toMS(ns(d))))
		}
	}
	add("ttft", o.TTFT)
	add("tpot", o.TPOT)
	add("e2e", o.E2E)
	return strings.Join(parts, ",")
}

// Met reports whether a completed request meets every objective. A request
// with a single output token has no TPOT and meets a TPOT objective.
func (o SLO) Met(s *Sample) bool {
	if o.TTFT > 0 && s.TTFT() > o.TTFT {
		return false
	}
	if o.E2E > 0 && s.E2E() > o.E2E {
		return false
	}
	if o.TPOT > 0 {
		if t, ok := s.tpot(); ok && t.Cmp(ns(o.TPOT)) > 0 {
			return false
		}
	}
	return true
}

// Dist summarises a distribution of latencies in milliseconds. Percentiles
// interpolate linearly between the two nearest ranks (numpy's default), the
// convention of vLLM's and sglang's benchmarks.
type Dist struct {
	N      int     `json:"count"`
	Mean   float64 `json:"mean_ms"`
	Median float64 `json:"median_ms"`
	P90    float64 `json:"p90_ms"`
	P99    float64 `json:"p99_ms"`
	Min    float64 `json:"min_ms"`
	Max    float64 `json:"max_ms"`
}

// distOf summarises values given in nanoseconds; it sorts them.
func distOf(vs []*big.Rat) Dist {
	if len(vs) == 0 {
		return Dist{}
	}
	slices.SortFunc(vs, func(a, b *big.Rat) int { return a.Cmp(b) })
	sum := new(big.Rat)
	for _, v := range vs {
		sum.Add(sum, v)
	}
	return Dist{
		N:      len(vs),
		Mean:   toMS(sum.Quo(sum, big.NewRat(int64(len(vs)), 1))),
		Median: toMS(percentile(vs, 50)),
		P90:    toMS(percentile(vs, 90)),
		P99:    toMS(percentile(vs, 99)),
		Min:    toMS(vs[0]),
		Max:    toMS(vs[len(vs)-1]),
	}
}

// percentile interpolates the p-th percentile (p in 0-100) of sorted vs at
// rank p·(n−1)/100, exactly.
func percentile(sorted []*big.Rat, p int64) *big.Rat {
	num := p * int64(len(sorted)-1)
	lo, rem := num/100, num%100
	v := new(big.Rat).Set(sorted[lo])
	if rem == 0 {
		return v
	}
	step := new(big.Rat).Sub(sorted[lo+1], sorted[lo])
	step.Mul(step, big.NewRat(rem, 100))
	return v.Add(v, step)
}

// ErrorCount is how many requests failed with one message.
type ErrorCount struct {
	Message string `json:"message"`
	Count   int    `json:"count"`
}

// Summary is a benchmark run's figures. Throughputs are per second of the
// run's duration: from its first request sent to its last request ended.
type Summary struct {
	Completed int `json:"completed"`
	Failed    int `json:"failed"`
	// Cancelled are the requests the bench cancelled on purpose before
	// they ended (--cancel-fraction); they count nowhere else.
	Cancelled       int          `json:"cancelled"`
	Errors          []ErrorCount `json:"errors"`
	DurationSeconds float64      `json:"duration_s"`
	InputTokens     int          `json:"total_input_tokens"`
	OutputTokens    int          `json:"total_output_tokens"`
	// RequestThroughput is completed requests per second.
	RequestThroughput float64 `json:"request_throughput"`
	InputThroughput   float64 `json:"input_throughput"`
	OutputThroughput  float64 `json:"output_throughput"`
	TotalThroughput   float64 `json:"total_token_throughput"`
	// Concurrency is the mean number of requests in flight: the sum of
	// the completed requests' E2E over the duration.
	Concurrency float64 `json:"mean_concurrency"`
	TTFT        Dist    `json:"ttft"`
	TPOT        Dist    `json:"tpot"`
	ITL         Dist    `json:"itl"`
	E2E         Dist    `json:"e2e"`
	// Good is the number of completed requests meeting the SLO, Goodput
	// those per second; both 0 with no SLO.
	Good    int     `json:"good_requests"`
	Goodput float64 `json:"goodput"`
}

// Summarize computes the figures of samples, run from start to end, with
// goodput under slo. Failed requests count in Failed and Errors only,
// cancelled ones in Cancelled only.
func Summarize(samples []Sample, start, end time.Time, slo SLO) Summary {
	var (
		sum                     = Summary{Errors: []ErrorCount{}}
		ttft, tpot, itl, e2e    []*big.Rat
		errs                    = map[string]int{}
		inTokens, outTokens, e2 int64
	)
	for i := range samples {
		s := &samples[i]
		if s.Cancelled {
			sum.Cancelled++
			continue
		}
		if !s.OK() {
			sum.Failed++
			msg := s.Err
			if msg == "" {
				msg = "stream ended without output"
			}
			errs[msg]++
			continue
		}
		sum.Completed++
		inTokens += int64(s.InputTokens)
		outTokens += int64(s.OutputTokens)
		ttft = append(ttft, ns(s.TTFT()))
		e2e = append(e2e, ns(s.E2E()))
		e2 += int64(s.E2E())
		if t, ok := s.tpot(); ok {
			tpot = append(tpot, t)
		}
		itl = s.itl(itl)
		if !slo.IsZero() && slo.Met(s) {
			sum.Good++
		}
	}
	for msg, n := range errs {
		sum.Errors = append(sum.Errors, ErrorCount{msg, n})
	}
	slices.SortFunc(sum.Errors, func(a, b ErrorCount) int {
		if a.Count != b.Count {
			return b.Count - a.Count
		}
		return strings.Compare(a.Message, b.Message)
	})
	sum.InputTokens, sum.OutputTokens = int(inTokens), int(outTokens)
	dur := end.Sub(start)
	sum.DurationSeconds, _ = new(big.Rat).SetFrac64(int64(dur), int64(time.Second)).Float64()
	if dur > 0 {
		perSecond := func(n int64) float64 {
			num := new(big.Int).Mul(big.NewInt(n), big.NewInt(int64(time.Second)))
			f, _ := new(big.Rat).SetFrac(num, big.NewInt(int64(dur))).Float64()
			return f
		}
		sum.RequestThroughput = perSecond(int64(sum.Completed))
		sum.InputThroughput = perSecond(inTokens)
		sum.OutputThroughput = perSecond(outTokens)
		sum.TotalThroughput = perSecond(inTokens + outTokens)
		sum.Goodput = perSecond(int64(sum.Good))
		sum.Concurrency, _ = new(big.Rat).SetFrac64(e2, int64(dur)).Float64()
	}
	sum.TTFT, sum.TPOT, sum.ITL, sum.E2E = distOf(ttft), distOf(tpot), distOf(itl), distOf(e2e)
	return sum
}
