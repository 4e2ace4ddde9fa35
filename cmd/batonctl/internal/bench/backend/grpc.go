package backend

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// GRPC calls RouterService over one multiplexed connection, as a gRPC
// client in production would.
type GRPC struct {
	addr   string
	apiKey string
	conn   *grpc.ClientConn
	client batonv1.RouterServiceClient
}

// NewGRPC prepares a connection to the router's gRPC address; it connects
// on first use.
func NewGRPC(addr, apiKey string) (*GRPC, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("router %s: %w", addr, err)
	}
	return &GRPC{addr: addr, apiKey: apiKey, conn: conn, client: batonv1.NewRouterServiceClient(conn)}, nil
}

func (g *GRPC) ctx(ctx context.Context) context.Context {
	if g.apiKey == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+g.apiKey)
}

// Model implements Backend with ListModels.
func (g *GRPC) Model(ctx context.Context) (Model, error) {
	resp, err := g.client.ListModels(g.ctx(ctx), &batonv1.ListModelsRequest{})
	if err != nil {
		return Model{}, fmt.Errorf("router %s: ListModels: %w", g.addr, grpcErr(err))
	}
	if len(resp.GetData()) == 0 {
		return Model{}, fmt.Errorf("router %s serves no model", g.addr)
	}
	m := resp.GetData()[0]
	return Model{ID: m.GetId(), VocabSize: int(m.GetVocabSize()), ContextLength: int(m.GetContextLength()), Fingerprint: m.GetFingerprint()}, nil
}

// Generate implements Backend with a Generate stream. Every event carrying
// token ids is a chunk of that many tokens.
func (g *GRPC) Generate(ctx context.Context, req Request, onChunk OnChunk) (Result, error) {
	ids, err := wireIDs(req.PromptIDs)
	if err != nil {
		return Result{}, err
	}
	stream, err := g.client.Generate(g.ctx(ctx), &batonv1.GenerateRequest{
		PromptTokenIds: ids,
		Sampling: &batonv1.SamplingParams{
			Temperature:  proto.Float32(float32(req.Temperature)),
			MaxNewTokens: uint32(req.MaxTokens),
			IgnoreEos:    req.IgnoreEOS,
			Seed:         proto.Uint64(req.Seed),
		},
		StreamOptions: &batonv1.StreamOptions{IncludeUsage: true, IncludeTiming: true},
	})
	if err != nil {
		return Result{}, grpcErr(err)
	}
	var (
		res       Result
		generated int
		finished  bool
	)
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return res, grpcErr(err)
		}
		ev := resp.GetEvent()
		if n := len(ev.GetTokenIds()); n > 0 {
			generated += n
			onChunk(n)
		}
		switch ev.GetFinishReason() {
		case batonv1.FinishReason_FINISH_REASON_UNSPECIFIED:
			continue
		case batonv1.FinishReason_FINISH_REASON_ABORT:
			return res, errors.New("aborted by the server")
		}
		finished = true
		res.FinishReason = strings.ToLower(strings.TrimPrefix(ev.GetFinishReason().String(), "FINISH_REASON_"))
		res.ServerTTFT = ev.GetTiming().GetTimeToFirstTokenSeconds()
		if tm := ev.GetTiming(); tm != nil {
			res.KVTransferBytes, res.HasKVTransferBytes = tm.GetKvTransferBytes(), true
			res.Stages = &Stages{PreallocWait: tm.GetPreallocWaitSeconds(), PrefillQueue: tm.GetPrefillQueueSeconds(),
				Prefill: tm.GetPrefillSeconds(), KVTransfer: tm.GetKvTransferSeconds(), Decode: tm.GetDecodeSeconds()}
		}
		if u := ev.GetUsage(); u != nil {
			res.InputTokens, res.OutputTokens = int(u.GetPromptTokens()), int(u.GetCompletionTokens())
			res.CachedTokens = int(u.GetCachedTokens())
		}
	}
	if !finished {
		return res, errors.New("stream ended without a finish reason")
	}
	if res.InputTokens == 0 {
		res.InputTokens = len(ids)
	}
	if res.OutputTokens == 0 {
		res.OutputTokens = generated
	}
	return res, nil
}

// Close implements Backend.
func (g *GRPC) Close() error { return g.conn.Close() }

// grpcErr is a status as "code: message", the form the report groups.
func grpcErr(err error) error {
	st := status.Convert(err)
	return errors.New(oneLine(fmt.Sprintf("grpc %s: %s", snake(st.Code().String()), st.Message())))
}

// snake spells a code's name as the gRPC specification does:
// ResourceExhausted is resource_exhausted.
func snake(s string) string {
	var b strings.Builder
	for i, r := range s {
		if unicode.IsUpper(r) {
			if i > 0 {
				b.WriteByte('_')
			}
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}
