package router

import (
	"context"
	"errors"
	"testing"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// clientStream is the server side of a Generate stream whose client reads
// only when the test lets it.
type clientStream struct {
	grpc.ServerStream
	ctx  context.Context
	read chan struct{} // one receive per Send allowed; closed: read freely
	got  chan string
	fail error
}

func (c *clientStream) Context() context.Context { return c.ctx }

func (c *clientStream) Send(r *batonv1.GenerateResponse) error {
	if c.fail != nil {
		return c.fail
	}
	select {
	case <-c.read:
	case <-c.ctx.Done():
		return status.FromContextError(c.ctx.Err()).Err()
	}
	c.got <- r.GetEvent().GetText()
	return nil
}

func newClientStream(t *testing.T) (*clientStream, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return &clientStream{ctx: ctx, read: make(chan struct{}), got: make(chan string, 1000)}, cancel
}

func TestStreamSenderDeliversInOrder(t *testing.T) {
	cs, _ := newClientStream(t)
	close(cs.read)
	out := newStreamSender(cs, time.Minute)
	for _, s := range []string{"a", "b", "c"} {
		if err := out.send(cs.ctx, &batonv1.GenerateEvent{Text: s}); err != nil {
			t.Fatal(err)
		}
	}
	if err := out.finish(cs.ctx, nil); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"a", "b", "c"} {
		if got := <-cs.got; got != want {
			t.Fatalf("got %q, want %q", got, want)
		}
	}
}

// A client that stops reading holds the request no longer than the write
// timeout once the queue is full, and the handler returns at once.
func TestStreamSenderStalledClient(t *testing.T) {
	cs, hangUp := newClientStream(t)
	out := newStreamSender(cs, 50*time.Millisecond)
	var err error
	start := time.Now()
	for i := 0; i < 10*senderQueue && err == nil; i++ {
		err = out.send(cs.ctx, &batonv1.GenerateEvent{Text: "x"})
	}
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("send to a stalled client: %v, want DEADLINE_EXCEEDED", err)
	}
	if waited := time.Since(start); waited > 5*time.Second {
		t.Fatalf("send waited %v", waited)
	}
	if got := out.finish(cs.ctx, err); got != err {
		t.Fatalf("finish = %v, want the request's error", got)
	}
	// Ending the handler ends the stream, which frees the stuck Send.
	hangUp()
	select {
	case <-out.done:
	case <-time.After(5 * time.Second):
		t.Fatal("the sender goroutine did not end with the stream")
	}
}

// A successful request whose client never reads its tail is bounded too.
func TestStreamSenderFinishBounded(t *testing.T) {
	cs, hangUp := newClientStream(t)
	out := newStreamSender(cs, 50*time.Millisecond)
	if err := out.send(cs.ctx, &batonv1.GenerateEvent{Text: "x"}); err != nil {
		t.Fatal(err)
	}
	if err := out.finish(cs.ctx, nil); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("finish = %v, want DEADLINE_EXCEEDED", err)
	}
	hangUp()
	<-out.done
}

func TestStreamSenderSendError(t *testing.T) {
	cs, _ := newClientStream(t)
	cs.fail = errors.New("connection reset")
	out := newStreamSender(cs, time.Minute)
	var err error
	for i := 0; i < 2*senderQueue && err == nil; i++ {
		err = out.send(cs.ctx, &batonv1.GenerateEvent{Text: "x"})
	}
	if err == nil || err.Error() != "connection reset" {
		t.Fatalf("send after a failed Send: %v", err)
	}
	if err := out.finish(cs.ctx, nil); err == nil || err.Error() != "connection reset" {
		t.Fatalf("finish after a failed Send: %v", err)
	}
}

// A client that takes an event every 20 ms — each Send completes well
// within the write timeout — but falls ever further behind a producer that
// is faster is aborted once the oldest event it has not taken has waited
// the write timeout (minimum progress), not after the last event.
func TestStreamSenderTricklingClient(t *testing.T) {
	cs, hangUp := newClientStream(t)
	defer hangUp()
	go func() {
		for {
			select {
			case cs.read <- struct{}{}:
			case <-cs.ctx.Done():
				return
			}
			<-cs.got
			time.Sleep(20 * time.Millisecond)
		}
	}()
	out := newStreamSender(cs, 200*time.Millisecond)
	start := time.Now()
	var err error
	sent := 0
	for ; sent < 100*senderQueue && err == nil; sent++ {
		err = out.send(cs.ctx, &batonv1.GenerateEvent{Text: "x"})
	}
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("after %d events in %v: %v, want DEADLINE_EXCEEDED", sent, time.Since(start), err)
	}
	t.Logf("aborted after %d events, %v", sent, time.Since(start).Round(time.Millisecond))
	_ = out.finish(cs.ctx, err)
}

// interrupt (the request's end, an Abort say) frees a send waiting on a
// client that reads nothing at once, whatever the write timeout.
func TestStreamSenderInterrupt(t *testing.T) {
	cs, hangUp := newClientStream(t)
	defer hangUp()
	out := newStreamSender(cs, time.Hour)
	errc := make(chan error, 1)
	go func() {
		var err error
		for err == nil {
			err = out.send(cs.ctx, &batonv1.GenerateEvent{Text: "x"})
		}
		errc <- err
	}()
	time.Sleep(100 * time.Millisecond)
	cause := errors.New("aborted by the test")
	out.interrupt(cause)
	select {
	case err := <-errc:
		if !errors.Is(err, cause) {
			t.Errorf("send after interrupt: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("interrupt did not free the blocked send")
	}
	_ = out.finish(cs.ctx, errors.New("ended"))
}
