package svckit

import (
	"context"
	"errors"

	"github.com/baton-serving/baton/engine"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ErrDraining is returned for new work while a service shuts down.
var ErrDraining = errors.New("service is shutting down")

// codeTable maps sentinel errors to gRPC codes. It is the one place this
// mapping lives; handlers return wrapped sentinels and call Status at the
// boundary.
var codeTable = []struct {
	err  error
	code codes.Code
}{
	{context.Canceled, codes.Canceled},
	{context.DeadlineExceeded, codes.DeadlineExceeded},
	{ErrDraining, codes.Unavailable},
	{engine.ErrInvalidInput, codes.InvalidArgument},
	{engine.ErrContextOverflow, codes.InvalidArgument},
	{engine.ErrUnsupported, codes.FailedPrecondition},
	{engine.ErrKVCacheFull, codes.ResourceExhausted},
}

// Code returns the gRPC code for err: the code of a gRPC status error, else
// that of the first sentinel in the table that err wraps, else Internal.
func Code(err error) codes.Code {
	if err == nil {
		return codes.OK
	}
	var se interface{ GRPCStatus() *status.Status }
	if errors.As(err, &se) {
		return se.GRPCStatus().Code()
	}
	for _, e := range codeTable {
		if errors.Is(err, e.err) {
			return e.code
		}
	}
	return codes.Internal
}

// Status converts err into a gRPC status error with the code from Code and
// err's message. A nil err gives nil.
func Status(err error) error {
	if err == nil {
		return nil
	}
	if s, ok := status.FromError(err); ok {
		return s.Err()
	}
	return status.Error(Code(err), err.Error())
}
