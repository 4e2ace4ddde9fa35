package workers

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// The plug-ins work on a pick's whole list of workers at once, so that a
// pick costs one call per plug-in rather than one per plug-in and worker:
// a pick over a hundred workers stays within a few microseconds.

// Filter rules workers out of one pick. It must be safe for concurrent use.
type Filter interface {
	// Name says, in a few words, what a worker it drops lacks ("ready",
	// "below its in-flight limit"); errors and /debug output show it.
	Name() string
	// Filter returns the workers of ws that may take the request, in
	// their order. It may reuse ws's array (the pick's own copy) and must
	// not keep it.
	Filter(ws []*Worker) []*Worker
}

// NewFilter makes a Filter of a predicate called once per worker.
func NewFilter(name string, keep func(*Worker) bool) Filter { return filterFunc{name, keep} }

type filterFunc struct {
	name string
	keep func(*Worker) bool
}

func (f filterFunc) Name() string { return f.name }

func (f filterFunc) Filter(ws []*Worker) []*Worker {
	return slices.DeleteFunc(ws, func(w *Worker) bool { return !f.keep(w) })
}

// Scorer rates the workers that passed the filters, from 0 (least
// desirable) to 1 (most desirable). Scores outside [0, 1] are clamped.
type Scorer interface {
	Name() string
	// Score sets scores[i] to the score of ws[i] for the request q
	// (nil when the pick has no request, as in tests of load alone);
	// len(scores) == len(ws).
	Score(q *Query, ws []*Worker, scores []float64)
}

// WeightedScorer is a Scorer and its weight (> 0) in a policy.
type WeightedScorer struct {
	Scorer
	Weight float64
}

// Candidate is a worker that passed every filter, with its policy score: the
// weighted mean of its scorers' scores, in [0, 1] (0 when the policy has no
// scorers).
type Candidate struct {
	Worker *Worker
	Score  float64
}

// Picker chooses one of the candidates (never an empty list) and returns its
// index.
type Picker interface {
	Name() string
	Pick(c []Candidate) int
}

// Policy chooses a worker: filters, then scorers, then the picker.
type Policy struct {
	Name    string
	Scorers []WeightedScorer
	Picker  Picker
}

// PolicyNames lists the built-in policies, for flags' help.
var PolicyNames = []string{"round-robin", "least-load", "power-of-two", "cache-aware"}

// NewPolicy returns a built-in policy:
//
//   - round-robin: every candidate in turn, load ignored;
//   - least-load: the candidate with the least work (LoadScorer), ties taken
//     in turn so that an idle fleet is used evenly;
//   - power-of-two: the less loaded of two candidates drawn at random, which
//     spreads load nearly as well as least-load without every router
//     replica sending its next request to the same worker;
//   - cache-aware: the candidate with the best blend of prefix overlap and
//     load, (CacheAwareWeight·overlap + load)/(CacheAwareWeight+1), where
//     overlap is CacheScorer's share of the prompt's reusable pages the
//     worker holds and load LoadScorer's 1/(1+work) — llm-d's
//     precise-prefix-cache scorer beside its load scorer. Among workers
//     holding as much of the prompt, the less loaded wins; a worker more
//     than CacheAwareMaxImbalance busier than the least loaded one is
//     scored by load alone (see docs/prefix-cache.md).
func NewPolicy(name string) (*Policy, error) {
	load := []WeightedScorer{{LoadScorer{}, 1}}
	switch name {
	case "round-robin":
		return &Policy{Name: name, Picker: &RoundRobin{}}, nil
	case "least-load":
		return &Policy{Name: name, Scorers: load, Picker: &MaxScore{}}, nil
	case "power-of-two":
		return &Policy{Name: name, Scorers: load, Picker: PowerOfTwo{}}, nil
	case "cache-aware":
		return &Policy{Name: name, Scorers: []WeightedScorer{{CacheScorer{}, CacheAwareWeight}, {LoadScorer{}, 1}}, Picker: &MaxScore{}}, nil
	}
	return nil, fmt.Errorf("policy %q: want one of %s", name, strings.Join(PolicyNames, ", "))
}

// CacheAwareWeight is the prefix overlap's weight against load's (1) in
// the cache-aware policy. Within CacheAwareMaxImbalance of the least
// loaded candidate, holding the prompt counts for more than load: a worker
// with the whole prompt and 3 requests scores (2+1/4)/3 = 0.75 against an
// idle stranger's 1/3.
const CacheAwareWeight = 2

