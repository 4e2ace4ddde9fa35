package canary

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/svckit/canarylabel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// The canary's labels: the workers' own (svckit/canarylabel), so that the
// two ends cannot drift apart.
const (
	// IDPrefix starts every canary request id.
	IDPrefix = canarylabel.IDPrefix
	// MetadataKey is the gRPC metadata key, with value "1", on every call
	// made for a canary.
	MetadataKey = canarylabel.MetadataKey
	// AttrCanary (true) marks a canary's spans.
	AttrCanary = canarylabel.Attr
)

// ReservedID reports whether a request id is reserved for canaries: the
// router refuses such ids from clients.
func ReservedID(id string) bool { return strings.HasPrefix(id, IDPrefix) }

// localPrefill is the prefill endpoint that asks decode to compute the
// prompt itself (colocated mode).
const localPrefill = "local"

// probeTokens is how many tokens a probe asks for. Two, not one: decode
// emits the first token (computed by prefill) when the transferred pages
// are activated, before any forward step of its own, so a one-token probe
// passes through a decode whose forward loop is frozen.
const probeTokens = 2

// spanCanary names the root span of one probe.
const spanCanary = "canary"

// Pair is a (prefill, decode) pair of worker addresses. Prefill is "" in
// colocated mode.
type Pair struct {
	Prefill string `json:"prefill,omitempty"`
	Decode  string `json:"decode"`
}

func (p Pair) String() string {
	if p.Prefill == "" {
		return "colocated decode=" + p.Decode
	}
	return "prefill=" + p.Prefill + " decode=" + p.Decode
}

// Probe sends one canary request through a pair and reports whether it
// served. It must return soon after ctx ends.
type Probe func(ctx context.Context, p Pair) error

// ProberOptions configure the real probe.
type ProberOptions struct {
	// Conn returns the connection to the decode worker at addr (required).
	Conn func(addr string) (grpc.ClientConnInterface, error)
	// Prompt is the canary's prompt as token ids of the served model
	// (required): a few tokens, so that the KV cache of at least one page
	// moves from prefill to decode.
	Prompt []uint32
	// Tracer makes each probe's root span (nil: probes are not traced).
	Tracer trace.TracerProvider
}

// Prober sends the real canary request: DecodeService.Generate naming the
// pair's prefill, greedy, two new tokens, end of sequence ignored, labelled
// as a canary. It is safe for concurrent use.
type Prober struct {
	o      ProberOptions
	tracer trace.Tracer

	mu       sync.Mutex
	inflight map[string]InFlight
}

// InFlight is a canary request in flight.
type InFlight struct {
	ID    string
	Pair  Pair
	Start time.Time
}

// NewProber checks o and returns the real probe.
func NewProber(o ProberOptions) (*Prober, error) {
	if o.Conn == nil {
		return nil, errors.New("canary: ProberOptions.Conn is required")
	}
	if len(o.Prompt) == 0 {
		return nil, errors.New("canary: ProberOptions.Prompt is empty; the canary needs a few prompt tokens")
	}
	tp := o.Tracer
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	o.Prompt = slices.Clone(o.Prompt)
	return &Prober{o: o, tracer: tp.Tracer("github.com/baton-serving/baton/router-svc/internal/canary"),
		inflight: map[string]InFlight{}}, nil
}

// InFlight lists the canary requests in flight, for the router's
// reconciliation with the workers' lists (they are not in the router's own
// table of client requests).
func (pr *Prober) InFlight() []InFlight {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	out := slices.Collect(maps.Values(pr.inflight))
	slices.SortFunc(out, func(a, b InFlight) int { return a.Start.Compare(b.Start) })
	return out
}

