// Package prefill is the prefill worker: PrefillService (the TransferKV
// stream) and WorkerService.
package prefill

import (
	"context"
	"flag"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/svckit"
	"github.com/baton-serving/baton/svckit/workerapi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Service is the prefill worker.
type Service struct {
	batonv1.UnimplementedPrefillServiceServer
	model  svckit.ModelFlag
	opened time.Time
}

// New returns an unconfigured prefill worker; svckit.Main configures and runs it.
func New() *Service { return &Service{} }

// AddFlags registers the worker's flags.
func (s *Service) AddFlags(fs *flag.FlagSet) { s.model.AddFlags(fs) }

// Validate checks the flags.
func (s *Service) Validate() error { return nil }

// Open resolves the model.
func (s *Service) Open(ctx context.Context, d *svckit.Deps) error {
	if err := s.model.Resolve(ctx); err != nil {
		return err
	}
	s.opened = time.Now()
	d.Logger.Info("model", "path", s.model.Path)
	return nil
}

// Register installs PrefillService and WorkerService.
func (s *Service) Register(srv *svckit.Server) error {
	batonv1.RegisterPrefillServiceServer(srv.GRPC, s)
	batonv1.RegisterWorkerServiceServer(srv.GRPC, workerapi.New(&workerapi.Idle{
		Role:  batonv1.WorkerRole_WORKER_ROLE_PREFILL,
		Model: svckit.BasicModelInfo(s.model.Path, s.opened),
		Ready: srv.Ready,
	}))
	return nil
}

// Close releases nothing yet.
func (s *Service) Close() error { return nil }

// TransferKV is not implemented in this build.
func (s *Service) TransferKV(batonv1.PrefillService_TransferKVServer) error {
	return status.Error(codes.Unimplemented, "PrefillService.TransferKV is not implemented yet in this build of prefill-svc")
}
