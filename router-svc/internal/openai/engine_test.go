package openai_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/baton-serving/baton/engine/gguf"
	"github.com/baton-serving/baton/engine/model"
	"github.com/baton-serving/baton/engine/refdata"
	"github.com/baton-serving/baton/engine/sample"
	"github.com/baton-serving/baton/engine/tokenizer"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/svckit/apiconv"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// golden is one greedy generation of ../shared/golden/stories260K.json.
type golden struct {
	Prompt       string  `json:"prompt"`
	PromptIDs    []int32 `json:"prompt_ids"`
	GeneratedIDs []int32 `json:"generated_ids"`
	Text         string  `json:"generated_text"`
}

func goldens(t testing.TB) []golden {
	t.Helper()
	b, err := os.ReadFile(refdata.Golden(t))
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Generations []golden `json:"generations"`
	}
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	if len(f.Generations) == 0 {
		t.Fatal("golden file has no generations")
	}
	return f.Generations
}

// engineGen generates with the real engine in-process, producing the events
// a decode worker produces: the first carries prompt_token_ids, each next
// one a token and the text it completes (held back while it may start a stop
// string), the last the finish reason and usage. It refuses a request id
// already in flight, as the router does.
type engineGen struct {
	m   model.Model
	tok *tokenizer.Tokenizer
	cfg model.Config

	// delay (nanoseconds) is slept between tokens, so that tests can act
	// mid-stream.
	delay atomic.Int64
	// prefillDelay (nanoseconds) is slept before the first event, as a
	// slow prefill would, so that tests can end a request before its
	// stream has begun.
	prefillDelay atomic.Int64

	mu       sync.Mutex
	inflight map[string]bool
	// ended receives each request's result as Generate returns.
	ended chan error
}

// newEngineGen loads the shared stories model.
func newEngineGen(t testing.TB) *engineGen {
	t.Helper()
	return newEngineGenCtx(t, 0)
}

// newEngineGenCtx is newEngineGen with the model's context window set to
// ctx tokens (as the workers' --context-length sets it; 0 keeps the
// model's own): stories260K's own 128 tokens cannot hold a tools prompt,
// nor a stream long enough to tell a client that keeps up from one that
// does not.
func newEngineGenCtx(t testing.TB, ctx int) *engineGen {
	t.Helper()
	f, err := gguf.Open(refdata.Model(t))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.FromGGUF(f)
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.Load(f, model.Options{Threads: 1, ContextLength: ctx})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		m.Close()
		f.Close()
	})
	return &engineGen{m: m, tok: tok, cfg: m.Config(), inflight: map[string]bool{}, ended: make(chan error, 64)}
}

func (g *engineGen) inFlight() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.inflight)
}

func (g *engineGen) Generate(ctx context.Context, req *batonv1.GenerateRequest, send func(*batonv1.GenerateEvent) error) (err error) {
	id := req.GetRequestId()
	g.mu.Lock()
	if g.inflight[id] {
		g.mu.Unlock()
		return status.Errorf(codes.AlreadyExists, "request_id %q is already in flight", id)
	}
	g.inflight[id] = true
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		delete(g.inflight, id)
		g.mu.Unlock()
		select {
		case g.ended <- err:
		default:
		}
	}()
	return g.generate(ctx, req, send)
}

