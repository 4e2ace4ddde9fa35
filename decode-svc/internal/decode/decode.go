// Package decode is the decode worker: DecodeService (Generate, Abort) and
// WorkerService.
package decode

import (
	"context"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/svckit"
	"github.com/baton-serving/baton/svckit/workerapi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Service is the decode worker.
type Service struct {
	batonv1.UnimplementedDecodeServiceServer
	svckit.ModelBase
}

// New returns an unconfigured decode worker; svckit.Main configures and runs it.
func New() *Service { return &Service{} }

// Register installs DecodeService and WorkerService.
func (s *Service) Register(srv *svckit.Server) error {
	batonv1.RegisterDecodeServiceServer(srv.GRPC, s)
	batonv1.RegisterWorkerServiceServer(srv.GRPC, workerapi.New(&workerapi.Idle{
		Role:  batonv1.WorkerRole_WORKER_ROLE_DECODE,
		Model: s.ModelInfo(),
		Ready: srv.Ready,
	}))
	return nil
}

// Generate is not implemented in this build.
func (s *Service) Generate(*batonv1.DecodeServiceGenerateRequest, batonv1.DecodeService_GenerateServer) error {
	return status.Error(codes.Unimplemented, "DecodeService.Generate is not implemented yet in this build of decode-svc")
}

// Abort finds no request: none can be admitted in this build.
func (s *Service) Abort(_ context.Context, req *batonv1.DecodeServiceAbortRequest) (*batonv1.DecodeServiceAbortResponse, error) {
	return nil, status.Errorf(codes.NotFound, "request_id %q: no such in-flight request", req.GetRequestId())
}