// scratch is a pick's working memory, pooled: a pick allocates nothing for
// its lists in the steady state.
type scratch struct {
	ws     []*Worker
	scores []float64
	tmp    []float64
	cands  []Candidate
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// Pick returns the chosen worker among ws for the request q (nil: none
// known), or nil and why each worker was ruled out. filters run in order;
// a worker's reason is the first filter that dropped it.
func (p *Policy) Pick(q *Query, ws []*Worker, filters []Filter) (*Worker, Rejections) {
	sc := scratchPool.Get().(*scratch)
	defer func() {
		clear(sc.ws[:cap(sc.ws)]) // drop the pointers before pooling
		clear(sc.cands[:cap(sc.cands)])
		scratchPool.Put(sc)
	}()
	c := append(sc.ws[:0], ws...)
	for _, f := range filters {
		if len(c) == 0 {
			break
		}
		c = f.Filter(c)
	}
	if len(c) == 0 {
		return nil, reject(ws, filters)
	}
	sc.ws = c
	n := len(c)
	scores := resize(&sc.scores, n)
	clear(scores)
	var total float64
	for _, s := range p.Scorers {
		total += s.Weight
	}
	switch {
	case total <= 0:
	case len(p.Scorers) == 1:
		// A weighted mean of one score is the score.
		p.Scorers[0].Score(q, c, scores)
		for i, x := range scores {
			scores[i] = clamp01(x)
		}
	default:
		tmp := resize(&sc.tmp, n)
		for _, s := range p.Scorers {
			clear(tmp)
			s.Score(q, c, tmp)
			w := s.Weight / total
			for i, x := range tmp {
				scores[i] += w * clamp01(x)
			}
		}
	}
	cands := sc.cands[:0]
	for i, w := range c {
		cands = append(cands, Candidate{w, scores[i]})
	}
	sc.cands = cands
	return cands[p.Picker.Pick(cands)].Worker, nil
}

// resize makes *s n long, reusing its array when it can.
func resize(s *[]float64, n int) []float64 {
	if cap(*s) < n {
		*s = make([]float64, n)
	}
	*s = (*s)[:n]
	return *s
}

func clamp01(x float64) float64 {
	switch {
	case x > 1:
		return 1
	case x >= 0:
		return x
	}
	return 0 // negative or NaN
}

// Rejection is a worker a pick ruled out and the filter that did.
type Rejection struct {
	Worker *Worker
	Filter string
}

// Rejections are the reasons a pick found no candidate, one per worker.
type Rejections []Rejection

// reject says, for each worker, the first filter that drops it. It runs
// only when a pick fails, so it may take its time.
func reject(ws []*Worker, filters []Filter) Rejections {
	out := make(Rejections, 0, len(ws))
	for _, w := range ws {
		for _, f := range filters {
			if len(f.Filter([]*Worker{w})) == 0 {
				out = append(out, Rejection{w, f.Name()})
				break
			}
		}
	}
	return out
}

// Only reports whether every worker was dropped by the filter named name,
// and there was at least one.
func (r Rejections) Only(name string) bool {
	for _, x := range r {
		if x.Filter != name {
			return false
		}
	}
	return len(r) > 0
}

// Any reports whether some worker was dropped by the filter named name.
func (r Rejections) Any(name string) bool {
	for _, x := range r {
		if x.Filter == name {
			return true
		}
	}
	return false
}

// String lists the workers and reasons, with a worker's last error where it
// explains more.
func (r Rejections) String() string {
	if len(r) == 0 {
		return "no workers"
	}
	parts := make([]string, 0, len(r))
	for _, x := range r {
		s := x.Worker.Addr + ": not " + x.Filter
		if e := x.Worker.Excluded(); e != "" {
			s += " (excluded: " + e + ")"
		} else if e := x.Worker.LastError(); e != "" && x.Filter == FilterReady {
			s += " (" + e + ")"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "; ")
}

// LoadScorer prefers the worker with the least work: 1/(1+load), where load
// is the requests it has queued, running or transferring by its last report
// — or the router's own in-flight count on it, if higher, since reports lag
// — plus the fraction of its KV cache in use (0-1, which breaks ties between
// equally busy workers). An idle worker with an empty cache scores 1.
type LoadScorer struct{}

// Name implements Scorer.
func (LoadScorer) Name() string { return "load" }

// Score implements Scorer.
func (LoadScorer) Score(_ *Query, ws []*Worker, scores []float64) {
	for i, w := range ws {
		scores[i] = 1 / (1 + Load(w))
	}
}

// Load is LoadScorer's measure of a worker's work: Requests plus the
// fraction of its KV cache in use.
func Load(w *Worker) float64 {
	return float64(Requests(w)) + math.Float64frombits(w.kvUse.Load())
}

// Requests is the requests a worker has queued, running or transferring by
// its last report, or the router's own in-flight count on it if higher.
func Requests(w *Worker) int64 {
	return max(w.work.Load(), w.inflight.Load())
}

// MaxScore picks the highest score. Among equal scores it takes each in
// turn, so that an idle fleet is used evenly rather than its first worker
// always.
type MaxScore struct{ next atomic.Uint64 }

// Name implements Picker.
func (*MaxScore) Name() string { return "max-score" }

// Pick implements Picker.
func (m *MaxScore) Pick(c []Candidate) int {
	n := len(c)
	start := int(m.next.Add(1) % uint64(n))
	best := start
	// From start round to start-1; the first of equal scores wins.
	for j := start + 1; j < n; j++ {
		if c[j].Score > c[best].Score {
			best = j
		}
	}
	for j := 0; j < start; j++ {
		if c[j].Score > c[best].Score {
			best = j
		}
	}
	return best
}

// RoundRobin picks the candidates in turn, ignoring scores.
type RoundRobin struct{ next atomic.Uint64 }

// Name implements Picker.
func (*RoundRobin) Name() string { return "round-robin" }

// Pick implements Picker.
func (r *RoundRobin) Pick(c []Candidate) int { return int((r.next.Add(1) - 1) % uint64(len(c))) }

// PowerOfTwo draws two distinct candidates at random and picks the one with
// the higher score (the first drawn on a tie).
type PowerOfTwo struct{}

// Name implements Picker.
func (PowerOfTwo) Name() string { return "power-of-two" }

// Pick implements Picker.
func (PowerOfTwo) Pick(c []Candidate) int {
	n := len(c)
	if n == 1 {
		return 0
	}
	a := rand.IntN(n)
	b := rand.IntN(n - 1)
	if b >= a {
		b++
	}
	if c[b].Score > c[a].Score {
		return b
	}
	return a
}