func (g *engineGen) generate(ctx context.Context, req *batonv1.GenerateRequest, send func(*batonv1.GenerateEvent) error) error {
	bad := func(err error) error { return status.Error(codes.InvalidArgument, err.Error()) }
	sp := req.GetSampling()
	prompt, err := apiconv.TokenIDs("prompt_token_ids", req.GetPromptTokenIds(), g.cfg.Vocab)
	if err != nil {
		return bad(err)
	}
	n := len(prompt)
	maxNew := int(sp.GetMaxNewTokens())
	if n == 0 || maxNew == 0 || n+maxNew > g.cfg.ContextLength {
		return status.Errorf(codes.InvalidArgument, "prompt: %d tokens + %d new do not fit %d", n, maxNew, g.cfg.ContextLength)
	}
	params, err := apiconv.Sampling(sp)
	if err != nil {
		return bad(err)
	}
	stopIDs, err := apiconv.StopTokenIDs(sp, g.cfg.Vocab)
	if err != nil {
		return bad(err)
	}
	stopper, err := sample.NewStopper(sp.GetStop(), stopIDs)
	if err != nil {
		return bad(err)
	}
	smp, err := sample.New(params)
	if err != nil {
		return bad(err)
	}
	if err := constrain(smp, sp, g.tok); err != nil {
		return bad(err)
	}
	cache, err := model.NewContiguousCache(g.cfg, n+maxNew)
	if err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	if d := time.Duration(g.prefillDelay.Load()); d > 0 {
		select {
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-time.After(d):
		}
	}
	if err := send(&batonv1.GenerateEvent{RequestId: req.GetRequestId(), PromptTokenIds: req.GetPromptTokenIds()}); err != nil {
		return err
	}
	logits := make([]float32, g.cfg.Vocab)
	if err := g.m.Forward(prompt, 0, cache, logits); err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	smp.Accept(prompt...)
	dec := g.tok.NewStreamDecoder()
	generated := 0
	finish := func(ev *batonv1.GenerateEvent, why batonv1.FinishReason, stopReason string) error {
		ev.FinishReason, ev.StopReason = why, stopReason
		ev.Usage = &batonv1.Usage{PromptTokens: uint32(n), CompletionTokens: uint32(generated), TotalTokens: uint32(n + generated)}
		return send(ev)
	}
	// flush releases held-back text at the end of a generation that did not
	// end on a stop string; that text may still complete one.
	flush := func(ev *batonv1.GenerateEvent) (stopped bool) {
		text, stop := stopper.Push(-1, dec.Flush())
		ev.Text += text
		if !stop {
			ev.Text += stopper.Flush()
		}
		return stop
	}
	for pos := n; ; pos++ {
		if err := ctx.Err(); err != nil {
			return status.FromContextError(err).Err()
		}
		t, err := smp.Sample(logits)
		if err != nil {
			return status.Error(codes.Internal, err.Error())
		}
		ev := &batonv1.GenerateEvent{RequestId: req.GetRequestId()}
		if g.tok.IsEOG(t.ID) && (!sp.GetIgnoreEos() || smp.Ends(t.ID)) {
			flush(ev)
			return finish(ev, batonv1.FinishReason_FINISH_REASON_STOP, g.tok.Piece(t.ID))
		}
		generated++
		smp.Accept(t.ID)
		ev.TokenIds = []uint32{uint32(t.ID)}
		if params.Logprobs {
			// As the decode worker sends them: ids and logprobs, no text
			// (the router fills it from its tokenizer).
			ev.Logprobs = []*batonv1.TokenLogprob{apiconv.WireLogprob(t)}
		}
		text, stop := stopper.Push(t.ID, dec.Next(t.ID))
		ev.Text = text
		if stop {
			return finish(ev, batonv1.FinishReason_FINISH_REASON_STOP, "stop")
		}
		if generated == maxNew {
			if flush(ev) {
				return finish(ev, batonv1.FinishReason_FINISH_REASON_STOP, "stop")
			}
			return finish(ev, batonv1.FinishReason_FINISH_REASON_LENGTH, "")
		}
		if err := send(ev); err != nil {
			return err
		}
		if d := time.Duration(g.delay.Load()); d > 0 {
			select {
			case <-ctx.Done():
				return status.FromContextError(ctx.Err()).Err()
			case <-time.After(d):
			}
		}
		if err := g.m.Forward([]int32{t.ID}, pos, cache, logits); err != nil {
			return status.Error(codes.Internal, err.Error())
		}
	}
}

// waitEnded waits for the next Generate call to return and gives its error.
func (g *engineGen) waitEnded(t *testing.T, within time.Duration) error {
	t.Helper()
	select {
	case err := <-g.ended:
		return err
	case <-time.After(within):
		t.Fatalf("the generation did not end within %v", within)
		return errors.New("unreachable")
	}
}
