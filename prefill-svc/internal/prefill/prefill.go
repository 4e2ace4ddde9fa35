// Package prefill is the prefill worker: PrefillService (the TransferKV
// stream) and WorkerService.
package prefill

import (
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/svckit"
	"github.com/baton-serving/baton/svckit/workerapi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Service is the prefill worker.
type Service struct {
	batonv1.UnimplementedPrefillServiceServer
	svckit.ModelBase
}

// New returns an unconfigured prefill worker; svckit.Main configures and runs it.
func New() *Service { return &Service{} }

// Register installs PrefillService and WorkerService.
func (s *Service) Register(srv *svckit.Server) error {
	batonv1.RegisterPrefillServiceServer(srv.GRPC, s)
	batonv1.RegisterWorkerServiceServer(srv.GRPC, workerapi.New(&workerapi.Idle{
		Role:  batonv1.WorkerRole_WORKER_ROLE_PREFILL,
		Model: s.ModelInfo(),
		Ready: srv.Ready,
	}))
	return nil
}

// TransferKV is not implemented in this build.
func (s *Service) TransferKV(batonv1.PrefillService_TransferKVServer) error {
	return status.Error(codes.Unimplemented, "PrefillService.TransferKV is not implemented yet in this build of prefill-svc")
}
