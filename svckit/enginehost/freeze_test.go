package enginehost

import (
	"context"
	"errors"
	"flag"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/baton-serving/baton/engine/refdata"
	"github.com/baton-serving/baton/engine/sample"
	"github.com/baton-serving/baton/engine/sched"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/svckit"
	"github.com/baton-serving/baton/tracing"
)

// returnsWithin runs f and reports how long it took, failing if it has not
// returned within limit.
func returnsWithin(t *testing.T, limit time.Duration, f func()) time.Duration {
	t.Helper()
	start := time.Now()
	done := make(chan struct{})
	go func() { f(); close(done) }()
	select {
	case <-done:
		return time.Since(start)
	case <-time.After(limit):
		t.Fatalf("still blocked after %v", limit)
		return 0
	}
}

func TestFreezerBounds(t *testing.T) {
	f := newFreezer(slog.New(slog.DiscardHandler))
	for _, d := range []time.Duration{0, -time.Second, MaxFreeze + time.Second} {
		if _, err := f.freeze(d); err == nil {
			t.Errorf("freeze(%v) accepted", d)
		}
	}
	if _, err := f.freeze(MaxFreeze); err != nil {
		t.Errorf("freeze(%v): %v", MaxFreeze, err)
	}
	if !f.thaw() {
		t.Error("thaw after a freeze reported no freeze")
	}
	if f.thaw() {
		t.Error("a second thaw reported a freeze")
	}
}

func TestFreezerWait(t *testing.T) {
	cases := []struct {
		name     string
		freeze   time.Duration // 0: none
		after    time.Duration // when to act
		act      func(f *freezer)
		min, max time.Duration // how long wait may take
	}{
		{"not frozen", 0, 0, nil, 0, 50 * time.Millisecond},
		{"runs out", 150 * time.Millisecond, 0, nil, 140 * time.Millisecond, 2 * time.Second},
		{"thawed", time.Minute, 100 * time.Millisecond, func(f *freezer) { f.thaw() }, 90 * time.Millisecond, 2 * time.Second},
		{"shortened", time.Minute, 50 * time.Millisecond, func(f *freezer) { _, _ = f.freeze(100 * time.Millisecond) }, 140 * time.Millisecond, 2 * time.Second},
		{"extended", 100 * time.Millisecond, 50 * time.Millisecond, func(f *freezer) { _, _ = f.freeze(300 * time.Millisecond) }, 340 * time.Millisecond, 2 * time.Second},
		{"closed", time.Minute, 100 * time.Millisecond, func(f *freezer) { f.close() }, 90 * time.Millisecond, 2 * time.Second},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFreezer(slog.New(slog.DiscardHandler))
			if c.freeze > 0 {
				if _, err := f.freeze(c.freeze); err != nil {
					t.Fatal(err)
				}
			}
			if c.act != nil {
				timer := time.AfterFunc(c.after, func() { c.act(f) })
				defer timer.Stop()
			}
			took := returnsWithin(t, c.max, f.wait)
			if took < c.min {
				t.Errorf("wait returned after %v, want ≥ %v", took, c.min)
			}
		})
	}
}

func TestFreezerClosedRefuses(t *testing.T) {
	var nilFreezer *freezer
	nilFreezer.close() // hooks off: a no-op
	f := newFreezer(slog.New(slog.DiscardHandler))
	f.close()
	if _, err := f.freeze(time.Second); !errors.Is(err, svckit.ErrDraining) {
		t.Errorf("freeze after close: %v, want ErrDraining", err)
	}
	returnsWithin(t, 50*time.Millisecond, f.wait)
}

// openTestHost opens a host on the shared model with flags parsed from args
// and attaches it to a server that is not started (its mux is tested
// directly).
func openTestHost(t *testing.T, args ...string) (*Host, *svckit.Server) {
	t.Helper()
	path := refdata.Model(t)
	var f Flags
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	f.AddFlags(fs)
	if err := fs.Parse(append([]string{"--kv-cache-bytes", "8MiB", "--threads", "1"}, args...)); err != nil {
		t.Fatal(err)
	}
	if err := f.Validate(); err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.DiscardHandler)
	tp, err := tracing.Init(context.Background(), "enginehost-test", logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	srv, err := svckit.NewServer("enginehost-test", svckit.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"}, logger, tp, svckit.ServerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	h, err := Open(path, f, batonv1.WorkerRole_WORKER_ROLE_DECODE, logger, srv.Registry)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	h.Attach(srv)
	return h, srv
}

func post(t *testing.T, mux http.Handler, target string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, target, nil))
	return rec.Code, rec.Body.String()
}

