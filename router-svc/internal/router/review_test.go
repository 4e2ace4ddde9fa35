package router

import (
	"context"
	"errors"
	"strings"
	"testing"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestDrainRefusedAfterFirstToken: a request the drain refused as not yet
// begun whose first token was forwarded right after that check (a race)
// is answered as a cut stream, not as "refused before its first token;
// retry it" — its client already has output.
func TestDrainRefusedAfterFirstToken(t *testing.T) {
	r := &request{}
	if msg := status.Convert(drainStatus(errDrainRefused, r)).Message(); !strings.Contains(msg, "before its first token") {
		t.Errorf("nothing generated: %q", msg)
	}
	r.generated.Add(1)
	st := status.Convert(drainStatus(errDrainRefused, r))
	if st.Code() != codes.Unavailable || st.Message() != status.Convert(drainStatus(errDrainCut, r)).Message() {
		t.Errorf("after a token: %v %q, want the cut-stream status", st.Code(), st.Message())
	}
}

// TestPromptLogprobsMissingBlamesWorker: when the workers answer an echo
// without the prompt's logprobs, the request fails with UNIMPLEMENTED and
// its end is the decode worker's doing, not the client's.
func TestPromptLogprobsMissingBlamesWorker(t *testing.T) {
	s := &Service{}
	req := &batonv1.GenerateRequest{PromptTokenIds: []uint32{1, 2, 3}, Sampling: &batonv1.SamplingParams{PromptLogprobs: true}}
	r := &request{}
	const addr = "10.0.0.9:8084"
	send := r.clientSender(s.withTokenText(req, func(*batonv1.GenerateEvent) error { return nil }), addr)
	err := send(&batonv1.GenerateEvent{TokenIds: []uint32{5}})
	if status.Code(err) != codes.Unimplemented {
		t.Fatalf("err = %v, want UNIMPLEMENTED", err)
	}
	if got := endedBy(context.Background(), r); got != "worker "+addr {
		t.Errorf("ended_by %q, want the worker", got)
	}
	// A client that left is still the client's doing.
	c := &request{}
	left := errors.New("client gone")
	if err := c.clientSender(func(*batonv1.GenerateEvent) error { return left }, addr)(&batonv1.GenerateEvent{}); !errors.Is(err, left) {
		t.Fatal(err)
	}
	if got := endedBy(context.Background(), c); got != "client" {
		t.Errorf("client left: ended_by %q", got)
	}
}
