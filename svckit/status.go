package svckit

import (
	"context"
	"errors"
	"fmt"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/gguf"
	"github.com/baton-serving/baton/engine/grammar"
	"github.com/baton-serving/baton/engine/model"
	"github.com/baton-serving/baton/engine/modelfile"
	"github.com/baton-serving/baton/engine/sample"
	"github.com/baton-serving/baton/engine/sched"
	"github.com/baton-serving/baton/kvtransfer"
	"github.com/baton-serving/baton/svckit/device"
	"github.com/baton-serving/baton/svckit/tlsconf"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ErrDraining is returned for new work while a service shuts down.
var ErrDraining = errors.New("service is shutting down")

// Sentinels of the services' own request paths: handlers wrap them (with
// %w and the specifics) and Status gives the code.
var (
	// ErrPeerUnavailable: a peer worker (a prefill worker, for decode)
	// cannot be reached, broke its stream or ended it early. Retryable on
	// another peer.
	ErrPeerUnavailable = errors.New("peer unavailable")
	// ErrPeerTimeout: a peer worker did not answer within a deadline of
	// this service (not the caller's own deadline). Retryable on another
	// peer before anything reached the client.
	ErrPeerTimeout = errors.New("peer timed out")
	// ErrMismatch: a peer serves another model or KV layout.
	ErrMismatch = errors.New("peer mismatch")
	// ErrCorrupt: data from a peer cannot be used (a bad KV chunk).
	ErrCorrupt = errors.New("corrupt data from peer")
	// ErrSuperseded: a newer attempt of the same request replaced this one
	// (a prefill worker's stale transfer when the router's retry arrives).
	ErrSuperseded = errors.New("superseded by a newer attempt of the request")
	// ErrPeerNotAllowed: a request names a peer worker this service's
	// allow list (decode's --prefill-allow) does not admit. The router
	// chose that peer, not the client, so it is the pair's failure:
	// UNAVAILABLE, which the router fails over on and a client sees as
	// 503 — never the client's 400.
	ErrPeerNotAllowed = errors.New("peer not allowed")
)

// codeTable maps sentinel errors to gRPC codes. It is the one place this
// mapping lives: handlers return wrapped sentinels (Errorf, or fmt.Errorf
// with %w and Status at the boundary). TestEverySentinelMapped walks the
// source tree and fails on a sentinel of the engine, kvtransfer, svckit,
// decode or prefill that maps to Internal or Unknown, so a new one must get
// a line here; TestNoInlineStatus fails on a status built in a worker's
// handler.
var codeTable = []struct {
	err  error
	code codes.Code
}{
	// First, before the context rows: Shutdown's error wraps both
	// ErrStepHung and the context's cause, and a hung step is the worker
	// going away (UNAVAILABLE), not the caller's deadline. Code takes the
	// first row that matches.
	{sched.ErrStepHung, codes.Unavailable},
	{context.Canceled, codes.Canceled},
	{context.DeadlineExceeded, codes.DeadlineExceeded},
	{ErrDraining, codes.Unavailable},
	{ErrPeerUnavailable, codes.Unavailable},
	{ErrPeerTimeout, codes.DeadlineExceeded},
	{ErrMismatch, codes.FailedPrecondition},
	{ErrCorrupt, codes.DataLoss},
	{ErrSuperseded, codes.Aborted},
	{ErrPeerNotAllowed, codes.Unavailable},
	{ErrBodyTimeout, codes.DeadlineExceeded}, // HTTP only: a client too slow to send its body

	{engine.ErrInvalidInput, codes.InvalidArgument},
	{engine.ErrContextOverflow, codes.InvalidArgument},
	{engine.ErrUnsupported, codes.FailedPrecondition},
	{engine.ErrKVCacheFull, codes.ResourceExhausted},
	// A start-up error (--device names what the machine lacks); mapped so
	// that it could never reach a client as INTERNAL.
	{device.ErrUnavailable, codes.FailedPrecondition},

	// The scheduler's refusals and ends. A closing scheduler is a worker
	// going away on every service (UNAVAILABLE, so the router fails over;
	// prefill once said RESOURCE_EXHAUSTED, which reached clients as 429).
	{sched.ErrClosed, codes.Unavailable},
	{sched.ErrQueueFull, codes.ResourceExhausted},
	{sched.ErrDuplicateID, codes.AlreadyExists},
	{sched.ErrSlowConsumer, codes.Aborted},
	// A grammar that allows no next token: this request cannot go on
	// (retrying elsewhere gives the same), the server is healthy.
	{sample.ErrNoAllowedToken, codes.Aborted},
	// The prefill worker's first token does not follow this worker's
	// grammar: the peer's data cannot be used, as a bad KV chunk.
	{sample.ErrDiverged, codes.DataLoss},
	// A token or text the request's grammar does not allow (Accept).
	{grammar.ErrRejected, codes.InvalidArgument},
	{model.ErrClosed, codes.Unavailable},

	{kvtransfer.ErrAborted, codes.Aborted},
	{kvtransfer.ErrStalled, codes.DeadlineExceeded},

	{tlsconf.ErrNoCertificate, codes.Unauthenticated},
	{tlsconf.ErrNoRole, codes.PermissionDenied},
	{tlsconf.ErrWrongRole, codes.PermissionDenied},

	// Model files: reached only at start-up, named here so that every
	// sentinel has a code.
	{modelfile.ErrUnreachable, codes.Unavailable},
	{modelfile.ErrStalled, codes.Unavailable},
	{modelfile.ErrHashMismatch, codes.DataLoss},
	{modelfile.ErrInvalidRef, codes.InvalidArgument},
	{gguf.ErrBadMagic, codes.FailedPrecondition},
	{gguf.ErrUnsupportedVersion, codes.FailedPrecondition},
	{gguf.ErrTruncated, codes.FailedPrecondition},
	{gguf.ErrBadValueType, codes.FailedPrecondition},
	{gguf.ErrBadTensorType, codes.FailedPrecondition},
	{gguf.ErrBadShape, codes.FailedPrecondition},
	{gguf.ErrBadAlignment, codes.FailedPrecondition},
	{gguf.ErrMisaligned, codes.FailedPrecondition},
	{gguf.ErrOutOfBounds, codes.FailedPrecondition},
	{gguf.ErrOverlap, codes.FailedPrecondition},
	{gguf.ErrDuplicate, codes.FailedPrecondition},
	{gguf.ErrInvalid, codes.FailedPrecondition},
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

// Errorf returns an error of kind, a codeTable sentinel (or any error: the
// code is Code(kind)), with the message
// fmt.Errorf(format, args...) gives: kind's own text is not added, so the
// message stays what the handler says, and %w in format keeps the cause.
// errors.Is finds kind and what format wrapped; its gRPC status (for the
// server, Status, and the traces) has kind's code from codeTable, whatever
// the cause is. Handlers return it instead of building a status on the spot.
func Errorf(kind error, format string, args ...any) error {
	code := Code(kind)
	if code == codes.OK {
		code = codes.Internal // no kind: a bug, not a success
	}
	return &kindError{kind: kind, code: code, err: fmt.Errorf(format, args...)}
}

// PeerErrorf relays an error a peer reported with its own gRPC code (its
// status, or an in-band error message), with the message fmt.Sprintf gives:
// the one code no sentinel of this service chooses.
func PeerErrorf(code codes.Code, format string, args ...any) error {
	return &kindError{code: code, err: fmt.Errorf(format, args...)}
}

// kindError is Errorf's and PeerErrorf's error.
type kindError struct {
	kind error // nil for a peer's code
	code codes.Code
	err  error
}

func (e *kindError) Error() string { return e.err.Error() }

func (e *kindError) Unwrap() []error {
	if e.kind == nil {
		return []error{e.err}
	}
	return []error{e.kind, e.err}
}

// GRPCStatus makes the error a status error, found before anything it wraps.
func (e *kindError) GRPCStatus() *status.Status { return status.New(e.code, e.err.Error()) }

// Status converts err into a gRPC status error with the code from Code and
// err's message. A nil err gives nil; a status error is returned as it is.
func Status(err error) error {
	if err == nil {
		return nil
	}
	if s, ok := status.FromError(err); ok {
		return s.Err()
	}
	return status.Error(Code(err), err.Error())
}
