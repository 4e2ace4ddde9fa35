package router

import (
	"context"
	"fmt"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// senderQueue is how many events may wait for a slow client before the
// request itself waits.
const senderQueue = 64

// streamSender writes a request's events to its gRPC stream from a goroutine
// of its own, so that a client that stops reading blocks only that goroutine:
// the request waits at most the write timeout for room in the queue, then
// fails with DEADLINE_EXCEEDED and releases everything it holds. Returning
// from the handler ends the stream, which unblocks the stuck Send.
type streamSender struct {
	stream  batonv1.RouterService_GenerateServer
	timeout time.Duration // 0: wait as long as the request's context allows
	q       chan *batonv1.GenerateEvent
	done    chan struct{} // closed when the goroutine has returned
	err     error         // the first Send error, set before done closes
}

func newStreamSender(stream batonv1.RouterService_GenerateServer, timeout time.Duration) *streamSender {
	s := &streamSender{stream: stream, timeout: timeout,
		q: make(chan *batonv1.GenerateEvent, senderQueue), done: make(chan struct{})}
	go s.loop()
	return s
}

func (s *streamSender) loop() {
	defer close(s.done)
	for ev := range s.q {
		if err := s.stream.Send(&batonv1.GenerateResponse{Event: ev}); err != nil {
			s.err = err // send and finish see it once done is closed
			return
		}
	}
}

// send queues ev, waiting while the queue is full until ctx ends or the
// client has taken nothing for the write timeout.
func (s *streamSender) send(ctx context.Context, ev *batonv1.GenerateEvent) error {
	select {
	case s.q <- ev:
		return nil
	default:
	}
	expired, stop := s.writeTimer()
	defer stop()
	select {
	case s.q <- ev:
		return nil
	case <-s.done:
		return s.err
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-expired:
		return status.Errorf(codes.DeadlineExceeded,
			"the client read nothing of its stream for %v (--client-write-timeout)", s.timeout)
	}
}

// finish flushes what is queued when the request succeeded, for at most
// the write timeout, and returns the handler's result. A failed request
// returns at once: ending the handler ends the stream and the goroutine.
func (s *streamSender) finish(ctx context.Context, runErr error) error {
	close(s.q)
	if runErr != nil {
		return runErr
	}
	expired, stop := s.writeTimer()
	defer stop()
	select {
	case <-s.done:
		return s.err
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	case <-expired:
		return status.Error(codes.DeadlineExceeded,
			fmt.Sprintf("the client did not read the end of its stream within %v (--client-write-timeout)", s.timeout))
	}
}

// writeTimer starts the write timeout: expired fires when it has passed
// (never when there is none), and stop releases the timer.
func (s *streamSender) writeTimer() (expired <-chan time.Time, stop func() bool) {
	if s.timeout <= 0 {
		return nil, func() bool { return false }
	}
	t := time.NewTimer(s.timeout)
	return t.C, t.Stop
}
