package router

import (
	"testing"

	"github.com/baton-serving/baton/router-svc/internal/openai"
	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc/codes"
)

// TestGatewayStreamStatus: an error that ends a REST stream before its
// first line gets its HTTP status from grpc-gateway (HTTPStatusFromCode, no
// hook); it must be the status the OpenAI mapping gives every other error.
func TestGatewayStreamStatus(t *testing.T) {
	for c := codes.OK + 1; c <= codes.Unauthenticated; c++ {
		if g, o := runtime.HTTPStatusFromCode(c), openai.HTTPStatus(c); g != o {
			t.Errorf("%v: grpc-gateway answers %d, the OpenAI mapping %d", c, g, o)
		}
	}
}
