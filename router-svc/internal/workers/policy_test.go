package workers

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
)

// fakeWorker is a worker whose load view is the given report, as if its
// WatchLoad stream had just sent it.
func fakeWorker(addr string, role batonv1.WorkerRole, l *batonv1.LoadReport) *Worker {
	w := newWorker(addr, role, nil)
	if l != nil {
		w.observe(l, time.Now())
	}
	return w
}

func decodeW(addr string, queued, running, used, total uint32) *Worker {
	return fakeWorker(addr, batonv1.WorkerRole_WORKER_ROLE_DECODE, &batonv1.LoadReport{
		Ready: true, QueuedRequests: queued, RunningRequests: running, PagesUsed: used, PagesTotal: total})
}

// fakeSet is a set holding ws, as if Run had found them.
func fakeSet(role batonv1.WorkerRole, ws ...*Worker) *Set {
	addrs := make(Static, len(ws))
	for i, w := range ws {
		addrs[i] = w.Addr
	}
	s := NewSet(Config{Role: role, Source: addrs, LoadInterval: time.Second})
	s.snap.Store(&ws)
	return s
}

func mustPolicy(t testing.TB, name string) *Policy {
	t.Helper()
	p, err := NewPolicy(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoad(t *testing.T) {
	for _, tc := range []struct {
		name     string
		report   *batonv1.LoadReport
		inflight int
		want     float64
	}{
		{"idle", &batonv1.LoadReport{Ready: true, PagesTotal: 100}, 0, 0},
		{"no report", nil, 0, 0},
		{"queue+running+transferring", &batonv1.LoadReport{QueuedRequests: 2, RunningRequests: 3, TransferringRequests: 1}, 0, 6},
		{"kv use breaks ties", &batonv1.LoadReport{RunningRequests: 1, PagesUsed: 25, PagesTotal: 100}, 0, 1.25},
		{"router in-flight wins over a lagging report", &batonv1.LoadReport{RunningRequests: 1}, 4, 4},
		{"report wins when higher", &batonv1.LoadReport{RunningRequests: 5}, 2, 5},
		{"kv use capped at 1", &batonv1.LoadReport{PagesUsed: 300, PagesTotal: 100}, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := fakeWorker("w", batonv1.WorkerRole_WORKER_ROLE_DECODE, tc.report)
			for range tc.inflight {
				if err := w.tryAcquire(0); err != nil {
					t.Fatal(err)
				}
			}
			if got := Load(w); math.Abs(got-tc.want) > 1e-9 {
				t.Errorf("Load = %v, want %v", got, tc.want)
			}
			scores := []float64{-1}
			LoadScorer{}.Score(nil, []*Worker{w}, scores)
			if s := scores[0]; s <= 0 || s > 1 || math.Abs(s-1/(1+tc.want)) > 1e-9 {
				t.Errorf("Score = %v, want 1/(1+%v) in (0, 1]", s, tc.want)
			}
		})
	}
}

func TestLeastLoad(t *testing.T) {
	a, b, c := decodeW("a", 2, 1, 0, 10), decodeW("b", 0, 1, 5, 10), decodeW("c", 0, 1, 1, 10)
	ll := mustPolicy(t, "least-load")
	ws := []*Worker{a, b, c}
	if got, _ := ll.Pick(nil, ws, nil); got != c {
		t.Errorf("picked %s, want c (least work, then least KV use)", got.Addr)
	}
	// The router's own in-flight count wins over a lagging report.
	for range 2 {
		if err := c.tryAcquire(0); err != nil {
			t.Fatal(err)
		}
	}
	if got, _ := ll.Pick(nil, ws, nil); got != b {
		t.Errorf("with c busy picked %s, want b", got.Addr)
	}
	c.release()
	if c.Inflight() != 1 {
		t.Errorf("inflight = %d, want 1", c.Inflight())
	}
	// Equal scores are taken in turn: an idle fleet is used evenly.
	idle := []*Worker{decodeW("x", 0, 0, 0, 10), decodeW("y", 0, 0, 0, 10), decodeW("z", 0, 0, 0, 10)}
	seen := map[string]int{}
	for range 30 {
		w, _ := ll.Pick(nil, idle, nil)
		seen[w.Addr]++
	}
	if seen["x"] != 10 || seen["y"] != 10 || seen["z"] != 10 {
		t.Errorf("ties spread %v, want 10 each", seen)
	}
}

func TestRoundRobin(t *testing.T) {
	ws := []*Worker{decodeW("a", 9, 9, 9, 10), decodeW("b", 0, 0, 0, 10), decodeW("c", 0, 0, 0, 10)}
	rr := mustPolicy(t, "round-robin")
	seen := map[string]int{}
	for range 6 {
		w, _ := rr.Pick(nil, ws, nil)
		seen[w.Addr]++
	}
	if seen["a"] != 2 || seen["b"] != 2 || seen["c"] != 2 {
		t.Errorf("round-robin spread %v, want 2 each (load ignored)", seen)
	}
}

func TestPowerOfTwo(t *testing.T) {
	p2 := mustPolicy(t, "power-of-two")
	// With two candidates both are drawn: the less loaded always wins.
	two := []*Worker{decodeW("busy", 5, 5, 0, 10), decodeW("idle", 0, 0, 0, 10)}
	for range 50 {
		if w, _ := p2.Pick(nil, two, nil); w.Addr != "idle" {
			t.Fatalf("picked %s of two, want idle", w.Addr)
		}
	}
	// The most loaded of several loses every draw it is in.
	var ws []*Worker
	for i := range 8 {
		ws = append(ws, decodeW(fmt.Sprint("w", i), uint32(i), 0, 0, 10))
	}
	seen := map[string]int{}
	for range 2000 {
		w, _ := p2.Pick(nil, ws, nil)
		seen[w.Addr]++
	}
	if seen["w7"] != 0 {
		t.Errorf("the most loaded worker was picked %d times", seen["w7"])
	}
	// The least loaded wins every draw it is in: 2/8 of them on average.
	if seen["w0"] < 350 || seen["w0"] <= seen["w6"] {
		t.Errorf("picks %v: the least loaded should be chosen most", seen)
	}
	if w, _ := p2.Pick(nil, ws[:1], nil); w != ws[0] {
		t.Error("one candidate not picked")
	}
}

// constScorer scores every worker the same, possibly out of range.
type constScorer float64

func (constScorer) Name() string { return "const" }

func (c constScorer) Score(_ *Query, _ []*Worker, scores []float64) {
	for i := range scores {
		scores[i] = float64(c)
	}
}

// recordPicker keeps the candidates it was offered.
type recordPicker struct{ got *[]Candidate }

func (recordPicker) Name() string             { return "record" }
func (r recordPicker) Pick(c []Candidate) int { *r.got = append((*r.got)[:0], c...); return 0 }

func TestScoresAreWeightedMeansInRange(t *testing.T) {
	var got []Candidate
	for _, tc := range []struct {
		scorers []WeightedScorer
		want    float64
	}{
		{nil, 0},
		{[]WeightedScorer{{constScorer(0.5), 1}}, 0.5},
		{[]WeightedScorer{{constScorer(7), 1}}, 1},
		{[]WeightedScorer{{constScorer(-3), 1}}, 0},
		{[]WeightedScorer{{constScorer(math.NaN()), 1}}, 0},
		{[]WeightedScorer{{constScorer(1), 3}, {constScorer(0), 1}}, 0.75},
	} {
		p := &Policy{Name: "t", Scorers: tc.scorers, Picker: recordPicker{&got}}
		p.Pick(nil, []*Worker{decodeW("a", 0, 0, 0, 1)}, nil)
		if len(got) != 1 || math.Abs(got[0].Score-tc.want) > 1e-9 {
			t.Errorf("scorers %v: candidates %v, want score %v", tc.scorers, got, tc.want)
		}
	}
}

func TestFiltersAndRejections(t *testing.T) {
	a, b, c := decodeW("a", 0, 0, 0, 1), decodeW("b", 0, 0, 0, 1), decodeW("c", 0, 0, 0, 1)
	c.setErr(errors.New("info: connection refused"))
	notA := NewFilter("b or c", func(w *Worker) bool { return w != a })
	ready := NewFilter(FilterReady, func(w *Worker) bool { return w.Load() != nil })
	notB := NewFilter("not b", func(w *Worker) bool { return w != b })
	ll := mustPolicy(t, "least-load")
	if w, _ := ll.Pick(nil, []*Worker{a, b, c}, []Filter{notA, ready}); w != b {
		t.Errorf("picked %v, want b", w)
	}
	w, rej := ll.Pick(nil, []*Worker{a, b, c}, []Filter{notA, ready, notB})
	if w != nil {
		t.Fatalf("picked %s, want none", w.Addr)
	}
	want := "a: not b or c; b: not not b; c: not ready (info: connection refused)"
	if rej.String() != want {
		t.Errorf("rejections %q, want %q", rej, want)
	}
	if !rej.Any(FilterReady) || rej.Only(FilterReady) || !(Rejections{{a, "x"}}).Only("x") || (Rejections{}).Only("x") {
		t.Error("Any/Only")
	}
	if w, rej := ll.Pick(nil, nil, nil); w != nil || len(rej) != 0 {
		t.Error("pick from no workers")
	}
	for _, name := range PolicyNames {
		if p := mustPolicy(t, name); p.Name != name {
			t.Errorf("policy %q named %q", name, p.Name)
		}
	}
	if _, err := NewPolicy("random"); err == nil || !strings.Contains(err.Error(), "least-load") {
		t.Errorf("unknown policy: %v", err)
	}
}
