package svckit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/baton-serving/baton/svckit/tlsconf"
	"github.com/baton-serving/baton/tracing"
	"github.com/baton-serving/baton/tracing/gpu"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
)

// Server is a service's gRPC and HTTP servers and their shared state. Build it
// with NewServer, register services on GRPC and handlers on Mux, then Run.
type Server struct {
	Name     string
	Config   Config
	Logger   *slog.Logger
	Tracing  *tracing.Provider
	Registry *prometheus.Registry
	GRPC     *grpc.Server
	Health   *health.Server
	Mux      *http.ServeMux
	// Admin is the admin listener's mux (admin.go, --admin-addr): the
	// debug surface. Handlers may be registered on it even when the
	// listener is off; they are then not served.
	Admin *http.ServeMux
	// WrapMux, when set before Run, wraps Mux on the public HTTP listener
	// (never Admin): the router's CORS (--cors-allowed-origins), which
	// answers preflights before any route, key check or limiter.
	WrapMux func(http.Handler) http.Handler
	// TLS is the service's mutual-TLS identity (nil without --tls-*): dial
	// workers with TLS.DialOption(role).
	TLS *tlsconf.Identity

	draining atomic.Bool
	mu       sync.Mutex
	checks   []*readinessCheck
	onDrain  []func(ctx context.Context)
	grpcLis  net.Listener
	httpLis  net.Listener
	adminLis net.Listener // nil: --admin-addr off
	gpus     *gpu.Monitor
}

// ServerOptions adds to a Server's defaults.
type ServerOptions struct {
	GRPCOptions []grpc.ServerOption
	// TLS is the identity the service dials workers with (Server.TLS).
	// With Peers too, gRPC is served with mutual TLS only, each call
	// authorized by its peer's certificate role (a worker's server);
	// without Peers it is plaintext (the router's client-facing port).
	TLS   *tlsconf.Identity
	Peers tlsconf.Policy
}

