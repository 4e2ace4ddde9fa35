package openai

import (
	"net/http"
	"time"
)

// sse writes a server-sent event stream as OpenAI's API does: each event is
// one "data: <json>" line followed by a blank line, and the stream ends with
// "data: [DONE]". JSON never contains a raw newline, so one line suffices.
type sse struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration // bound on one write and flush; 0: none
	started bool
	err     error // the first write error: the client has gone
}

func newSSE(w http.ResponseWriter, timeout time.Duration) *sse {
	return &sse{w: w, rc: http.NewResponseController(w), timeout: timeout}
}

// start sends the headers.
func (s *sse) start() {
	h := s.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	// Proxies such as nginx would otherwise buffer the stream.
	h.Set("X-Accel-Buffering", "no")
	s.w.WriteHeader(http.StatusOK)
	s.started = true
}

// send writes v as one event and flushes it to the client.
func (s *sse) send(v any) error {
	b, err := marshal(v)
	if err != nil {
		return err
	}
	return s.write(append(append([]byte("data: "), b...), '\n', '\n'))
}

// done ends the stream.
func (s *sse) done() error { return s.write([]byte("data: [DONE]\n\n")) }

func (s *sse) write(b []byte) error {
	if s.err != nil {
		return s.err
	}
	if s.timeout > 0 {
		// A client that stops reading fills the socket's buffers and
		// then blocks the write; the deadline turns that into an error
		// that aborts the request. Writers without deadlines (tests'
		// recorders) need none.
		_ = s.rc.SetWriteDeadline(time.Now().Add(s.timeout))
	}
	if _, err := s.w.Write(b); err != nil {
		s.err = err
		return err
	}
	if err := s.rc.Flush(); err != nil {
		s.err = err
		return err
	}
	if s.timeout > 0 {
		// The connection outlives the request (keep-alive): leave no
		// deadline behind for the next one.
		_ = s.rc.SetWriteDeadline(time.Time{})
	}
	return nil
}
