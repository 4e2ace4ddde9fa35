package openai

import (
	"context"
	"errors"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/baton-serving/baton/router-svc/internal/clientwrite"
)

// sseQueue is how many events may wait for a slow client before the
// request itself waits (as the gRPC stream sender's).
const sseQueue = 64

// sseBatch bounds how many queued bytes one write carries.
const sseBatch = 64 << 10

// sse writes a server-sent event stream as OpenAI's API does: each event is
// one "data: <json>" line followed by a blank line, and the stream ends with
// "data: [DONE]". JSON never contains a raw newline, so one line suffices.
//
// Events are written by a goroutine of the stream's own, so that a client
// that stops reading blocks only that goroutine, never the request: the
// generator hands events over through a bounded queue. Every write carries
// a deadline, the minimum-progress rule of package clientwrite: the oldest
// event it carries must be taken by the client within the write timeout of
// being queued, or the write fails and the stream is aborted — whether the
// client takes nothing or drips and falls behind. The end of the request
// (its context: the client leaving, the request timeout; or the router's
// interrupt: an Abort, the router's deadline) sets a deadline in the past,
// which frees a blocked write at once, so with no write timeout a stuck
// client is still bounded by the request's end.
type sse struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration // the write timeout; 0: none
	http1   bool
	end     time.Time // the request's deadline; zero: none

	// The generator's side.
	started   bool
	err       error // the first error a send returned: the stream is over
	q         chan sseChunk
	stopWatch func() bool

	// The writer's side.
	exited chan struct{} // closed when the writer has returned
	werr   error         // why the writer stopped, set before done closes

	mu      sync.Mutex
	stopped error // the interrupt's cause; no deadline is set after it
}

// sseChunk is one event's bytes and when the generator handed it over.
type sseChunk struct {
	b  []byte
	at time.Time
}

// newSSE prepares a stream for the request r; ctx ending interrupts it.
// close must be called once the generator is done with it.
func newSSE(ctx context.Context, w http.ResponseWriter, r *http.Request, timeout time.Duration) *sse {
	s := &sse{w: w, rc: http.NewResponseController(w), timeout: timeout, http1: r.ProtoMajor < 2,
		q: make(chan sseChunk, sseQueue), exited: make(chan struct{})}
	s.end, _ = ctx.Deadline()
	s.stopWatch = context.AfterFunc(ctx, func() { s.interrupt(context.Cause(ctx)) })
	return s
}

// start sends the headers and starts the writer.
func (s *sse) start() {
	h := s.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	// Proxies such as nginx would otherwise buffer the stream.
	h.Set("X-Accel-Buffering", "no")
	if s.http1 {
		// The connection is not reused after a stream: the write
		// deadline that bounds its end would outlive it and cut a later
		// request short. (HTTP/2 deadlines are the stream's own.)
		h.Set("Connection", "close")
	}
	s.w.WriteHeader(http.StatusOK)
	s.started = true
	go s.loop()
}

// send writes v as one event.
func (s *sse) send(v any) error {
	b, err := marshal(v)
	if err != nil {
		return err
	}
	return s.write(append(append([]byte("data: "), b...), '\n', '\n'))
}

// done ends the stream.
func (s *sse) done() error { return s.write([]byte("data: [DONE]\n\n")) }

// write queues b, waiting while the queue is full until the writer takes
// it or stops (bounded by the write timeout, or by the request's end).
func (s *sse) write(b []byte) error {
	if s.err != nil {
		return s.err
	}
	c := sseChunk{b: b, at: time.Now()}
	select {
	case <-s.exited:
		s.err = s.werr
		return s.err
	default:
	}
	select {
	case s.q <- c:
		return nil
	case <-s.exited:
		s.err = s.werr
		return s.err
	}
}

// interrupt ends the stream: a pending write fails at once and no other
// starts. The router calls it when it ends the request (an Abort, its
// deadline); so does the request's context ending.
func (s *sse) interrupt(cause error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped != nil {
		return
	}
	if cause == nil {
		cause = context.Canceled
	}
	s.stopped = cause
	_ = s.rc.SetWriteDeadline(time.Unix(1, 0))
}

// close waits for the writer to write what is queued — under the same
// deadlines — and returns why it stopped, if it failed.
func (s *sse) close() error {
	defer s.stopWatch()
	if !s.started {
		return nil
	}
	close(s.q)
	<-s.exited
	if s.werr != nil {
		return s.werr
	}
	// What net/http writes after the handler (the chunked encoding's
	// end) is bounded too; the connection closes after it (see start).
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped == nil {
		if d := s.tailDeadline(); !d.IsZero() {
			_ = s.rc.SetWriteDeadline(d)
		}
	}
	return nil
}

func (s *sse) tailDeadline() time.Time {
	if s.timeout > 0 {
		return time.Now().Add(s.timeout)
	}
	return s.end
}

func (s *sse) loop() {
	defer close(s.exited)
	for c := range s.q {
		batch, oldest := c.b, c.at
		open := true
	gather:
		for len(batch) < sseBatch {
			select {
			case more, ok := <-s.q:
				if !ok {
					open = false
					break gather
				}
				batch = append(batch, more.b...)
			default:
				break gather
			}
		}
		if err := s.flush(batch, oldest); err != nil {
			s.werr = err
			return
		}
		if !open {
			return
		}
	}
}

// flush writes and flushes b, whose oldest event was queued at oldest,
// under the minimum-progress deadline (or the request's end).
func (s *sse) flush(b []byte, oldest time.Time) error {
	s.mu.Lock()
	if s.stopped != nil {
		s.mu.Unlock()
		return s.stopped
	}
	deadline := clientwrite.Deadline(oldest, s.timeout)
	if !s.end.IsZero() && (deadline.IsZero() || s.end.Before(deadline)) {
		deadline = s.end
	}
	// Writers without deadlines (tests' recorders) refuse; they need none.
	_ = s.rc.SetWriteDeadline(deadline)
	s.mu.Unlock()
	_, err := s.w.Write(b)
	if err == nil {
		err = s.rc.Flush()
	}
	if err == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.stopped != nil:
		return s.stopped
	case s.timeout > 0 && errors.Is(err, os.ErrDeadlineExceeded) && (s.end.IsZero() || time.Now().Before(s.end)):
		return clientwrite.SlowClient(s.timeout)
	}
	return err
}