// NewServer creates the servers and binds both listen addresses, so that a
// port in use or an unusable address is reported before anything starts.
func NewServer(name string, cfg Config, logger *slog.Logger, tp *tracing.Provider, opts ServerOptions) (*Server, error) {
	s := &Server{Name: name, Config: cfg, Logger: logger, Tracing: tp,
		Registry: tracing.NewRegistry(name), Health: health.NewServer(), Mux: http.NewServeMux(), Admin: http.NewServeMux(), TLS: opts.TLS}
	var tlsOpts []grpc.ServerOption
	if opts.TLS != nil && opts.Peers != nil {
		tlsOpts = tlsconf.ServerOptions(opts.TLS, opts.Peers, Status) // credentials and the role check, before the drain guard
	}
	gopts := append(append(tlsOpts,
		tp.ServerOption(),
		grpc.ChainUnaryInterceptor(s.unaryDrainGuard),
		grpc.ChainStreamInterceptor(s.streamDrainGuard),
	), append(cfg.grpcServerOptions(), opts.GRPCOptions...)...)
	s.GRPC = grpc.NewServer(gopts...)
	healthpb.RegisterHealthServer(s.GRPC, s.Health)
	if cfg.GRPCReflection {
		reflection.Register(s.GRPC)
	}
	// Not serving until Run has started both servers.
	s.Health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	s.gpus = gpu.New(logger)
	s.Registry.MustRegister(s.gpus)

	s.registerHTTP()
	s.Mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"status":"ok"}` + "\n"))
	})
	s.Mux.HandleFunc("GET /health/ready", s.serveReady)

	var err error
	if s.grpcLis, err = net.Listen("tcp", cfg.GRPCAddr); err != nil {
		return nil, fmt.Errorf("--grpc-addr %s: %w", cfg.GRPCAddr, listenCause(err))
	}
	if s.httpLis, err = net.Listen("tcp", cfg.HTTPAddr); err != nil {
		s.grpcLis.Close()
		return nil, fmt.Errorf("--http-addr %s: %w", cfg.HTTPAddr, listenCause(err))
	}
	if err := s.listenAdmin(); err != nil {
		s.grpcLis.Close()
		s.httpLis.Close()
		return nil, err
	}
	return s, nil
}

// listenCause strips net.OpError's repetition of the address.
func listenCause(err error) error {
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Err != nil {
		return oe.Err
	}
	return err
}

// closeListeners releases the ports of a server that will not Run.
func (s *Server) closeListeners() {
	s.grpcLis.Close()
	s.httpLis.Close()
	if s.adminLis != nil {
		s.adminLis.Close()
	}
}

// GRPCAddr is the bound gRPC address (useful when the port was 0).
func (s *Server) GRPCAddr() string { return s.grpcLis.Addr().String() }

// HTTPAddr is the bound HTTP address.
func (s *Server) HTTPAddr() string { return s.httpLis.Addr().String() }

// OnDrain adds a function run at shutdown after new work is refused and before
// the servers stop; it should finish or abort in-flight work by ctx's deadline.
func (s *Server) OnDrain(fn func(ctx context.Context)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onDrain = append(s.onDrain, fn)
}

// Draining reports whether shutdown has begun.
func (s *Server) Draining() bool { return s.draining.Load() }

// exempt lists services that keep answering while a server drains, so that
// probes see NOT_SERVING rather than an error.
func exempt(fullMethod string) bool {
	return strings.HasPrefix(fullMethod, "/grpc.health.v1.") || strings.HasPrefix(fullMethod, "/grpc.reflection.")
}

func (s *Server) unaryDrainGuard(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if s.draining.Load() && !exempt(info.FullMethod) {
		return nil, Status(ErrDraining)
	}
	return h(ctx, req)
}

func (s *Server) streamDrainGuard(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if s.draining.Load() && !exempt(info.FullMethod) {
		return Status(ErrDraining)
	}
	return h(srv, ss)
}

// Run serves until ctx is cancelled, then shuts down gracefully: readiness
// turns NOT_SERVING, new RPCs are refused with UNAVAILABLE, drain hooks get
// the shutdown timeout to finish in-flight work, and the servers stop. It
// returns nil after a clean shutdown.
func (s *Server) Run(ctx context.Context) error {
	// REST and OpenAI requests honour an incoming traceparent.
	public := http.Handler(s.Mux)
	if s.WrapMux != nil {
		public = s.WrapMux(public)
	}
	httpSrv, adminSrv := s.newHTTPServer(s.Tracing.HTTPHandler(public)), s.newHTTPServer(s.Admin)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := s.GRPC.Serve(s.grpcLis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return fmt.Errorf("grpc server: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		if err := httpSrv.Serve(s.httpLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("http server: %w", err)
		}
		return nil
	})
	if s.adminLis != nil {
		g.Go(func() error {
			if err := adminSrv.Serve(s.adminLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("admin server: %w", err)
			}
			return nil
		})
	}
	g.Go(func() error {
		s.refreshHealth(gctx)
		t := time.NewTicker(healthRefresh)
		defer t.Stop()
		for {
			select {
			case <-gctx.Done():
				return nil
			case <-t.C:
				s.refreshHealth(gctx)
			}
		}
	})
	g.Go(func() error { s.gpus.Run(gctx, gpu.DefaultRefresh); return nil })
	s.Logger.Info("serving", "grpc_addr", s.GRPCAddr(), "http_addr", s.HTTPAddr(), "admin_addr", s.AdminAddr())
	g.Go(func() error {
		<-gctx.Done()
		s.shutdown(httpSrv)
		_ = adminSrv.Close() // after the drain, which it may show
		return nil
	})
	return g.Wait()
}

func (s *Server) shutdown(httpSrv *http.Server) {
	start := time.Now()
	s.Logger.Info("shutting down", "timeout", s.Config.ShutdownTimeout.String())
	s.draining.Store(true)
	s.Health.Shutdown() // every service NOT_SERVING
	ctx, cancel := context.WithTimeout(context.Background(), s.Config.ShutdownTimeout)
	defer cancel()
	s.mu.Lock()
	hooks := append([]func(context.Context){}, s.onDrain...)
	s.mu.Unlock()
	for _, h := range hooks {
		h(ctx)
	}
	stopped := make(chan struct{})
	go func() { s.GRPC.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-ctx.Done():
		s.Logger.Warn("graceful stop timed out; closing remaining streams")
		s.GRPC.Stop()
		<-stopped
	}
	if err := httpSrv.Shutdown(ctx); err != nil {
		_ = httpSrv.Close()
	}
	s.Logger.Info("stopped", "took", time.Since(start).Round(time.Millisecond).String())
}

// SetGPUInUse names, by its UUID, the GPU this service computes on, for
// the baton_gpu_in_use gauge ("" for none: the CPU).
func (s *Server) SetGPUInUse(uuid string) { s.gpus.SetInUse(uuid) }
