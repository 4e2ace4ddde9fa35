package enginehost

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/baton-serving/baton/engine/sched"
)

// TestShutdownDuringHungStep: a worker told to stop while a forward step
// hangs (the hang hook: stopping does not lift it) still stops within its
// shutdown timeout. Drain aborts what it can and gives up on the step at
// the deadline; Close does not wait again and leaves the model to the step
// (the process exit reclaims it). The held request stays visible until the
// step returns, and then the scheduler releases it with its pages.
func TestShutdownDuringHungStep(t *testing.T) {
	h, srv := openTestHost(t, "--debug-hooks")
	h.closeTimeout = 300 * time.Millisecond
	if code, body := post(t, srv.Admin, "/debug/freeze?for=5m&hang=true"); code != http.StatusOK {
		t.Fatalf("hang = %d %s", code, body)
	}
	if code, body := post(t, srv.Admin, "/debug/freeze?hang=maybe"); code != http.StatusBadRequest || !strings.Contains(body, "hang=") {
		t.Errorf("POST /debug/freeze?hang=maybe = %d %s, want 400 naming hang=", code, body)
	}
	st, err := h.Sched.Submit(context.Background(), sched.Request{ID: "hung-1", Prompt: []int32{1, 403}, MaxTokens: 4, Params: greedyParams()})
	if err != nil {
		t.Fatal(err)
	}
	for h.Sched.Snapshot().StepRunning == 0 {
		time.Sleep(5 * time.Millisecond)
	}
	unhang := func() {
		if code, body := post(t, srv.Admin, "/debug/unfreeze"); code != http.StatusOK {
			t.Errorf("unfreeze = %d %s", code, body)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	drained := make(chan struct{})
	go func() { h.Drain(ctx); close(drained) }()
	select {
	case <-drained:
	case <-time.After(20 * time.Second):
		unhang()
		<-drained
		t.Fatal("Drain did not return within 20 s of its 500 ms deadline while a forward step hung")
	}
	closed := make(chan error, 1)
	go func() { closed <- h.Close() }()
	select {
	case err = <-closed:
		if !errors.Is(err, sched.ErrStepHung) {
			t.Errorf("Close during the hung step = %v, want ErrStepHung", err)
		}
	case <-time.After(20 * time.Second):
		unhang()
		<-closed
		t.Fatal("Close did not return within 20 s while a forward step hung")
	}
	if snap := h.Sched.Snapshot(); len(snap.Requests) != 1 || snap.Requests[0].ID != "hung-1" {
		t.Errorf("requests while the step hangs after shutdown: %+v; want hung-1 still listed", snap.Requests)
	}

	unhang()
	var last sched.Event
	returnsWithin(t, 10*time.Second, func() {
		for ev := range st.Events() {
			last = ev
		}
	})
	if last.Finish != sched.FinishAborted || !errors.Is(last.Err, sched.ErrClosed) {
		t.Errorf("the hung request ended %s (%v), want aborted with ErrClosed", last.Finish, last.Err)
	}
	returnsWithin(t, 10*time.Second, func() { _ = h.Sched.Close() })
	if u := h.Pool.Stats().Used; u != 0 {
		t.Errorf("%d pages used after the step returned", u)
	}
}
