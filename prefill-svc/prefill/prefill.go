// Package prefill is the prefill worker: PrefillService.TransferKV computes a
// prompt in the continuous batch (prefill-only mode) and streams its KV cache
// pages to the decode worker that asked, as they are completed, within the
// credits decode grants.
//
// It is the prefill worker's library package, outside internal/ so that
// decode-svc's tests can run a real prefill worker beside a real decode
// worker in one process; prefill-svc's main is its only other user.
package prefill

import (
	"context"
	"errors"
	"flag"
	"log/slog"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/kvtransfer"
	"github.com/baton-serving/baton/svckit"
	"github.com/baton-serving/baton/svckit/enginehost"
	"github.com/baton-serving/baton/svckit/workerapi"
	"google.golang.org/grpc"
)

// Service is the prefill worker.
type Service struct {
	batonv1.UnimplementedPrefillServiceServer
	svckit.ModelBase
	engine           enginehost.Flags
	handshakeTimeout time.Duration
	idleTimeout      time.Duration

	codec  *kvtransfer.Codec
	host   *enginehost.Host
	logger *slog.Logger
	srv    *svckit.Server
}

// New returns an unconfigured prefill worker; svckit.Main configures and runs it.
func New() *Service { return &Service{codec: kvtransfer.NewCodec()} }

// GRPCServerOptions installs the KV codec: chunks are sent without copying
// their pages into protobuf messages; other messages use the default codec.
func (s *Service) GRPCServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{s.codec.ServerOption()}
}

// AddFlags registers the worker's flags.
func (s *Service) AddFlags(fs *flag.FlagSet) {
	s.ModelBase.AddFlags(fs)
	s.engine.AddFlags(fs)
	fs.DurationVar(&s.handshakeTimeout, "handshake-timeout", 5*time.Second, "how long a new TransferKV stream may take to send its handshake")
	fs.DurationVar(&s.idleTimeout, "transfer-idle-timeout", 10*time.Second, "abort a transfer when decode grants no credit for this long while chunks are waiting")
}

// Validate checks the flags.
func (s *Service) Validate() error {
	if s.handshakeTimeout <= 0 || s.idleTimeout <= 0 {
		return errors.New("--handshake-timeout and --transfer-idle-timeout must be positive")
	}
	return s.engine.Validate()
}

// Open loads the model and starts the scheduler.
func (s *Service) Open(ctx context.Context, d *svckit.Deps) error {
	if err := s.ModelBase.Open(ctx, d); err != nil {
		return err
	}
	s.logger = d.Logger
	var err error
	s.host, err = enginehost.Open(s.Model.Path, s.engine, batonv1.WorkerRole_WORKER_ROLE_PREFILL, d.Logger, d.Registry)
	return err
}

// Register installs PrefillService and WorkerService.
func (s *Service) Register(srv *svckit.Server) error {
	s.srv = srv
	s.host.Attach(srv)
	batonv1.RegisterPrefillServiceServer(srv.GRPC, s)
	batonv1.RegisterWorkerServiceServer(srv.GRPC, workerapi.New(s.host))
	srv.OnDrain(s.host.Drain)
	return nil
}

// Close stops the scheduler and unloads the model.
func (s *Service) Close() error {
	if s.host != nil {
		return s.host.Close()
	}
	return nil
}
