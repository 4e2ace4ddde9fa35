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
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/svckit"
	"github.com/baton-serving/baton/svckit/apiconv"
	"github.com/baton-serving/baton/svckit/constrain"
	"github.com/baton-serving/baton/svckit/enginehost"
	"github.com/baton-serving/baton/svckit/tlsconf"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Service is the decode worker.
type Service struct {
	batonv1.UnimplementedDecodeServiceServer
	enginehost.Worker
	abortTimeout      time.Duration
	requestTimeout    time.Duration
	firstTokenTimeout time.Duration
	creditWindow      int
	maxN              int // --max-n

	peerLimits peerLimits // --prefill-allow, --prefill-idle-timeout, --max-prefill-conns
	peers      *peerPool
	// dialOpts are added to the options prefill workers are dialed with:
	// tests reach in-process prefill workers over memory this way.
	dialOpts []grpc.DialOption
	// grammars compiles requests' grammars and JSON Schemas against the
	// model's vocabulary, built once by Open.
	grammars *constrain.Compiler
	// maxTokenBytes is the model's longest token text (bytes or control
	// name), for the bound on prompt log-probabilities with their texts.
	maxTokenBytes int
}

// New returns an unconfigured decode worker; svckit.Main configures and runs it.
func New() *Service {
	return &Service{Worker: enginehost.NewWorker(batonv1.WorkerRole_WORKER_ROLE_DECODE)}
}

// AddFlags registers the worker's flags.
func (s *Service) AddFlags(fs *flag.FlagSet) {
	s.Worker.AddFlags(fs, enginehost.TransferHelp{
		Handshake: "how long decode waits for a prefill worker to accept a transfer, connecting included (prefill's own --handshake-timeout bounds its wait for decode's handshake)",
		Idle:      "how long decode waits for prefill's next message (a KV chunk, a heartbeat, PrefillDone) once the transfer is accepted; then decode aborts the transfer (prefill's own --transfer-idle-timeout bounds its wait for decode's credits)",
	})
	fs.DurationVar(&s.abortTimeout, "abort-ack-timeout", time.Second, "how long to wait for prefill to acknowledge an abort before releasing the pages anyway (the stream is closed first)")
	fs.DurationVar(&s.requestTimeout, "request-timeout", 10*time.Minute, "longest a request may run when its caller set no deadline")
	fs.DurationVar(&s.firstTokenTimeout, "first-token-timeout", 2*time.Minute, "abort a request that has no first token this long after it arrived (prealloc wait, transfer and prefill included)")
	fs.IntVar(&s.creditWindow, "credit-window", 32, "KV chunks prefill may send ahead of decode's consumption")
	fs.IntVar(&s.maxN, "max-n", apiconv.DefaultMaxN, "most continuations (SamplingParams.n) one request may ask for; they share the prompt's KV pages")
	s.peerLimits.addFlags(fs)
}

// Validate checks the flags.
func (s *Service) Validate() error {
	if s.HandshakeTimeout <= 0 || s.IdleTimeout <= 0 || s.abortTimeout <= 0 || s.requestTimeout <= 0 || s.firstTokenTimeout <= 0 {
		return errors.New("--handshake-timeout, --transfer-idle-timeout, --abort-ack-timeout, --request-timeout and --first-token-timeout must be positive")
	}
	if s.creditWindow < 1 {
		return errors.New("--credit-window: want ≥ 1")
	}
	if err := apiconv.CheckMaxN(s.maxN); err != nil {
		return err
	}
	if err := s.peerLimits.validate(); err != nil {
		return err
	}
	return s.Engine.Validate()
}

// Open loads the model and starts the scheduler.
func (s *Service) Open(ctx context.Context, d *svckit.Deps) error {
	// With --tls-*, prefill workers are dialed with decode's certificate
	// and must present a prefill certificate.
	creds := grpc.WithTransportCredentials(insecure.NewCredentials())
	if d.TLS != nil {
		creds = d.TLS.DialOption(tlsconf.Prefill)
	}
	s.peerLimits.warn(d.Logger)
	s.peers = newPeerPool(s.peerLimits, append([]grpc.DialOption{creds,
		d.Tracing.DialOption(), s.Codec.DialOption(), d.Config.KeepaliveDialOption()}, s.dialOpts...)...)
	if err := s.Worker.Open(ctx, d); err != nil {
		return err
	}
	s.grammars = constrain.New(s.Host.Tokenizer, s.Host.Config.Vocab, 0)
	s.maxTokenBytes = apiconv.MaxTokenBytes(s.Host.Tokenizer, s.Host.Config.Vocab)
	return nil
}

// Register installs DecodeService and WorkerService.
func (s *Service) Register(srv *svckit.Server) error {
	s.Worker.Register(srv)
	batonv1.RegisterDecodeServiceServer(srv.GRPC, s)
	return nil
}

// Close stops the scheduler, unloads the model and closes prefill connections.
func (s *Service) Close() error {
	errs := []error{s.Worker.Close()}
	if s.peers != nil {
		errs = append(errs, s.peers.close())
	}
	return errors.Join(errs...)
}
