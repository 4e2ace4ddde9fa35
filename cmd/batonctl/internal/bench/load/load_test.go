package load

import (
	"context"
	"errors"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/baton-serving/baton/cmd/batonctl/internal/bench/load/loadtest"
)

func TestRunRecordsTimings(t *testing.T) {
	clock := loadtest.NewClock(time.Unix(1000, 0))
	t0 := clock.Now()
	ms := time.Millisecond
	do := func(_ context.Context, i int, chunk func(int)) (int, int, error) {
		clock.Advance(100 * ms)
		chunk(1)
		clock.Advance(30 * ms)
		chunk(2)
		clock.Advance(5 * ms)
		if i == 1 {
			return 0, 0, errors.New("boom")
		}
		return 10 + i, 3, nil
	}
	var progress []int
	samples, start, end, err := Run(context.Background(), Config{MaxConcurrency: 1, Clock: clock,
		Progress: func(done, failed int) { progress = append(progress, done*10+failed) }}, 3, do)
	if err != nil {
		t.Fatal(err)
	}
	if len(samples) != 3 || !start.Equal(t0) || !end.Equal(t0.Add(405*ms)) {
		t.Fatalf("%d samples from %v to %v", len(samples), start.Sub(t0), end.Sub(t0))
	}
	for i, s := range samples {
		base := t0.Add(time.Duration(i) * 135 * ms)
		if !s.Start.Equal(base) || !s.End.Equal(base.Add(135*ms)) || len(s.Chunks) != 2 ||
			!s.Chunks[0].At.Equal(base.Add(100*ms)) || s.Chunks[0].Tokens != 1 ||
			!s.Chunks[1].At.Equal(base.Add(130*ms)) || s.Chunks[1].Tokens != 2 {
			t.Errorf("sample %d: %+v", i, s)
		}
	}
	if samples[0].InputTokens != 10 || samples[0].OutputTokens != 3 || samples[2].InputTokens != 12 {
		t.Errorf("token counts %+v", samples)
	}
	if samples[1].Err != "boom" || samples[1].OK() {
		t.Errorf("failed request recorded as %+v", samples[1])
	}
	if want := []int{10, 21, 31}; len(progress) != 3 || progress[0] != want[0] || progress[1] != want[1] || progress[2] != want[2] {
		t.Errorf("progress calls %v, want %v (done*10+failed)", progress, want)
	}
}

func TestRunFollowsArrivals(t *testing.T) {
	clock := loadtest.NewClock(time.Unix(1000, 0))
	t0 := clock.Now()
	gaps := []time.Duration{10 * time.Millisecond, 20 * time.Millisecond, 30 * time.Millisecond}
	samples, start, _, err := Run(context.Background(), Config{Gaps: gaps, Clock: clock}, 3,
		func(context.Context, int, func(int)) (int, int, error) { return 1, 1, nil })
	if err != nil {
		t.Fatal(err)
	}
	if !start.Equal(t0.Add(10 * time.Millisecond)) {
		t.Errorf("start %v after t0, want 10ms", start.Sub(t0))
	}
	for i, want := range []time.Duration{10, 30, 60} {
		if got := samples[i].Start.Sub(t0); got != want*time.Millisecond {
			t.Errorf("request %d sent at %v, want %v", i, got, want*time.Millisecond)
		}
	}
}

func TestRunBoundsConcurrency(t *testing.T) {
	var inFlight, peak atomic.Int32
	samples, _, _, err := Run(context.Background(), Config{MaxConcurrency: 3}, 20,
		func(context.Context, int, func(int)) (int, int, error) {
			n := inFlight.Add(1)
			for {
				p := peak.Load()
				if n <= p || peak.CompareAndSwap(p, n) {
					break
				}
			}
			time.Sleep(2 * time.Millisecond)
			inFlight.Add(-1)
			return 1, 1, nil
		})
	if err != nil || len(samples) != 20 {
		t.Fatalf("%d samples, %v", len(samples), err)
	}
	if p := peak.Load(); p != 3 {
		t.Errorf("peak concurrency %d, want 3", p)
	}
}

func TestRunCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	gaps := []time.Duration{0, 0, time.Hour, 0}
	samples, _, _, err := Run(ctx, Config{Gaps: gaps}, 4, func(ctx context.Context, i int, _ func(int)) (int, int, error) {
		if i == 1 {
			cancel()
		}
		<-ctx.Done()
		return 0, 0, ctx.Err()
	})
	if !errors.Is(err, context.Canceled) || len(samples) != 2 {
		t.Fatalf("%d samples, error %v; want 2 and context.Canceled", len(samples), err)
	}
	for _, s := range samples {
		if s.OK() {
			t.Errorf("cancelled request recorded as completed: %+v", s)
		}
	}
}