// TestFreezeHook: with --debug-hooks, POST /debug/freeze holds the
// scheduler in its step, the progress watchdog fails readiness after
// --stall-timeout naming the stuck request, and after POST /debug/unfreeze
// the request finishes and readiness returns.
func TestFreezeHook(t *testing.T) {
	h, srv := openTestHost(t, "--debug-hooks", "--stall-timeout", "300ms")
	// Test hooks live on the loopback admin listener, never on the public
	// HTTP port.
	if code, _ := post(t, srv.Mux, "/debug/freeze?for=1ms"); code != http.StatusNotFound && code != http.StatusMethodNotAllowed {
		t.Errorf("POST /debug/freeze on the public HTTP port = %d, want 404: the hook belongs on the admin listener", code)
	}
	for _, bad := range []string{"/debug/freeze?for=soon", "/debug/freeze?for=-1s", "/debug/freeze?for=11m"} {
		if code, body := post(t, srv.Admin, bad); code != http.StatusBadRequest || !strings.Contains(body, "for=") {
			t.Errorf("POST %s = %d %s, want 400 naming for=", bad, code, body)
		}
	}
	if code, body := post(t, srv.Admin, "/debug/freeze?for=20s"); code != http.StatusOK || !strings.Contains(body, `"frozen":true`) {
		t.Fatalf("freeze = %d %s", code, body)
	}
	ctx := context.Background()
	st, err := h.Sched.Submit(ctx, sched.Request{ID: "frozen-1", Prompt: []int32{1, 403, 407, 261}, MaxTokens: 8, Params: greedyParams()})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := h.Progress(ctx)
		if err != nil {
			if !strings.Contains(err.Error(), "frozen-1") {
				t.Errorf("watchdog error %q does not name the stuck request", err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("readiness did not fail while the scheduler was frozen")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if failed := srv.Ready(ctx); failed["scheduler"] == "" {
		t.Errorf("server readiness = %v, want the scheduler check failing", failed)
	}
	if snap := h.Sched.Snapshot(); snap.Steps != 0 || snap.StepRunning == 0 {
		t.Errorf("frozen: %d steps completed, step running %v; want none completed and one held", snap.Steps, snap.StepRunning)
	}
	if code, body := post(t, srv.Admin, "/debug/unfreeze"); code != http.StatusOK || !strings.Contains(body, `"was_frozen":true`) {
		t.Errorf("unfreeze = %d %s", code, body)
	}
	var last sched.Event
	returnsWithin(t, 10*time.Second, func() {
		for ev := range st.Events() {
			last = ev
		}
	})
	if last.Kind != sched.EventDone || last.Err != nil || last.Usage.CompletionTokens != 8 {
		t.Errorf("after the thaw the request ended with %+v, want 8 tokens", last)
	}
	if err := h.Progress(ctx); err != nil {
		t.Errorf("readiness after the thaw: %v", err)
	}
}

// TestFreezeHookOff: without --debug-hooks there is no freeze endpoint.
func TestFreezeHookOff(t *testing.T) {
	h, srv := openTestHost(t)
	if h.freeze != nil {
		t.Error("a freezer exists without --debug-hooks")
	}
	if code, _ := post(t, srv.Admin, "/debug/freeze?for=1s"); code != http.StatusNotFound && code != http.StatusMethodNotAllowed {
		t.Errorf("POST /debug/freeze without --debug-hooks = %d, want 404", code)
	}
}

// TestFreezeCloseDoesNotHang: closing a host whose scheduler is frozen in a
// step returns at once (the freeze is lifted for good).
func TestFreezeCloseDoesNotHang(t *testing.T) {
	h, srv := openTestHost(t, "--debug-hooks")
	if code, body := post(t, srv.Admin, "/debug/freeze?for=5m"); code != http.StatusOK {
		t.Fatalf("freeze = %d %s", code, body)
	}
	st, err := h.Sched.Submit(context.Background(), sched.Request{Prompt: []int32{1, 403}, MaxTokens: 4, Params: greedyParams()})
	if err != nil {
		t.Fatal(err)
	}
	for h.Sched.Snapshot().StepRunning == 0 {
		time.Sleep(5 * time.Millisecond)
	}
	returnsWithin(t, 5*time.Second, func() { _ = h.Close() })
	for range st.Events() {
	}
}

func greedyParams() sample.Params {
	p := sample.Defaults()
	p.Temperature = 0
	return p
}
