// Package decode is the decode worker: DecodeService (Generate, Abort) and
// WorkerService.
package decode

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

// Service is the decode worker.
type Service struct {
	batonv1.UnimplementedDecodeServiceServer
	model  svckit.ModelFlag
	opened time.Time
}

// New returns an unconfigured decode worker; svckit.Main configures and runs it.
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

// Register installs DecodeService and WorkerService.
func (s *Service) Register(srv *svckit.Server) error {
	batonv1.RegisterDecodeServiceServer(srv.GRPC, s)
	batonv1.RegisterWorkerServiceServer(srv.GRPC, workerapi.New(&workerapi.Idle{
		Role:  batonv1.WorkerRole_WORKER_ROLE_DECODE,
		Model: svckit.BasicModelInfo(s.model.Path, s.opened),
		Ready: srv.Ready,
	}))
	return nil
}

// Close releases nothing yet.
func (s *Service) Close() error { return nil }

// Generate is not implemented in this build.
func (s *Service) Generate(*batonv1.DecodeServiceGenerateRequest, batonv1.DecodeService_GenerateServer) error {
	return status.Error(codes.Unimplemented, "DecodeService.Generate is not implemented yet in this build of decode-svc")
}

// Abort finds no request: none can be admitted in this build.
func (s *Service) Abort(_ context.Context, req *batonv1.DecodeServiceAbortRequest) (*batonv1.DecodeServiceAbortResponse, error) {
	return nil, status.Errorf(codes.NotFound, "request_id %q: no such in-flight request", req.GetRequestId())
}
