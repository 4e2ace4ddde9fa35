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

// sseEndGrace bounds the last writes of a request that has ended — the
// error that answers it (a status before the stream's first event, an
// error event after it) and what is still queued — so that a client that
// reads gets its answer and one that does not is released promptly: the
// write timeout, if shorter.
const sseEndGrace = time.Second

// sseTailGrace is how far past the request timeout the stream itself
// lasts, so that the Generator's own end of the request at that timeout
// (DEADLINE_EXCEEDED, as the REST gateway's gatewayTailGrace) arrives
// first and is answered to the client.
const sseTailGrace = 5 * time.Second

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
// interrupt: an Abort, the router's deadline) must not destroy its answer:
// before the first event it leaves the connection alone, so the handler
// writes the real status (under a short deadline of its own, see refuse);
// after it, the writer gets a short grace (sseEndGrace) to write what is
// queued and the error event that ends the stream, so with no write timeout
// a stuck client is still released within that grace of the request's end.
// A client that has left gets a deadline in the past.
type sse struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration // the write timeout; 0: none
	http1   bool
	end     time.Time       // the stream's deadline; zero: none
	client  context.Context // the HTTP request's own: done when the client left

	// The generator's side.
	started   bool  // set under mu, read by the generator without it
	err       error // the first error a send returned: the stream is over
	q         chan sseChunk
	stopWatch func() bool

	// The writer's side.
	exited chan struct{} // closed when the writer has returned
	werr   error         // why the writer stopped, set before done closes

	mu       sync.Mutex
	stopped  error         // the interrupt's cause
	stopCh   chan struct{} // closed with stopped set
	graceEnd time.Time     // with stopped after the start: the last writes' deadline
	finished bool          // the handler is done with the connection: hands off
}

// sseChunk is one event's bytes and when the generator handed it over.
type sseChunk struct {
	b  []byte
	at time.Time
}

// newSSE prepares a stream for the request r; ctx ending interrupts it.
// close must be called once the generator is done with it.
func newSSE(ctx context.Context, w http.ResponseWriter, r *http.Request, timeout time.Duration) *sse {
	s := &sse{w: w, rc: http.NewResponseController(w), timeout: timeout, http1: r.ProtoMajor < 2, client: r.Context(),
		q: make(chan sseChunk, sseQueue), exited: make(chan struct{}), stopCh: make(chan struct{})}
	s.end, _ = ctx.Deadline()
	s.stopWatch = context.AfterFunc(ctx, func() { s.interrupt(context.Cause(ctx)) })
	return s
}

// grace is how long the last writes after the request's end may take.
func (s *sse) grace() time.Duration {
	if s.timeout > 0 && s.timeout < sseEndGrace {
		return s.timeout
	}
	return sseEndGrace
}

// start sends the headers and starts the writer; once the request has
// ended it starts nothing and returns why, so that the handler answers
// with the real status instead.
func (s *sse) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped != nil {
		return s.stopped
	}
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
	return nil
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
// it or stops (bounded by the write timeout), or the request ends: then
// the generator does not wait for the client at all.
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
	case <-s.stopCh:
		select {
		case s.q <- c:
			return nil
		default: // full, and the request is over: drop it
			s.mu.Lock()
			defer s.mu.Unlock()
			return s.stopped
		}
	}
}

// failed says whether the writer has stopped on an error: the client
// cannot be written any more.
func (s *sse) failed() bool {
	select {
	case <-s.exited:
		return s.werr != nil
	default:
		return false
	}
}

// interrupt records the request's end. The router calls it when it ends
// the request (an Abort, its deadline); so does the stream's context
// ending. Before the stream has started it only records it (start then
// refuses), so that the handler can still answer with the real status;
// after, the writes still pending get sseEndGrace (at most the write
// timeout) to complete, the error event that ends the stream among them,
// so that a client that reads gets it and one that does not is released
// soon; a client that has left gets a deadline in the past. Once the
// handler is done with the connection (close, refuse) it touches nothing.
func (s *sse) interrupt(cause error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped != nil || s.finished {
		return
	}
	if cause == nil {
		cause = context.Canceled
	}
	s.stopped = cause
	close(s.stopCh)
	if !s.started {
		return
	}
	s.graceEnd = time.Now().Add(s.grace())
	if s.client.Err() != nil {
		s.graceEnd = time.Unix(1, 0) // nobody is listening
	}
	_ = s.rc.SetWriteDeadline(s.graceEnd)
}

// refuse writes the answer of a request that ended before its stream
// started (a status and an error body), under a short deadline of its own
// — a client that reads nothing must not hold the handler — and clears the
// deadline afterwards, for the next request on the connection.
func (s *sse) refuse(write func()) {
	s.mu.Lock()
	s.finished = true
	s.mu.Unlock()
	_ = s.rc.SetWriteDeadline(time.Now().Add(s.grace()))
	write()
	_ = s.rc.Flush()
	_ = s.rc.SetWriteDeadline(time.Time{})
}

// close waits for the writer to write what is queued — under the same
// deadlines — and returns why it stopped, if it failed. After it the
// interrupt touches nothing: the connection may already serve another
// request (or, on HTTP/2, be gone).
func (s *sse) close() error {
	if s.started {
		close(s.q)
		<-s.exited
	}
	s.mu.Lock()
	if s.started && s.werr == nil && s.stopped == nil && !s.finished {
		// What net/http writes after the handler (the chunked
		// encoding's end) is bounded too; the connection closes after
		// it (see start). After an interrupt its grace bounds it.
		if d := s.tailDeadline(); !d.IsZero() {
			_ = s.rc.SetWriteDeadline(d)
		}
	}
	s.finished = true
	s.mu.Unlock()
	s.stopWatch()
	return s.werr
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
	deadline := clientwrite.Deadline(oldest, s.timeout)
	if !s.end.IsZero() && (deadline.IsZero() || s.end.Before(deadline)) {
		deadline = s.end
	}
	if s.stopped != nil && (deadline.IsZero() || s.graceEnd.Before(deadline)) {
		deadline = s.graceEnd // the request is over: its last writes
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
