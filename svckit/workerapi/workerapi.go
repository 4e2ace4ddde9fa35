// Package workerapi implements baton.v1.WorkerService, which prefill and decode
// workers both serve, over callbacks into the worker's own state.
package workerapi

import (
	"context"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Source is what a worker exposes to the WorkerService.
type Source interface {
	// Info describes the worker.
	Info() *batonv1.InfoResponse
	// Load reports the current load.
	Load(ctx context.Context) *batonv1.LoadReport
	// Requests lists in-flight requests, oldest first.
	Requests() []*batonv1.RequestInfo
}

// Service is the WorkerService over a Source.
type Service struct {
	batonv1.UnimplementedWorkerServiceServer
	src Source
	// httpAddr and adminAddr are the worker's bound listeners, reported in
	// Info so that the router's /debug/workers (and batonctl diagnose) can
	// find /metrics and the admin listener's /debug/requests.
	httpAddr, adminAddr string
}

// New returns the WorkerService for src.
func New(src Source) *Service { return &Service{src: src} }

// WithListeners makes Info report the worker's bound HTTP and admin
// addresses (svckit.Server.HTTPAddr and AdminAddr; "" for none) unless the
// Source reports its own.
func (s *Service) WithListeners(httpAddr, adminAddr string) *Service {
	s.httpAddr, s.adminAddr = httpAddr, adminAddr
	return s
}

// Info describes the worker.
func (s *Service) Info(context.Context, *batonv1.InfoRequest) (*batonv1.InfoResponse, error) {
	info := s.src.Info()
	if s.httpAddr == "" && s.adminAddr == "" {
		return info, nil
	}
	info = proto.Clone(info).(*batonv1.InfoResponse) // the Source may hand out a shared message
	if info.HttpAddr == "" {
		info.HttpAddr = s.httpAddr
	}
	if info.AdminAddr == "" {
		info.AdminAddr = s.adminAddr
	}
	return info, nil
}

// GetLoad reports the current load.
func (s *Service) GetLoad(ctx context.Context, _ *batonv1.GetLoadRequest) (*batonv1.GetLoadResponse, error) {
	return &batonv1.GetLoadResponse{Load: s.src.Load(ctx)}, nil
}

// MinWatchInterval is the shortest WatchLoad interval accepted.
const MinWatchInterval = 50 * time.Millisecond

// WatchLoad sends a report at once and then every interval until the caller
// goes away.
func (s *Service) WatchLoad(req *batonv1.WatchLoadRequest, stream batonv1.WorkerService_WatchLoadServer) error {
	every := time.Duration(req.GetIntervalMs()) * time.Millisecond
	if every == 0 {
		every = time.Second
	}
	if every < MinWatchInterval {
		return status.Errorf(codes.InvalidArgument, "interval_ms: must be at least %d, got %d", MinWatchInterval.Milliseconds(), req.GetIntervalMs())
	}
	ctx := stream.Context()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if err := stream.Send(&batonv1.WatchLoadResponse{Load: s.src.Load(ctx)}); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-t.C:
		}
	}
}

// ListRequests lists in-flight requests.
func (s *Service) ListRequests(context.Context, *batonv1.WorkerServiceListRequestsRequest) (*batonv1.WorkerServiceListRequestsResponse, error) {
	return &batonv1.WorkerServiceListRequestsResponse{Requests: s.src.Requests()}, nil
}
