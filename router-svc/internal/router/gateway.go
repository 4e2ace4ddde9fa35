package router

// The REST form of RouterService through grpc-gateway: its registration,
// its newline-delimited JSON framing of streams and its error answers.

import (
	"context"
	"fmt"
	"net/http"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/gen/openapi"
	"github.com/baton-serving/baton/router-svc/internal/openai"
	"github.com/baton-serving/baton/svckit"
	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
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
		runtime.WithRoutingErrorHandler(gatewayRoutingError),
		// The HTTP client's address, for --max-inflight-per-client.
		runtime.WithMetadata(func(_ context.Context, r *http.Request) metadata.MD {
			return s.clientCap.gatewayMetadata(r.RemoteAddr)
		}))
	if err := batonv1.RegisterRouterServiceHandlerClient(context.Background(), gw, batonv1.NewRouterServiceClient(conn)); err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	srv.Mux.Handle("/v1/", openai.CountRefusals(s.metrics.refused, openai.BodyLimit(s.limits.maxBodyBytes, s.gatewayWrites(gw))))
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

// Marshal writes the error that ends a stream ({"error": status}, which
// grpc-gateway marshals itself) in OpenAI's error shape, like every other
// error under /v1.
func (m ndjson) Marshal(v any) ([]byte, error) {
	if st, ok := streamError(v); ok {
		return openai.StatusErrorJSON(status.FromProto(st).Err())
	}
	return m.JSONPb.Marshal(v)
}

// ContentType is application/json for a stream that is only its error
// (grpc-gateway asks before it writes the header): a whole answer, not
// NDJSON.
func (m ndjson) ContentType(v any) string {
	if _, ok := streamError(v); ok {
		return "application/json"
	}
	return m.JSONPb.ContentType(v)
}

// streamError is the status in grpc-gateway's stream error chunk.
func streamError(v any) (*spb.Status, bool) {
	c, ok := v.(map[string]proto.Message)
	if !ok || len(c) != 1 {
		return nil, false
	}
	st, ok := c["error"].(*spb.Status)
	return st, ok
}

// gatewayError answers the REST gateway's errors in OpenAI's shape
// ({"error":{"message","type","param","code"}}) with the status the OpenAI
// API answers for the code (openai.WriteStatusError, which also sets
// Retry-After when busy and WWW-Authenticate without a key). They are the
// outcomes of gRPC calls, which the router's run counts, so they are not
// counted again here.
func gatewayError(_ context.Context, _ *runtime.ServeMux, _ runtime.Marshaler, w http.ResponseWriter, r *http.Request, err error) {
	openai.WriteStatusError(w, r, err, true)
}

// gatewayRoutingError answers a /v1 path no route takes (404 unknown_url)
// or takes with another method (405) in OpenAI's shape.
func gatewayRoutingError(_ context.Context, _ *runtime.ServeMux, _ runtime.Marshaler, w http.ResponseWriter, r *http.Request, httpStatus int) {
	allow := http.MethodPost // RouterService's REST routes are POST but for GET /v1/requests
	if r.URL.Path == "/v1/requests" {
		allow = "GET, HEAD"
	}
	openai.WriteRoutingError(w, r, httpStatus, allow)
}
