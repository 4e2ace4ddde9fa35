package router

// Write deadlines on the REST gateway's answers. grpc-gateway writes a
// stream's lines to the client with no deadline, so a client that stops
// reading would keep the gateway's goroutine and its socket forever, after
// the router's side of the request (bounded by the stream sender) is long
// over. deadlineWriter arms a deadline before every write and flush.

import (
	"net/http"
	"strings"
	"time"
)

// gatewayTailGrace is how long past the request's deadline the gateway may
// still write (the error line that ends a timed-out stream) when there is
// no write timeout.
const gatewayTailGrace = 5 * time.Second

// gatewayWrites wraps the gateway: every write of an answer must complete
// within the write timeout (--client-write-timeout) — the client takes
// each line the gateway gets within it — or, with none, by the request's
// deadline (--request-timeout) plus gatewayTailGrace. A failed write ends
// the handler, which cancels the router call and closes the connection.
func (s *Service) gatewayWrites(next http.Handler) http.Handler {
	timeout, requestTimeout := s.limits.clientWriteTimeout, s.limits.requestTimeout
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		dw := &deadlineWriter{ResponseWriter: w, rc: http.NewResponseController(w), timeout: timeout, http1: r.ProtoMajor < 2}
		if timeout <= 0 && requestTimeout > 0 {
			dw.end = time.Now().Add(requestTimeout + gatewayTailGrace)
		}
		next.ServeHTTP(dw, r)
		if !dw.stream {
			// A whole answer leaves the connection as it found it, for
			// the next request on it.
			_ = dw.rc.SetWriteDeadline(time.Time{})
			return
		}
		// A stream's connection closes after it (WriteHeader); what
		// net/http writes after the handler (the chunked encoding's end)
		// is bounded like every write of it, so that a client that
		// stopped reading cannot hold the connection's goroutine.
		dw.arm()
	})
}

// deadlineWriter arms a write deadline before each write and flush.
type deadlineWriter struct {
	http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration // per write; 0: end bounds them
	end     time.Time     // zero: none
	http1   bool
	stream  bool // the answer is an NDJSON stream
	// wroteHeader: the header is sent. grpc-gateway's ForwardResponseStream
	// never calls WriteHeader on success (it sets Content-Type and writes),
	// so the first Write or Flush sends it through WriteHeader here,
	// where the stream is recognised, not implicitly below.
	wroteHeader bool
}

func (w *deadlineWriter) arm() {
	d := w.end
	if w.timeout > 0 {
		d = time.Now().Add(w.timeout)
	}
	_ = w.rc.SetWriteDeadline(d)
}

// WriteHeader marks a streamed answer; on HTTP/1 its connection is not
// reused, so that the deadline bounding its end cannot cut short a later
// request on it.
func (w *deadlineWriter) WriteHeader(code int) {
	if code < 200 || w.wroteHeader { // 1xx, or one net/http ignores
		w.ResponseWriter.WriteHeader(code)
		return
	}
	w.wroteHeader = true
	if strings.HasPrefix(w.Header().Get("Content-Type"), "application/x-ndjson") {
		w.stream = true
		if w.http1 {
			w.Header().Set("Connection", "close")
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *deadlineWriter) Write(b []byte) (int, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	w.arm()
	return w.ResponseWriter.Write(b)
}

// Flush implements http.Flusher, which grpc-gateway needs for streams.
func (w *deadlineWriter) Flush() {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	w.arm()
	_ = w.rc.Flush()
}

// Unwrap lets http.ResponseController reach the connection.
func (w *deadlineWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
