package enginehost

import (
	"errors"
	"fmt"
	"testing"

	"github.com/baton-serving/baton/engine/sched"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestSubmitStatus(t *testing.T) {
	for _, c := range []struct {
		err    error
		closed codes.Code
		want   codes.Code
	}{
		{fmt.Errorf("submit: %w", sched.ErrDuplicateID), codes.Unavailable, codes.AlreadyExists},
		{sched.ErrQueueFull, codes.Unavailable, codes.ResourceExhausted},
		{sched.ErrClosed, codes.Unavailable, codes.Unavailable},
		{sched.ErrClosed, codes.ResourceExhausted, codes.ResourceExhausted},
		{errors.New("other"), codes.Unavailable, codes.Internal},
	} {
		st := status.Convert(SubmitStatus(c.err, c.closed))
		if st.Code() != c.want || st.Message() != c.err.Error() {
			t.Errorf("SubmitStatus(%v, %v) = %v, want %v with the error's text", c.err, c.closed, st, c.want)
		}
	}
}