// Probe implements Probe: it sends one canary request through p and checks
// that it came back whole — the request echoed, two tokens, a finish reason —
// naming, on failure, how far it got.
func (pr *Prober) Probe(ctx context.Context, p Pair) (err error) {
	id := newID()
	prefill := p.Prefill
	if prefill == "" {
		prefill = localPrefill
	}
	ctx, span := pr.tracer.Start(ctx, spanCanary, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
		AttrCanary.Bool(true), attribute.String("baton.request_id", id),
		attribute.String("baton.prefill", prefill), attribute.String("baton.decode", p.Decode)))
	defer func() {
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}()
	pr.mu.Lock()
	pr.inflight[id] = InFlight{ID: id, Pair: p, Start: time.Now()}
	pr.mu.Unlock()
	defer func() {
		pr.mu.Lock()
		delete(pr.inflight, id)
		pr.mu.Unlock()
	}()

	conn, err := pr.o.Conn(p.Decode)
	if err != nil {
		return fmt.Errorf("canary %s: decode %s: %w", id, p.Decode, err)
	}
	ctx = metadata.AppendToOutgoingContext(ctx, MetadataKey, "1")
	greedy, seed := float32(0), uint64(0)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the stream however the probe returns
	SetStage(ctx, StageAdmission)
	stream, err := batonv1.NewDecodeServiceClient(conn).Generate(ctx, &batonv1.DecodeServiceGenerateRequest{
		Request: &batonv1.GenerateRequest{
			RequestId: id, PromptTokenIds: pr.o.Prompt,
			Sampling: &batonv1.SamplingParams{Temperature: &greedy, Seed: &seed, MaxNewTokens: probeTokens, IgnoreEos: true},
		},
		PrefillEndpoint: prefill,
	})
	if err != nil {
		return fmt.Errorf("canary %s: decode %s: %w", id, p.Decode, err)
	}
	stage := "admission" // what the probe waits for, for the error
	tokens := 0
	for {
		resp, err := stream.Recv()
		if err == io.EOF {
			return fmt.Errorf("canary %s: decode %s ended the stream during %s", id, p.Decode, stage)
		}
		if err != nil {
			return fmt.Errorf("canary %s: %s failed during %s: %w", id, p, stage, err)
		}
		ev := resp.GetEvent()
		if got := ev.GetRequestId(); got != id {
			return fmt.Errorf("canary %s: decode %s answered for request %q", id, p.Decode, got)
		}
		switch {
		case stage == "admission":
			if !slices.Equal(ev.GetPromptTokenIds(), pr.o.Prompt) {
				return fmt.Errorf("canary %s: decode %s did not echo the prompt first (got %d prompt tokens)", id, p.Decode, len(ev.GetPromptTokenIds()))
			}
			stage = "the first token (page reservation, KV transfer, prefill)"
			SetStage(ctx, StageFirstToken)
		case ev.GetFinishReason() != batonv1.FinishReason_FINISH_REASON_UNSPECIFIED:
			tokens += len(ev.GetTokenIds())
			if fr := ev.GetFinishReason(); fr != batonv1.FinishReason_FINISH_REASON_LENGTH || tokens != probeTokens {
				return fmt.Errorf("canary %s: decode %s finished with %v after %d tokens, want LENGTH after %d", id, p.Decode, fr, tokens, probeTokens)
			}
			return pr.drain(stream, id, p)
		default:
			tokens += len(ev.GetTokenIds())
			if tokens > 0 {
				stage = "the end of the request"
				SetStage(ctx, StageDecode)
			}
		}
	}
}

// drain waits for the stream's clean end after the final event, so that a
// status error decode sends after it is not missed.
func (pr *Prober) drain(stream batonv1.DecodeService_GenerateClient, id string, p Pair) error {
	_, err := stream.Recv()
	switch {
	case err == io.EOF:
		return nil
	case err != nil:
		return fmt.Errorf("canary %s: decode %s after the final event: %s", id, p.Decode, status.Convert(err).Message())
	}
	return fmt.Errorf("canary %s: decode %s sent an event after the final one", id, p.Decode)
}

// newID returns a fresh canary request id.
func newID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return IDPrefix + hex.EncodeToString(b[:])
}
