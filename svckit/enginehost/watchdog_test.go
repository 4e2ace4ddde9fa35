package enginehost

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/baton-serving/baton/engine/kvcache"
	"github.com/baton-serving/baton/engine/model"
	"github.com/baton-serving/baton/engine/sched"
)

func TestStalled(t *testing.T) {
	now := time.Now()
	req := func(id string, m sched.Mode, s sched.State, age time.Duration) sched.RequestInfo {
		return sched.RequestInfo{ID: id, Mode: m, State: s, Age: age}
	}
	cases := []struct {
		name string
		snap sched.Snapshot
		want string // substring; "" = not stalled
	}{
		{"idle", sched.Snapshot{At: now, LastStep: now.Add(-time.Hour)}, ""},
		{"busy and stepping", sched.Snapshot{At: now, LastStep: now.Add(-time.Second),
			Requests: []sched.RequestInfo{req("a", sched.ModeGenerate, sched.StateRunning, time.Minute)}}, ""},
		{"running, no step for 12s", sched.Snapshot{At: now, LastStep: now.Add(-12 * time.Second),
			Requests: []sched.RequestInfo{req("a", sched.ModeGenerate, sched.StateRunning, time.Minute)}}, "no forward step for 12s with 1 requests to compute: a (running"},
		// The regression: after an hour idle, a long prompt's first step
		// is in progress; the request is 2 s old, so nothing is stalled.
		{"idle for an hour, new request in its first step", sched.Snapshot{At: now, LastStep: now.Add(-time.Hour), StepRunning: 2 * time.Second,
			Requests: []sched.RequestInfo{req("n", sched.ModePrefillOnly, sched.StatePrefilling, 2*time.Second)}}, ""},
		{"idle for an hour, request starved for 11s", sched.Snapshot{At: now, LastStep: now.Add(-time.Hour),
			Requests: []sched.RequestInfo{req("s", sched.ModeGenerate, sched.StateWaiting, 11*time.Second)}}, "no forward step for 11s with 1 requests to compute: s (waiting"},
		{"never stepped, old request", sched.Snapshot{At: now,
			Requests: []sched.RequestInfo{req("q", sched.ModePrefillOnly, sched.StateWaiting, 11*time.Second)}}, "q (waiting"},
		{"only transfers pending", sched.Snapshot{At: now, LastStep: now.Add(-time.Hour), Requests: []sched.RequestInfo{
			req("t", sched.ModeDecodeImported, sched.StateTransferring, time.Minute),
			req("p", sched.ModeDecodeImported, sched.StateWaiting, time.Minute),
			req("h", sched.ModePrefillOnly, sched.StateHandingOver, time.Minute)}}, ""},
		{"names at most three", sched.Snapshot{At: now, LastStep: now.Add(-time.Minute), Requests: []sched.RequestInfo{
			req("1", sched.ModeGenerate, sched.StateRunning, time.Minute), req("2", sched.ModeGenerate, sched.StateRunning, time.Minute),
			req("3", sched.ModeGenerate, sched.StateRunning, time.Minute), req("4", sched.ModeGenerate, sched.StateWaiting, time.Minute)}}, "and 1 more"},
	}
	for _, c := range cases {
		var w watchdog // a first look: no hysteresis, nothing measured
		got := w.check(c.snap, 10*time.Second)
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("%s: stalled = %q, want %q", c.name, got, c.want)
		}
	}
}

func TestByteSize(t *testing.T) {
	for in, want := range map[string]int64{"1024": 1024, "512MiB": 512 << 20, "4GiB": 4 << 30, "1.5KiB": 1536, "100MB": 100e6} {
		var b ByteSize
		if err := b.Set(in); err != nil || int64(b) != want {
			t.Errorf("Set(%q) = %d, %v; want %d", in, b, err, want)
		}
	}
	for _, bad := range []string{"", "-1", "0", "lots", "5XB"} {
		var b ByteSize
		if err := b.Set(bad); err == nil {
			t.Errorf("Set(%q) accepted", bad)
		}
	}
}

