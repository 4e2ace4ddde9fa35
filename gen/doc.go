// Package gen holds Baton's generated code: the baton.v1 protobuf messages and
// gRPC services (gen/baton/v1), the grpc-gateway REST handlers for the router,
// and the OpenAPI document (gen/openapi). Everything but this file, embed.go and
// go.mod is written by `buf generate` (scripts/generate.sh); do not edit it.
package gen
