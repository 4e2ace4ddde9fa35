package svckit

// The parts of a Server that bound what a client may hold: the admin
// listener (the debug surface kept off the public port), the HTTP servers'
// timeouts and body read deadline, and the gRPC server's stream limit and
// keepalive, with the matching keepalive for the connections a service
// dials.

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// ErrBodyTimeout is the error a request body's Read returns once
// --http-body-timeout has passed.
var ErrBodyTimeout = errors.New("request body not received within --http-body-timeout")

// HTTP server limits. There is deliberately no WriteTimeout: it would cut
// every SSE and NDJSON stream at a fixed age; streaming writers set their
// own per-write deadlines.
const (
	readHeaderTimeout = 10 * time.Second
	idleTimeout       = 120 * time.Second
	maxHeaderBytes    = 64 << 10
)

// registerHTTP installs the handlers every service has: /metrics on the HTTP
// port (or the admin listener with --metrics-on-admin) and, with --pprof,
// the profiles on the admin listener.
func (s *Server) registerHTTP() {
	metrics := promhttp.HandlerFor(s.Registry, promhttp.HandlerOpts{Registry: s.Registry})
	if s.Config.MetricsOnAdmin {
		s.Admin.Handle("GET /metrics", metrics)
	} else {
		s.Mux.Handle("GET /metrics", metrics)
	}
	if s.Config.Pprof {
		s.Admin.HandleFunc("GET /debug/pprof/", pprof.Index)
		s.Admin.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
		s.Admin.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		s.Admin.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		s.Admin.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
}

// listenAdmin binds --admin-addr, unless it is off.
func (s *Server) listenAdmin() error {
	if !s.Config.AdminEnabled() {
		return nil
	}
	lis, err := net.Listen("tcp", s.Config.AdminAddr)
	if err != nil {
		return fmt.Errorf("--admin-addr %s: %w", s.Config.AdminAddr, listenCause(err))
	}
	s.adminLis = lis
	return nil
}

// AdminAddr is the bound admin address ("" when the admin listener is off).
func (s *Server) AdminAddr() string {
	if s.adminLis == nil {
		return ""
	}
	return s.adminLis.Addr().String()
}

// newHTTPServer is an http.Server for h with the limits every listener
// shares: a header deadline, an idle deadline, a header size limit and a
// deadline on reading each request body.
func (s *Server) newHTTPServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           bodyDeadline(orDuration(s.Config.HTTPBodyTimeout, DefaultHTTPBodyTimeout), h),
		ReadHeaderTimeout: readHeaderTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
	}
}

// bodyDeadline gives a request with a body d to deliver all of it: after
// that its Read fails with ErrBodyTimeout (handlers answer 408 or 400), so a
// client trickling an upload cannot hold a handler. The deadline is cleared
// when the body ends, because net/http's read that watches for the client
// going away would otherwise hit it and cancel a long answer's context.
// Requests without a body get no deadline for the same reason.
func bodyDeadline(d time.Duration, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body != nil && r.Body != http.NoBody {
			rc := http.NewResponseController(w)
			if rc.SetReadDeadline(time.Now().Add(d)) == nil {
				r.Body = &deadlineBody{ReadCloser: r.Body, rc: rc}
			}
		}
		next.ServeHTTP(w, r)
	})
}

// deadlineBody is a request body under bodyDeadline's deadline.
type deadlineBody struct {
	io.ReadCloser
	rc   *http.ResponseController
	done bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	switch {
	case err == nil || b.done:
	case errors.Is(err, os.ErrDeadlineExceeded):
		err = fmt.Errorf("%w: %w", ErrBodyTimeout, err)
	case err == io.EOF:
		b.done = true
		_ = b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}

// grpcServerOptions are the limits of the gRPC server: streams per
// connection, and keepalive both ways — the server pings a silent client
// and closes the connection when the ping goes unanswered (so a half-open
// client's streams end and release what they hold), and it accepts the
// clients' own pings down to --grpc-keepalive-min-time, even without a
// stream (the router keeps idle connections to its workers).
func (c *Config) grpcServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxConcurrentStreams(uint32(orUint(c.GRPCMaxConcurrentStreams, DefaultGRPCMaxConcurrentStreams))),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			Time:    orDuration(c.GRPCKeepaliveTime, DefaultGRPCKeepaliveTime),
			Timeout: orDuration(c.GRPCKeepaliveTimeout, DefaultGRPCKeepaliveTimeout),
		}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             orDuration(c.GRPCKeepaliveMinTime, DefaultGRPCKeepaliveMinTime),
			PermitWithoutStream: true,
		}),
	}
}

// KeepaliveDialOption is the keepalive of the connections a service dials
// (router to workers, decode to prefill): a connection silent for
// --grpc-keepalive-time is pinged, idle or not, and closed when no answer
// comes within --grpc-keepalive-timeout, failing its RPCs with UNAVAILABLE
// instead of leaving them waiting on a dead peer. gRPC pings at most every
// 10s whatever the flag says.
func (c *Config) KeepaliveDialOption() grpc.DialOption {
	return grpc.WithKeepaliveParams(keepalive.ClientParameters{
		Time:                orDuration(c.GRPCKeepaliveTime, DefaultGRPCKeepaliveTime),
		Timeout:             orDuration(c.GRPCKeepaliveTimeout, DefaultGRPCKeepaliveTimeout),
		PermitWithoutStream: true,
	})
}
