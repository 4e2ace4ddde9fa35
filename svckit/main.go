package svckit

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/baton-serving/baton/svckit/tlsconf"
	"github.com/baton-serving/baton/tracing"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
)

// Service is what a Baton service plugs into Main. A Service may also have a
// GRPCServerOptions() []grpc.ServerOption method, called after Validate, to
// add options to its gRPC server (a codec, message size limits).
type Service interface {
	// AddFlags registers the service's own flags.
	AddFlags(fs *flag.FlagSet)
	// Validate checks the flags' values; errors name the flag.
	Validate() error
	// Open loads what the service needs (a model, connections) before any
	// port is bound; errors are reported as one line and exit 1, or 2 for
	// one wrapping a UsageError (a flag's value the machine cannot serve).
	Open(ctx context.Context, srv *Deps) error
	// Register installs the service's gRPC services and HTTP handlers, and
	// its readiness checks and drain hooks.
	Register(srv *Server) error
	// Close releases what Open acquired; called once after the servers stop.
	Close() error
}

// Deps is what Open gets: the logger and tracing set up from flags.
type Deps struct {
	Logger   *slog.Logger
	Tracing  *tracing.Provider
	Config   Config
	Registry *prometheus.Registry // the service's metrics registry
	// TLS is the identity from --tls-cert, --tls-key and --tls-ca, nil
	// without them: dial workers with TLS.DialOption(role).
	TLS *tlsconf.Identity
}

// Spec names a service for Main.
type Spec struct {
	Name     string // binary name, e.g. "router-svc"
	Summary  string // one line for --help
	Defaults Config // default listen addresses etc.
}

// Main runs a service: flags (with environment overrides), logging, tracing,
// Open, servers, and graceful shutdown on SIGINT/SIGTERM. It returns the
// process exit code: 0 after a clean shutdown or --help, 2 for bad flags, 1 for
// any other start-up or serving failure. Start-up errors are one line on
// stderr, never a stack trace.
func Main(args []string, stderr io.Writer, spec Spec, svc Service) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	fail := func(code int, err error) int {
		fmt.Fprintf(stderr, "%s: %v\n", spec.Name, err)
		return code
	}
	var cfg Config
	fs := NewFlagSet(spec.Name, spec.Summary, stderr)
	cfg.AddFlags(fs, spec.Defaults)
	svc.AddFlags(fs)
	if err := ParseFlags(fs, args, nil); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return fail(2, err)
	}
	if err := cfg.Validate(); err != nil {
		return fail(2, err)
	}
	if err := svc.Validate(); err != nil {
		return fail(2, err)
	}
	logger, err := NewLogger(stderr, cfg.LogLevel, cfg.LogFormat, spec.Name)
	if err != nil {
		return fail(2, err)
	}
	tp, err := tracing.Init(ctx, spec.Name, logger)
	if err != nil {
		return fail(1, err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := tp.Shutdown(sctx); err != nil {
			logger.Warn("flushing traces", "err", err)
		}
	}()
	// Bind the ports first: a port conflict is reported at once, before a
	// possibly long model load.
	var sopts ServerOptions
	if o, ok := svc.(interface{ GRPCServerOptions() []grpc.ServerOption }); ok {
		sopts.GRPCOptions = o.GRPCServerOptions()
	}
	var tlsID *tlsconf.Identity
	if cfg.TLS.Enabled() {
		if tlsID, err = tlsconf.Load(cfg.TLS, logger); err != nil {
			return fail(2, err)
		}
		// A service with a TLSRole (a worker) serves gRPC with mutual TLS;
		// the router's listeners are client-facing and stay plaintext.
		if r, ok := svc.(interface{ TLSRole() tlsconf.Role }); ok {
			if tlsID.Role() != r.TLSRole() {
				return fail(2, fmt.Errorf("--tls-cert %s: certificate role %s, want %s", cfg.TLS.Cert, tlsID.Role(), r.TLSRole()))
			}
			sopts.Peers = tlsconf.PolicyFor(r.TLSRole())
		} else if tlsID.Role() != tlsconf.Router {
			return fail(2, fmt.Errorf("--tls-cert %s: certificate role %s, want %s", cfg.TLS.Cert, tlsID.Role(), tlsconf.Router))
		}
		sopts.TLS = tlsID
	}
	srv, err := NewServer(spec.Name, cfg, logger, tp, sopts)
	if err != nil {
		return fail(1, err)
	}
	if err := svc.Open(ctx, &Deps{Logger: logger, Tracing: tp, Config: cfg, Registry: srv.Registry, TLS: tlsID}); err != nil {
		srv.closeListeners()
		if ue := (*UsageError)(nil); errors.As(err, &ue) {
			return fail(2, err)
		}
		return fail(1, err)
	}
	defer func() {
		if err := svc.Close(); err != nil {
			logger.Warn("closing", "err", err)
		}
	}()
	if err := svc.Register(srv); err != nil {
		srv.closeListeners()
		return fail(1, err)
	}
	if err := srv.Run(ctx); err != nil {
		logger.Error("serving failed", "err", err)
		return 1
	}
	return 0
}
