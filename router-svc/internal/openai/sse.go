package openai

import (
	"net/http"
)

// sse writes a server-sent event stream as OpenAI's API does: each event is
// one "data: <json>" line followed by a blank line, and the stream ends with
// "data: [DONE]". JSON never contains a raw newline, so one line suffices.
type sse struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	started bool
	err     error // the first write error: the client has gone
}

func newSSE(w http.ResponseWriter) *sse {
	return &sse{w: w, rc: http.NewResponseController(w)}
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
	if _, err := s.w.Write(b); err != nil {
		s.err = err
		return err
	}
	if err := s.rc.Flush(); err != nil {
		s.err = err
		return err
	}
	return nil
}