// slowModel is the real model made slower by perToken for every token of a
// step, as a bigger model on the same cores would be: a step's time grows
// with its tokens.
type slowModel struct {
	sched.Model
	perToken time.Duration
}

func (m slowModel) ForwardBatch(kv *kvcache.Pool, batch []model.Chunk) error {
	n := 0
	for _, c := range batch {
		n += len(c.Tokens)
	}
	time.Sleep(time.Duration(n) * m.perToken)
	return m.Model.ForwardBatch(kv, batch)
}

// slowHost opens a test host whose scheduler runs the shared model slowed
// down by perToken per token (its speed measured as Open measures it).
func slowHost(t *testing.T, perToken time.Duration, manual bool, args ...string) *Host {
	t.Helper()
	h, _ := openTestHost(t, args...)
	if err := h.Sched.Close(); err != nil {
		t.Fatal(err)
	}
	slow := slowModel{h.Model, perToken}
	var err error
	h.Sched, err = sched.New(sched.Config{Model: slow, Pool: h.Pool, Tokenizer: h.Tokenizer, Manual: manual,
		MaxBatchTokens: h.flags.MaxBatchTokens, MaxSeqs: h.flags.MaxSeqs, MaxRequests: h.flags.MaxRequests,
		Observer: stepObserver{h.Metrics, &h.trace.steps, &h.watchdog.speed}})
	if err != nil {
		t.Fatal(err)
	}
	h.watchdog.speed = stepSpeed{} // measure the slow model, as Open measures its model
	if err := h.watchdog.speed.calibrate(context.Background(), slow, h.Pool, time.Minute); err != nil {
		t.Fatal(err)
	}
	return h
}

// prompt returns n valid prompt tokens.
func prompt(n int) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = int32(300 + i%200)
	}
	p[0] = 1
	return p
}

// TestProgressLongStep: a long prompt's first forward step, 1.5 s long on a
// slow model, under --stall-timeout 1s with no step completed yet, is
// progress, not a stall: readiness stays SERVING throughout the step. (The
// benchmark's "no ready decode worker (… not ready)".)
func TestProgressLongStep(t *testing.T) {
	const tokens = 120 // the shared model's context is 128
	h := slowHost(t, 1500*time.Millisecond/tokens, false, "--stall-timeout", "1s")
	ctx := context.Background()
	st, err := h.Sched.Submit(ctx, sched.Request{ID: "long", Prompt: prompt(tokens), MaxTokens: 1, Params: greedyParams()})
	if err != nil {
		t.Fatal(err)
	}
	checks := 0
	for done := false; !done; {
		select {
		case _, ok := <-st.Events():
			done = !ok
			continue
		case <-time.After(20 * time.Millisecond):
		}
		snap := h.Sched.Snapshot()
		if err := h.Progress(ctx); err != nil {
			t.Fatalf("readiness failed %v into a 1.5 s step (%d steps completed): %v", snap.StepRunning, snap.Steps, err)
		}
		if snap.StepRunning > 1100*time.Millisecond {
			checks++
		}
	}
	if checks == 0 {
		t.Fatal("never checked readiness past the stall timeout within the step")
	}
}

// TestProgressPageStarved: a running request that sits out steps because
// the pages it needs are held by a transfer in progress is not the
// engine's stall: readiness stays SERVING however long the transfer takes.
func TestProgressPageStarved(t *testing.T) {
	h := slowHost(t, 0, true, "--stall-timeout", "200ms", "--kv-cache-bytes", "82000")
	total := h.Pool.Stats().Total
	ps := h.Layout.PageSize
	ctx, cancel := context.WithCancel(context.Background())
	// The runner's prompt and first token fill its page, so its second
	// token needs a new page.
	_, err := h.Sched.Submit(ctx, sched.Request{ID: "runner", Prompt: prompt(ps - 1), MaxTokens: 64, Params: greedyParams()})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := h.Sched.Step(); err != nil { // prefill: running, one page
		t.Fatal(err)
	}
	// An imported request reserves every other page and waits for its
	// transfer.
	_, err = h.Sched.Submit(ctx, sched.Request{ID: "transfer", Mode: sched.ModeDecodeImported, Prompt: prompt((total - 1) * ps), MaxTokens: 4, Params: greedyParams()})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, _, err := h.Sched.Step(); err != nil {
			t.Fatal(err)
		}
	}
	snap := h.Sched.Snapshot()
	if got := snap.Pages.Used; got != total {
		t.Fatalf("%d of %d pages used; the test wants the pool full", got, total)
	}
	time.Sleep(300 * time.Millisecond)
	if err := h.Progress(ctx); err != nil {
		t.Errorf("readiness failed while the only runnable request waits for pages a transfer holds: %v", err)
	}
	cancel()
	_, _, _ = h.Sched.Step()
}