func TestIntervals(t *testing.T) {
	if gaps := Intervals(5, math.Inf(1), 1, 1); len(gaps) != 5 || gaps[0] != 0 || gaps[4] != 0 {
		t.Errorf("infinite rate: %v", gaps)
	}
	const n = 40000
	for _, tc := range []struct {
		rate, burstiness float64
	}{{4, 1}, {4, 4}, {4, 0.25}, {100, 1}, {0.5, 2}} {
		gaps := Intervals(n, tc.rate, tc.burstiness, 7)
		var sum, sq float64
		for _, g := range gaps {
			if g < 0 {
				t.Fatalf("negative gap %v", g)
			}
			s := g.Seconds()
			sum += s
			sq += s * s
		}
		mean := sum / n
		cv := math.Sqrt(sq/n-mean*mean) / mean
		// A gamma gap of shape k has mean 1/rate and coefficient of
		// variation 1/sqrt(k).
		if wantMean := 1 / tc.rate; math.Abs(mean-wantMean) > 0.03*wantMean {
			t.Errorf("rate %v burstiness %v: mean gap %v, want %v", tc.rate, tc.burstiness, mean, wantMean)
		}
		if wantCV := 1 / math.Sqrt(tc.burstiness); math.Abs(cv-wantCV) > 0.05*wantCV {
			t.Errorf("rate %v burstiness %v: CV %v, want %v", tc.rate, tc.burstiness, cv, wantCV)
		}
	}
	a, b := Intervals(10, 2, 1, 3), Intervals(10, 2, 1, 3)
	for i := range a {
		if a[i] != b[i] {
			t.Fatal("the same seed gave different gaps")
		}
	}
}

// TestRunFollowsConversations: a turn is sent only after its conversation's
// previous turn ended and the think time passed, whatever the other
// conversations do, and within the concurrency bound.
func TestRunFollowsConversations(t *testing.T) {
	clock := loadtest.NewClock(time.Unix(1000, 0))
	const convs, turns = 3, 4
	after := make([]int, convs*turns)
	for i := range after {
		after[i] = i - convs // turn-major: i = turn·convs + conversation
	}
	var inFlight, most atomic.Int32
	do := func(_ context.Context, i int, chunk func(int)) (int, int, error) {
		n := inFlight.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		clock.Advance(time.Duration(1+i%convs) * time.Millisecond) // conversations run at different speeds
		chunk(1)
		inFlight.Add(-1)
		if i == 4 {
			return 1, 1, errors.New("boom") // a failed turn does not stop its conversation
		}
		return 1, 1, nil
	}
	samples, _, _, err := Run(context.Background(), Config{MaxConcurrency: 2, After: after, Think: 50 * time.Millisecond, Clock: clock}, len(after), do)
	if err != nil {
		t.Fatal(err)
	}
	if len(samples) != len(after) {
		t.Fatalf("%d samples, want %d", len(samples), len(after))
	}
	for k, s := range samples {
		if s.Index != k {
			t.Fatalf("sample %d has index %d", k, s.Index)
		}
		if j := after[k]; j >= 0 {
			if gap := s.Start.Sub(samples[j].End); gap < 50*time.Millisecond {
				t.Errorf("request %d sent %v after request %d ended, want ≥ the think time", k, gap, j)
			}
		}
	}
	if most.Load() > 2 {
		t.Errorf("%d requests in flight, bound 2", most.Load())
	}
}

func TestRunRejectsBadDependencies(t *testing.T) {
	do := func(context.Context, int, func(int)) (int, int, error) { return 0, 0, nil }
	for _, after := range [][]int{{-1, 1}, {-1}, {0, -1}} {
		if _, _, _, err := Run(context.Background(), Config{After: after}, 2, do); err == nil {
			t.Errorf("After %v accepted", after)
		}
	}
}

// TestRunCancelledMidConversation: once ctx ends, no later turn is sent,
// Run returns the turns sent so far with ctx's error, and it does not wait
// for the think time of turns that will never go.
func TestRunCancelledMidConversation(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	do := func(_ context.Context, i int, chunk func(int)) (int, int, error) {
		chunk(1)
		if i == 1 {
			cancel()
		}
		return 1, 1, nil
	}
	samples, _, _, err := Run(ctx, Config{After: []int{-1, -1, 0, 1, 2, 3}, Think: time.Hour}, 6, do)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	for _, s := range samples {
		if s.Index > 1 {
			t.Errorf("turn %d sent after the cancel", s.Index)
		}
	}
}
