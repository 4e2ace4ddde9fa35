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

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/svckit"
	"github.com/baton-serving/baton/svckit/apiconv"
	"github.com/baton-serving/baton/svckit/constrain"
	"github.com/baton-serving/baton/svckit/enginehost"
	"google.golang.org/grpc"
)

// Service is the prefill worker.
type Service struct {
	batonv1.UnimplementedPrefillServiceServer
	enginehost.Worker
	live liveTransfers // by request id, so that a retry replaces a stale attempt
	// grammars compiles requests' grammars and JSON Schemas against the
	// model's vocabulary, built once by Open.
	grammars *constrain.Compiler
	// maxTokenBytes is the model's longest token text (bytes or control
	// name), for the bound on prompt log-probabilities with their texts.
	maxTokenBytes int
}

// New returns an unconfigured prefill worker; svckit.Main configures and runs it.
func New() *Service {
	return &Service{Worker: enginehost.NewWorker(batonv1.WorkerRole_WORKER_ROLE_PREFILL)}
}

// GRPCServerOptions installs the KV codec: chunks are sent without copying
// their pages into protobuf messages; other messages use the default codec.
func (s *Service) GRPCServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{s.Codec.ServerOption()}
}

// AddFlags registers the worker's flags.
func (s *Service) AddFlags(fs *flag.FlagSet) {
	s.Worker.AddFlags(fs, enginehost.TransferHelp{
		Handshake: "how long prefill waits for a new TransferKV stream's first message, the handshake (decode's own --handshake-timeout bounds its wait for prefill to accept)",
		Idle:      "how long prefill waits for decode to grant a credit while KV chunks are waiting, or for one message to go out while decode's flow-control windows are exhausted; then prefill ends the transfer and releases the pages (decode's own --transfer-idle-timeout bounds its wait for prefill's messages)",
	})
}

// Open loads the model, starts the scheduler and builds the model's
// grammar vocabulary.
func (s *Service) Open(ctx context.Context, d *svckit.Deps) error {
	if err := s.Worker.Open(ctx, d); err != nil {
		return err
	}
	s.grammars = constrain.New(s.Host.Tokenizer, s.Host.Config.Vocab, 0)
	s.maxTokenBytes = apiconv.MaxTokenBytes(s.Host.Tokenizer, s.Host.Config.Vocab)
	return nil
}

// Validate checks the flags.
func (s *Service) Validate() error {
	if s.HandshakeTimeout <= 0 || s.IdleTimeout <= 0 {
		return errors.New("--handshake-timeout and --transfer-idle-timeout must be positive")
	}
	return s.Engine.Validate()
}

// Register installs PrefillService and WorkerService.
func (s *Service) Register(srv *svckit.Server) error {
	s.Worker.Register(srv)
	batonv1.RegisterPrefillServiceServer(srv.GRPC, s)
	return nil
}
