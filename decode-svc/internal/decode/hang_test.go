package decode

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// hangBound is how long Generate may take to answer once its context has
// ended while a forward step hangs (the freeze lasts a minute): far less
// than the freeze, so that only a Generate that watches its context passes.
const hangBound = 15 * time.Second

// TestFirstTokenDeadlineDuringHungStep: a colocated request whose prompt is
// in a forward pass that never returns (decode is frozen) ends at decode's
// --first-token-timeout with DEADLINE_EXCEEDED, while the step still hangs;
// the scheduler keeps it, visible in the load report, until the step
// returns, and then releases it and its pages.
func TestFirstTokenDeadlineDuringHungStep(t *testing.T) {
	p := startPD(t, nil, []string{"--debug-hooks", "--first-token-timeout", "300ms"}, nil)
	p.decode.Freeze(t)
	c := p.start(t, request("hung-prefill", 20, 5, localPrefill))
	ended := make(chan error, 1)
	go func() { _, err := c.rest(); ended <- err }()
	select {
	case err := <-ended:
		want := "no first token within --first-token-timeout 300ms"
		if st := status.Convert(err); st.Code() != codes.DeadlineExceeded || st.Message() != want {
			t.Errorf("err = %v, want DEADLINE_EXCEEDED %q", err, want)
		}
	case <-time.After(hangBound):
		p.decode.Thaw(t)
		<-ended
		t.Fatalf("Generate did not return at its first-token deadline while the step hung (%v)", hangBound)
	}
	if l := p.decode.Load(t); l.GetRunningRequests() != 1 || l.GetPagesUsed() == 0 {
		t.Errorf("load while the step still hangs: %v; want the request still held (running, with pages)", l)
	}
	p.decode.Thaw(t)
	// The step completes the prompt; the cancel applies after it.
	p.decode.WaitCounter(t, idleBound, 1, "baton_requests_finished_total", "finish", "cancelled")
	p.waitIdle(t)
}

// TestRequestDeadlineDuringHungStep: a PD request that has its first token
// (from prefill) and then waits on a decode step that never returns ends at
// its own deadline (--request-timeout, the caller set none) with
// DEADLINE_EXCEEDED, not when the step returns.
func TestRequestDeadlineDuringHungStep(t *testing.T) {
	p := startPD(t, nil, []string{"--debug-hooks", "--request-timeout", "500ms"}, nil)
	p.decode.Freeze(t)
	ctx, cancel := context.WithCancel(context.Background()) // no deadline: the worker's applies
	defer cancel()
	stream, err := p.client.Generate(ctx, request("hung-decode", 20, 50, p.prefill.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	var tokens int
	go func() {
		for {
			resp, err := stream.Recv()
			if err != nil {
				ended <- err
				return
			}
			tokens += len(resp.GetEvent().GetTokenIds())
		}
	}()
	select {
	case err := <-ended:
		if status.Code(err) != codes.DeadlineExceeded || tokens != 1 {
			t.Errorf("err = %v after %d tokens, want DEADLINE_EXCEEDED after prefill's first token", err, tokens)
		}
	case <-time.After(hangBound):
		p.decode.Thaw(t)
		cancel()
		<-ended
		t.Fatalf("Generate did not return at its deadline while the step hung (%v)", hangBound)
	}
	if l := p.decode.Load(t); l.GetRunningRequests() != 1 {
		t.Errorf("load while the step still hangs: %v; want the request still held", l)
	}
	p.decode.Thaw(t)
	p.decode.WaitCounter(t, idleBound, 1, aborts, "stage", "running", "reason", "cancelled")
	if n := p.decode.Counter(t, "baton_requests_finished_total", "finish", "length"); n != 0 {
		t.Errorf("%v requests finished by length; the expired one must not", n)
	}
	p.waitIdle(t)
}
