// Package decode is the decode worker: DecodeService.Generate admits a
// request by reserving its KV cache pages (the prealloc queue), pulls the
// prompt's KV cache from the named prefill worker over TransferKV (or
// computes it itself in colocated mode), then decodes it in the continuous
// batch and streams its tokens.
package decode

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
	"google.golang.org/grpc/credentials/insecure"
)

// Service is the decode worker.
type Service struct {
	batonv1.UnimplementedDecodeServiceServer
	svckit.ModelBase
	engine           enginehost.Flags
	handshakeTimeout time.Duration
	idleTimeout      time.Duration
	abortTimeout     time.Duration
	requestTimeout   time.Duration
	firstTokenTimout time.Duration
	creditWindow     int

	host   *enginehost.Host
	logger *slog.Logger
	srv    *svckit.Server
	peers  *peerPool
	codec  *kvtransfer.Codec
	// dialOpts are added to the options prefill workers are dialed with:
	// tests reach in-process prefill workers over memory this way.
	dialOpts []grpc.DialOption
}

// New returns an unconfigured decode worker; svckit.Main configures and runs it.
func New() *Service { return &Service{} }

// AddFlags registers the worker's flags.
func (s *Service) AddFlags(fs *flag.FlagSet) {
	s.ModelBase.AddFlags(fs)
	s.engine.AddFlags(fs)
	fs.DurationVar(&s.handshakeTimeout, "handshake-timeout", 5*time.Second, "how long a prefill worker gets to accept a transfer")
	fs.DurationVar(&s.idleTimeout, "transfer-idle-timeout", 10*time.Second, "abort a transfer when no message arrives from prefill for this long")
	fs.DurationVar(&s.abortTimeout, "abort-ack-timeout", time.Second, "how long to wait for prefill to acknowledge an abort before releasing the pages anyway (the stream is closed first)")
	fs.DurationVar(&s.requestTimeout, "request-timeout", 10*time.Minute, "longest a request may run when its caller set no deadline")
	fs.DurationVar(&s.firstTokenTimout, "first-token-timeout", 2*time.Minute, "abort a request that has no first token this long after it arrived (prealloc wait, transfer and prefill included)")
	fs.IntVar(&s.creditWindow, "credit-window", 32, "KV chunks prefill may send ahead of decode's consumption")
}

// Validate checks the flags.
func (s *Service) Validate() error {
	if s.handshakeTimeout <= 0 || s.idleTimeout <= 0 || s.abortTimeout <= 0 || s.requestTimeout <= 0 || s.firstTokenTimout <= 0 {
		return errors.New("--handshake-timeout, --transfer-idle-timeout, --abort-ack-timeout, --request-timeout and --first-token-timeout must be positive")
	}
	if s.creditWindow < 1 {
		return errors.New("--credit-window: want ≥ 1")
	}
	return s.engine.Validate()
}

// Open loads the model and starts the scheduler.
func (s *Service) Open(ctx context.Context, d *svckit.Deps) error {
	if err := s.ModelBase.Open(ctx, d); err != nil {
		return err
	}
	s.logger = d.Logger
	s.codec = kvtransfer.NewCodec()
	s.peers = newPeerPool(append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()),
		d.Tracing.DialOption(), s.codec.DialOption()}, s.dialOpts...)...)
	var err error
	s.host, err = enginehost.Open(s.Model.Path, s.engine, batonv1.WorkerRole_WORKER_ROLE_DECODE, d.Logger, d.Registry)
	return err
}

// Register installs DecodeService and WorkerService.
func (s *Service) Register(srv *svckit.Server) error {
	s.srv = srv
	s.host.Attach(srv)
	batonv1.RegisterDecodeServiceServer(srv.GRPC, s)
	batonv1.RegisterWorkerServiceServer(srv.GRPC, workerapi.New(s.host))
	srv.OnDrain(s.host.Drain)
	return nil
}

// Close stops the scheduler, unloads the model and closes prefill connections.
func (s *Service) Close() error {
	var errs []error
	if s.host != nil {
		errs = append(errs, s.host.Close())
	}
	if s.peers != nil {
		errs = append(errs, s.peers.close())
	}
	return errors.Join(errs...)
}
