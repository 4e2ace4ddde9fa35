package router

// The REST form of RouterService through grpc-gateway: its registration,
// its newline-delimited JSON framing of streams and its error answers.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/gen/openapi"
	"github.com/baton-serving/baton/router-svc/internal/openai"
	"github.com/baton-serving/baton/svckit"
	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
)

// registerGateway serves RouterService as REST. The gateway reaches the
// service through the router's own gRPC port, so REST requests take the same
// path (interceptors, tracing, draining) as gRPC ones and streaming works.
func (s *Service) registerGateway(srv *svckit.Server) error {
	conn, err := grpc.NewClient(srv.GRPCAddr(),
		grpc.WithTransportCredentials(insecure.NewCredentials()), srv.Tracing.DialOption())
	if err != nil {
		return fmt.Errorf("gateway connection: %w", err)
	}
	s.gwConn = conn
	gw := runtime.NewServeMux(
		runtime.WithMarshalerOption(runtime.MIMEWildcard, ndjson{&runtime.JSONPb{
			MarshalOptions: protojson.MarshalOptions{UseProtoNames: true},
		}}),
		runtime.WithErrorHandler(gatewayError),
		// The HTTP client's address, for --max-inflight-per-client.
		runtime.WithMetadata(func(_ context.Context, r *http.Request) metadata.MD {
			return s.clientCap.gatewayMetadata(r.RemoteAddr)
		}))
	if err := batonv1.RegisterRouterServiceHandlerClient(context.Background(), gw, batonv1.NewRouterServiceClient(conn)); err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	srv.Mux.Handle("/v1/", openai.BodyLimit(s.limits.maxBodyBytes, s.gatewayWrites(gw)))
	srv.Mux.HandleFunc("GET /openapi.json", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(openapi.Document)
	})
	return nil
}

// ndjson is the gateway's JSON marshaler, labelling streams (POST
// /v1/generate) as newline-delimited JSON: one {"result": ...} or
// {"error": ...} object per line.
type ndjson struct{ *runtime.JSONPb }

// StreamContentType implements runtime.StreamContentType.
func (ndjson) StreamContentType(any) string { return "application/x-ndjson" }

// gatewayError is grpc-gateway's error answer plus the headers OpenAI
// clients also get: Retry-After when busy, WWW-Authenticate without a key.
func gatewayError(ctx context.Context, mux *runtime.ServeMux, m runtime.Marshaler, w http.ResponseWriter, r *http.Request, err error) {
	var st interface{ GRPCStatus() *status.Status }
	if errors.As(err, &st) {
		switch st.GRPCStatus().Code() {
		case codes.ResourceExhausted, codes.Unavailable:
			w.Header().Set("Retry-After", strconv.Itoa(openai.RetryAfterSeconds))
		case codes.Unauthenticated:
			w.Header().Set("WWW-Authenticate", `Bearer realm="baton"`)
		}
	}
	runtime.DefaultHTTPErrorHandler(ctx, mux, m, w, r, err)
}
