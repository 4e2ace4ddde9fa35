// Package router is Baton's router: RouterService over gRPC, its REST form
// through grpc-gateway, and the worker list it routes to.
package router

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"strings"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/gen/openapi"
	"github.com/baton-serving/baton/svckit"
	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
)

// Service is the router.
type Service struct {
	batonv1.UnimplementedRouterServiceServer
	svckit.ModelBase
	prefill string
	decode  string

	prefillAddrs []string
	decodeAddrs  []string
	gwConn       *grpc.ClientConn
}

// New returns an unconfigured router; svckit.Main configures and runs it.
func New() *Service { return &Service{} }

// AddFlags registers the router's flags.
func (s *Service) AddFlags(fs *flag.FlagSet) {
	s.ModelBase.AddFlags(fs)
	fs.StringVar(&s.prefill, "prefill", "127.0.0.1:8082", "prefill workers' gRPC addresses, comma-separated host:port list")
	fs.StringVar(&s.decode, "decode", "127.0.0.1:8084", "decode workers' gRPC addresses, comma-separated host:port list")
}

// Validate checks the worker lists.
func (s *Service) Validate() error {
	var err error
	if s.prefillAddrs, err = parseAddrList(s.prefill); err != nil {
		return fmt.Errorf("--prefill: %w", err)
	}
	if s.decodeAddrs, err = parseAddrList(s.decode); err != nil {
		return fmt.Errorf("--decode: %w", err)
	}
	return nil
}

func parseAddrList(v string) ([]string, error) {
	var out []string
	for _, a := range strings.Split(v, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			continue
		}
		if err := svckit.ValidateAddr(a); err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("at least one host:port is required")
	}
	return out, nil
}

// Register installs RouterService, its REST gateway and the OpenAPI document.
func (s *Service) Register(srv *svckit.Server) error {
	batonv1.RegisterRouterServiceServer(srv.GRPC, s)
	srv.Logger.Info("workers", "prefill", s.prefillAddrs, "decode", s.decodeAddrs)

	// The gateway reaches the service through the router's own gRPC port, so
	// REST requests take the same path (interceptors, tracing, draining) as
	// gRPC ones and streaming methods work.
	conn, err := grpc.NewClient(srv.GRPCAddr(),
		grpc.WithTransportCredentials(insecure.NewCredentials()), srv.Tracing.DialOption())
	if err != nil {
		return fmt.Errorf("gateway connection: %w", err)
	}
	s.gwConn = conn
	gw := runtime.NewServeMux(runtime.WithMarshalerOption(runtime.MIMEWildcard, &runtime.JSONPb{
		MarshalOptions:   protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: false},
		UnmarshalOptions: protojson.UnmarshalOptions{DiscardUnknown: false},
	}))
	if err := batonv1.RegisterRouterServiceHandlerClient(context.Background(), gw, batonv1.NewRouterServiceClient(conn)); err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	srv.Mux.Handle("/v1/", gw)
	srv.Mux.HandleFunc("GET /openapi.json", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(openapi.Document)
	})
	return nil
}

// Close closes the gateway's connection.
func (s *Service) Close() error {
	if s.gwConn != nil {
		return s.gwConn.Close()
	}
	return nil
}

// ListModels lists the served model.
func (s *Service) ListModels(context.Context, *batonv1.ListModelsRequest) (*batonv1.ListModelsResponse, error) {
	return &batonv1.ListModelsResponse{Object: "list", Data: []*batonv1.ModelInfo{s.ModelInfo()}}, nil
}

// ListRequests lists in-flight requests: none can be admitted in this build.
func (s *Service) ListRequests(context.Context, *batonv1.ListRequestsRequest) (*batonv1.ListRequestsResponse, error) {
	return &batonv1.ListRequestsResponse{}, nil
}

// Generate is not implemented in this build.
func (s *Service) Generate(*batonv1.GenerateRequest, batonv1.RouterService_GenerateServer) error {
	return status.Error(codes.Unimplemented, "RouterService.Generate is not implemented yet in this build of router-svc")
}

// Complete is not implemented in this build.
func (s *Service) Complete(context.Context, *batonv1.CompleteRequest) (*batonv1.CompleteResponse, error) {
	return nil, status.Error(codes.Unimplemented, "RouterService.Complete is not implemented yet in this build of router-svc")
}

// Abort finds no request: none can be admitted in this build.
func (s *Service) Abort(_ context.Context, req *batonv1.AbortRequest) (*batonv1.AbortResponse, error) {
	return nil, status.Errorf(codes.NotFound, "request_id %q: no such in-flight request", req.GetRequestId())
}
