package enginehost

import (
	"errors"

	"github.com/baton-serving/baton/engine/sched"
	"github.com/baton-serving/baton/svckit"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// SubmitStatus maps the scheduler's refusal of a new request (Submit's
// error) to a status: a duplicate id is ALREADY_EXISTS, a full queue
// RESOURCE_EXHAUSTED, and a stopping scheduler (sched.ErrClosed) closed.
//
// closed is the one code the workers disagree on: decode answers
// UNAVAILABLE, prefill RESOURCE_EXHAUSTED. Both are kept as they have always
// answered (callers and the router's retry rules see them); making them
// agree is a behaviour change left to its own issue.
func SubmitStatus(err error, closed codes.Code) error {
	switch {
	case errors.Is(err, sched.ErrDuplicateID):
		return status.Errorf(codes.AlreadyExists, "%v", err)
	case errors.Is(err, sched.ErrQueueFull):
		return status.Errorf(codes.ResourceExhausted, "%v", err)
	case errors.Is(err, sched.ErrClosed):
		return status.Errorf(closed, "%v", err)
	}
	return svckit.Status(err)
}
