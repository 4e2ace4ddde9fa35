package router

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/router-svc/internal/clientwrite"
	"google.golang.org/grpc/status"
)

// senderQueue is how many events may wait for a slow client before the
// request itself waits.
const senderQueue = 64

// streamSender writes a request's events to its gRPC stream from a goroutine
// of its own, so that a client that stops reading blocks only that goroutine.
// It enforces the minimum-progress rule (package clientwrite): when the
// event the goroutine is sending has waited the write timeout since it was
// queued, the request fails with DEADLINE_EXCEEDED and releases everything
// it holds — a client that takes nothing, and one that takes a little at a
// time but falls behind, alike. Returning from the handler ends the stream,
// which unblocks the stuck Send; interrupt frees a waiting send at once.
type streamSender struct {
	stream  batonv1.RouterService_GenerateServer
	timeout time.Duration // 0: wait as long as the request's context allows
	q       chan queuedEvent
	done    chan struct{} // closed when the goroutine has returned
	err     error         // the first Send error, set before done closes
	// head is when the event being sent was queued (unix nanos; 0 while
	// none is): the oldest event the client has not taken.
	head atomic.Int64

	stopOnce sync.Once
	stop     chan struct{} // closed by interrupt
	stopErr  error         // set before stop closes
}

type queuedEvent struct {
	ev *batonv1.GenerateEvent
	at time.Time
}

func newStreamSender(stream batonv1.RouterService_GenerateServer, timeout time.Duration) *streamSender {
	s := &streamSender{stream: stream, timeout: timeout,
		q: make(chan queuedEvent, senderQueue), done: make(chan struct{}), stop: make(chan struct{})}
	go s.loop()
	return s
}

func (s *streamSender) loop() {
	defer close(s.done)
	for it := range s.q {
		s.head.Store(it.at.UnixNano())
		err := s.stream.Send(&batonv1.GenerateResponse{Event: it.ev})
		s.head.Store(0)
		if err != nil {
			s.err = err // send and finish see it once done is closed
			return
		}
	}
}

// interrupt makes every waiting and later send return an error wrapping
// cause: the request has ended (an Abort, its deadline) while its client
// was not reading.
func (s *streamSender) interrupt(cause error) {
	s.stopOnce.Do(func() {
		s.stopErr = fmt.Errorf("the stream was ended: %w", cause)
		close(s.stop)
	})
}

// behind reports whether the oldest event not yet taken has waited the
// write timeout at now.
func (s *streamSender) behind(now time.Time) bool {
	h := s.head.Load()
	return s.timeout > 0 && h != 0 && now.Sub(time.Unix(0, h)) >= s.timeout
}

// nextCheck is when behind can next become true: the oldest event's
// deadline, or a write timeout from now while none is being sent.
func (s *streamSender) nextCheck(now time.Time) time.Duration {
	if h := s.head.Load(); h != 0 {
		return time.Until(clientwrite.Deadline(time.Unix(0, h), s.timeout))
	}
	return s.timeout
}

// send queues ev, waiting while the queue is full until ctx ends, the
// sender is interrupted, or the client has fallen behind.
func (s *streamSender) send(ctx context.Context, ev *batonv1.GenerateEvent) error {
	now := time.Now()
	if s.behind(now) {
		return clientwrite.SlowClient(s.timeout)
	}
	it := queuedEvent{ev: ev, at: now}
	select {
	case s.q <- it:
		return nil
	case <-s.stop:
		return s.stopErr
	default:
	}
	for {
		expired, stop := s.timer()
		select {
		case s.q <- it:
			stop()
			return nil
		case <-s.done:
			stop()
			return s.err
		case <-s.stop:
			stop()
			return s.stopErr
		case <-ctx.Done():
			stop()
			return context.Cause(ctx)
		case <-expired:
			if s.behind(time.Now()) {
				return clientwrite.SlowClient(s.timeout)
			}
		}
	}
}

// finish flushes what is queued when the request succeeded, under the same
// rule, and returns the handler's result. A failed request returns at once:
// ending the handler ends the stream and the goroutine.
func (s *streamSender) finish(ctx context.Context, runErr error) error {
	close(s.q)
	if runErr != nil {
		return runErr
	}
	for {
		expired, stop := s.timer()
		select {
		case <-s.done:
			stop()
			return s.err
		case <-s.stop:
			stop()
			return s.stopErr
		case <-ctx.Done():
			stop()
			return status.FromContextError(ctx.Err()).Err()
		case <-expired:
			if s.behind(time.Now()) {
				return clientwrite.SlowClient(s.timeout)
			}
		}
	}
}

// timer fires when the client may next have fallen behind (never when
// there is no write timeout); stop releases it.
func (s *streamSender) timer() (expired <-chan time.Time, stop func() bool) {
	if s.timeout <= 0 {
		return nil, func() bool { return false }
	}
	t := time.NewTimer(max(s.nextCheck(time.Now()), time.Millisecond))
	return t.C, t.Stop
}

// bind returns ctx carrying the sender's interrupt, which the relay calls
// when the request ends (clientwrite.InterruptOnDone).
func (s *streamSender) bind(ctx context.Context) context.Context {
	return clientwrite.WithInterrupt(ctx, s.interrupt)
}
