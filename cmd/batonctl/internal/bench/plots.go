package bench

import (
	"math"
	"path/filepath"
	"strings"

	"github.com/baton-serving/baton/cmd/batonctl/internal/bench/charts"
)

// sweepAxis says what a set of reports sweeps: the request rate, the
// concurrency bound, or neither.
type sweepAxis int

const (
	noSweep sweepAxis = iota
	rateSweep
	concurrencySweep
)

func distinct[T comparable](reps []*Report, f func(*RunRep) T) bool {
	for _, r := range reps {
		for i := range r.Runs {
			if f(&r.Runs[i]) != f(&r.Runs[0]) {
				return true
			}
		}
	}
	return false
}

func runRate(run *RunRep) float64 {
	if run.RequestRate == nil {
		return math.Inf(1)
	}
	return *run.RequestRate
}

func runConcurrency(run *RunRep) float64 {
	if run.MaxConcurrency == 0 {
		return math.Inf(1)
	}
	return float64(run.MaxConcurrency)
}

// writeCharts draws the reports' charts into dir and returns the files
// written: latency CDFs always, and figures against the request rate (or
// the concurrency) when the reports sweep it. Several reports overlay, one
// line each (per run for the CDFs).
func writeCharts(dir string, reps []*Report) ([]string, error) {
	axis := noSweep
	byConcurrency := distinct(reps, func(r *RunRep) int { return r.MaxConcurrency })
	switch {
	case distinct(reps, runRate):
		axis = rateSweep
	case byConcurrency:
		axis = concurrencySweep
	}
	manyRuns := false
	for _, r := range reps {
		manyRuns = manyRuns || len(r.Runs) > 1
	}
	name := func(r *Report, run *RunRep) string {
		var parts []string
		if len(reps) > 1 || !manyRuns {
			parts = append(parts, r.Label)
		}
		if manyRuns || len(reps) == 1 {
			parts = append(parts, "rate "+run.RateLabel)
			if byConcurrency {
				parts = append(parts, "concurrency "+concurrencyLabel(run.MaxConcurrency))
			}
		}
		return strings.Join(parts, ", ")
	}
	files, err := writeCDFs(dir, reps, name)
	if err != nil || axis == noSweep {
		return files, err
	}
	xLabel, suffix, xOf := "offered request rate (requests/s)", "_vs_rate.png", runRate
	if axis == concurrencySweep {
		xLabel, suffix, xOf = "concurrency (requests in flight)", "_vs_concurrency.png", runConcurrency
	}
	slo := false
	for _, r := range reps {
		slo = slo || r.SLO != ""
	}
	lines := []struct {
		file, title, y string
		value          func(*RunRep) float64
		needSLO        bool
	}{
		{"output_throughput", "Output token throughput", "tokens/s", func(r *RunRep) float64 { return r.OutputThroughput }, false},
		{"request_throughput", "Request throughput", "requests/s", func(r *RunRep) float64 { return r.RequestThroughput }, false},
		{"ttft_p99", "p99 time to first token", "milliseconds", func(r *RunRep) float64 { return r.TTFT.P99 }, false},
		{"tpot_median", "Median time per output token", "milliseconds", func(r *RunRep) float64 { return r.TPOT.Median }, false},
		{"goodput", "Goodput", "requests/s meeting the SLO", func(r *RunRep) float64 { return r.Goodput }, true},
	}
	for _, l := range lines {
		if l.needSLO && !slo {
			continue
		}
		// One curve per report, and per concurrency bound when a rate
		// sweep also varies it.
		var curves []charts.Curve
		for _, r := range reps {
			if l.needSLO && r.SLO == "" {
				continue
			}
			index := map[int]int{}
			for i := range r.Runs {
				run := &r.Runs[i]
				if run.Completed == 0 {
					continue
				}
				key := 0
				if axis == rateSweep {
					key = run.MaxConcurrency
				}
				k, ok := index[key]
				if !ok {
					label := r.Label
					if axis == rateSweep && byConcurrency {
						label += ", concurrency " + concurrencyLabel(key)
					}
					if l.needSLO {
						label += " [" + r.SLO + "]"
					}
					k = len(curves)
					index[key] = k
					curves = append(curves, charts.Curve{Label: label})
				}
				curves[k].Points = append(curves[k].Points, charts.Point{X: xOf(run), Y: l.value(run)})
			}
		}
		path := filepath.Join(dir, l.file+suffix)
		if err := charts.Sweep(path, l.title, xLabel, l.y, curves); err != nil {
			return files, err
		}
		files = append(files, path)
	}
	return files, nil
}

func writeCDFs(dir string, reps []*Report, name func(*Report, *RunRep) string) ([]string, error) {
	var files []string
	cdfs := []struct {
		file, title, y string
		values         func(*RunRep) []float64
	}{
		{"ttft_cdf.png", "Time to first token", "fraction of requests", func(run *RunRep) []float64 {
			return collect(run, func(q *RequestRep) []float64 { return opt(q.TTFTMS) })
		}},
		{"tpot_cdf.png", "Time per output token", "fraction of requests", func(run *RunRep) []float64 {
			return collect(run, func(q *RequestRep) []float64 { return opt(q.TPOTMS) })
		}},
		{"itl_cdf.png", "Inter-token latency", "fraction of gaps", func(run *RunRep) []float64 {
			return collect(run, func(q *RequestRep) []float64 { return q.ITLMS })
		}},
		{"e2e_cdf.png", "End-to-end latency", "fraction of requests", func(run *RunRep) []float64 {
			return collect(run, func(q *RequestRep) []float64 {
				if q.TTFTMS == nil {
					return nil
				}
				return []float64{q.E2EMS}
			})
		}},
	}
	for _, c := range cdfs {
		var series []charts.Series
		for _, r := range reps {
			for i := range r.Runs {
				if vs := c.values(&r.Runs[i]); len(vs) > 0 {
					series = append(series, charts.Series{Label: name(r, &r.Runs[i]), Values: vs})
				}
			}
		}
		if len(series) == 0 {
			continue // e.g. no TPOT when every output was one token
		}
		path := filepath.Join(dir, c.file)
		if err := charts.CDF(path, c.title, "milliseconds", c.y, series); err != nil {
			return files, err
		}
		files = append(files, path)
	}
	return files, nil
}

func collect(run *RunRep, f func(*RequestRep) []float64) []float64 {
	var out []float64
	for i := range run.Requests {
		out = append(out, f(&run.Requests[i])...)
	}
	return out
}

func opt(p *float64) []float64 {
	if p == nil {
		return nil
	}
	return []float64{*p}
}