// TestProgressHysteresis: once the watchdog has called a worker stalled,
// one completed step does not make it SERVING again: readiness comes back
// only when steps have kept completing (or the work is gone), so a worker
// that hangs on and off does not flap in and out of the router's pool.
func TestProgressHysteresis(t *testing.T) {
	h, srv := openTestHost(t, "--debug-hooks", "--stall-timeout", "300ms")
	if code, body := post(t, srv.Admin, "/debug/freeze?for=20s"); code != http.StatusOK {
		t.Fatalf("freeze = %d %s", code, body)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var streams []*sched.Stream
	for i := range 4 {
		st, err := h.Sched.Submit(ctx, sched.Request{ID: fmt.Sprintf("r%d", i), Prompt: prompt(8), MaxTokens: 200, IgnoreEOS: true, Params: greedyParams()})
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, st)
	}
	defer func() {
		post(t, srv.Admin, "/debug/unfreeze")
		cancel()
		for _, st := range streams {
			for range st.Events() {
			}
		}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for h.Progress(ctx) == nil {
		if time.Now().After(deadline) {
			t.Fatal("readiness did not fail while frozen")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// One step (or a few) completes, then the worker hangs again.
	before := h.Sched.Snapshot().Steps
	post(t, srv.Admin, "/debug/unfreeze")
	for h.Sched.Snapshot().Steps == before {
	}
	post(t, srv.Admin, "/debug/freeze?for=20s")
	if snap := h.Sched.Snapshot(); len(snap.Requests) == 0 {
		t.Fatal("the requests finished between the thaw and the freeze; the test needs them running")
	}
	if err := h.Progress(ctx); err == nil {
		t.Error("readiness came back after a single step between two hangs")
	}
}

// TestStepBound: a step in progress is judged against its expected time at
// the measured speed (×4, at least the stall timeout, at most 10 stall
// timeouts), so a long step is
// not a stall but a hung one still is.
func TestStepBound(t *testing.T) {
	var w watchdog
	w.speed.observe(100, time.Second) // 10 ms a token
	now := time.Now()
	step := func(running time.Duration, tokens int) sched.Snapshot {
		return sched.Snapshot{At: now, Steps: 7, StepRunning: running, StepTokens: tokens,
			Requests: []sched.RequestInfo{{ID: "a", Mode: sched.ModeGenerate, State: sched.StatePrefilling, Age: time.Minute}}}
	}
	cases := []struct {
		name string
		snap sched.Snapshot
		want string
	}{
		{"a 300-token step at 2.5 s of its expected 3 s", step(2500*time.Millisecond, 300), ""},
		{"a 300-token step at 11 s of its bound 12 s", step(11*time.Second, 300), ""},
		{"a 300-token step hung past its bound", step(13*time.Second, 300), "no forward step for 13s (the step in progress, 300 tokens, is past its bound of 12s)"},
		{"a 1-token step hung past the stall timeout", step(2100*time.Millisecond, 1), "past its bound of 2s"},
	}
	for _, c := range cases {
		var fresh watchdog
		fresh.speed.observe(100, time.Second)
		if got := fresh.check(c.snap, 2*time.Second); (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
	// Hysteresis, step by step: a stall, then steps again.
	if w.check(step(13*time.Second, 300), time.Second) == "" {
		t.Fatal("a hung step is not a stall")
	}
	recovering := step(10*time.Millisecond, 1)
	recovering.Steps = 8
	if got := w.check(recovering, time.Second); !strings.Contains(got, "recovering") {
		t.Errorf("right after the first step since the stall: %q, want recovering", got)
	}
	recovering.At = now.Add(600 * time.Millisecond)
	if got := w.check(recovering, time.Second); got != "" {
		t.Errorf("after 600 ms of progress (recovery 500 ms): %q, want ready", got)
	}
	if w.check(step(13*time.Second, 300), time.Second) == "" {
		t.Fatal("a second hang is not a stall")
	}
	if got := w.check(sched.Snapshot{At: now, Steps: 9}, time.Second); got != "" {
		t.Errorf("idle after a stall: %q, want ready at once", got)
	}
}

// TestProgressLeakedPages: pages held by no live request (a leak) starve
// every new request, and nothing will ever free them: the starved request
// is stuck, not waiting on a holder, so readiness fails after the stall
// timeout instead of staying SERVING while each request waits out its
// first-token timeout.
func TestProgressLeakedPages(t *testing.T) {
	h := slowHost(t, 0, true, "--stall-timeout", "200ms", "--kv-cache-bytes", "82000")
	total := h.Pool.Stats().Total
	leaked, err := h.Pool.Alloc(total) // taken outside any request
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = h.Pool.Release(leaked...) }()
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); _, _, _ = h.Sched.Step() }()
	if _, err := h.Sched.Submit(ctx, sched.Request{ID: "starved", Prompt: prompt(8), MaxTokens: 4, Params: greedyParams()}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := h.Sched.Step(); err != nil {
		t.Fatal(err)
	}
	if snap := h.Sched.Snapshot(); len(snap.Requests) != 1 || !snap.Requests[0].Starved {
		t.Fatalf("the test wants the one request starved of pages: %+v", snap.Requests)
	}
	time.Sleep(300 * time.Millisecond)
	_, _, _ = h.Sched.Step()
	err = h.Progress(ctx)
	if err == nil {
		t.Fatalf("readiness is SERVING 300 ms into a 200 ms stall timeout while %d leaked pages starve the only request", total)
	}
	if !strings.Contains(err.Error(), "starved (waiting") || !strings.Contains(err.Error(), "held by no live request") {
		t.Errorf("the stall does not name the request and the leak: %v", err)
	}
}

// TestSpeedClamp: a step that hung and then returned (or a frozen one) is
// observed at most at its bound, so one long hang does not inflate the
// speed estimate — and with it the bound of the next step — for minutes.
func TestSpeedClamp(t *testing.T) {
	var s stepSpeed
	for range 50 {
		s.observe(512, 512*time.Millisecond) // 1 ms a token
	}
	before := s.expect(512)
	s.observe(512, 10*time.Minute) // a hang that returned
	after := s.expect(512)
	limit := time.Duration(float64(before) * (1 + stepBoundFactor))
	if after > limit {
		t.Errorf("after one 10-min step the 512-token estimate is %v (was %v); want ≤ %v (the observation clamped to its bound)", after, before, limit)
	}
}

// TestBoundCapped: a cold, slow measurement (the weights faulting in)
// does not give a step a bound above maxBoundFactor × --stall-timeout.
func TestBoundCapped(t *testing.T) {
	var w watchdog
	w.speed.observe(16, 40*time.Second) // 2.5 s a token, as a cold pass
	snap := sched.Snapshot{At: time.Now(), Steps: 1, StepRunning: 2 * time.Hour, StepTokens: 512,
		Requests: []sched.RequestInfo{{ID: "a", Mode: sched.ModeGenerate, State: sched.StatePrefilling, Age: 2 * time.Hour}}}
	a := assess(snap, 2*time.Second, w.speed.expect(512))
	if want := 10 * 2 * time.Second; a.bound > want {
		t.Errorf("a 512-token step's bound is %v after a slow calibration; want ≤ %v (10 × --stall-timeout)", a.bound, want)
	}
}
