// Package generate implements `batonctl generate`, a small gRPC client of the
// router that streams a completion to the terminal.
package generate

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/baton-serving/baton/cmd/batonctl/internal/loopback"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Summary is the one-line description of the command.
const Summary = "stream a completion from a running router over gRPC"

const help = `Usage: batonctl generate --prompt TEXT [flags]

Sends the prompt to a router's RouterService.Generate and streams the text
to stdout as it arrives. Ctrl-C or --timeout cancels the request, which
aborts it on every worker.

With --json nothing is streamed; one JSON object is printed at the end:
  {"request_id":…,"prompt_ids":[…],"generated_ids":[…],"text":"…",
   "finish_reason":"…","ttft_seconds":…,"e2e_seconds":…}

Flags:`

type result struct {
	RequestID    string  `json:"request_id"`
	PromptIDs    []int32 `json:"prompt_ids"`
	GeneratedIDs []int32 `json:"generated_ids"`
	Text         string  `json:"text"`
	FinishReason string  `json:"finish_reason"`
	TTFT         float64 `json:"ttft_seconds"`
	E2E          float64 `json:"e2e_seconds"`
}

// Run is `batonctl generate`; it returns the exit code.
func Run(ctx context.Context, stdout, stderr io.Writer, args []string) int {
	fs := flag.NewFlagSet("batonctl generate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	router := fs.String("router", loopback.RouterGRPC, "router gRPC address (host:port)")
	prompt := fs.String("prompt", "", "prompt text")
	n := fs.Int("n", 64, "maximum tokens to generate")
	temp := fs.Float64("temperature", 0, "sampling temperature (0: greedy)")
	topP := fs.Float64("top-p", 1, "nucleus sampling threshold in (0, 1]")
	topK := fs.Int("top-k", 0, "keep the k most likely tokens (0: off)")
	seed := fs.Int64("seed", -1, "random seed (-1: the router picks one)")
	id := fs.String("request-id", "", "request id (default: the router assigns one)")
	timeout := fs.Duration("timeout", 0, "cancel the request after this long (0: no limit)")
	asJSON := fs.Bool("json", false, "print one JSON object at the end instead of streaming")
	var stops multi
	fs.Var(&stops, "stop", "stop string (repeatable)")
	fs.Usage = func() { fmt.Fprintln(stderr, help); fs.PrintDefaults() }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *n < 1 {
		fmt.Fprintf(stderr, "batonctl generate: -n %d: want ≥ 1\n", *n)
		return 2
	}
	if *timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *timeout)
		defer cancel()
	}
	sp := &batonv1.SamplingParams{
		Temperature: proto.Float32(float32(*temp)), TopP: proto.Float32(float32(*topP)),
		TopK: uint32(max(*topK, 0)), MaxNewTokens: uint32(*n), Stop: stops,
	}
	if *seed >= 0 {
		sp.Seed = proto.Uint64(uint64(*seed))
	}
	res, err := generate(ctx, *router, &batonv1.GenerateRequest{
		RequestId: *id, Prompt: *prompt, Sampling: sp,
		StreamOptions: &batonv1.StreamOptions{IncludeUsage: true, IncludeTiming: true},
	}, stdout, !*asJSON)
	if err != nil {
		fmt.Fprintf(stderr, "batonctl generate: %v\n", err)
		if ctx.Err() != nil {
			return 130
		}
		return 1
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		if err := enc.Encode(res); err != nil {
			return 1
		}
	} else {
		fmt.Fprintln(stdout)
	}
	return 0
}

func generate(ctx context.Context, addr string, req *batonv1.GenerateRequest, out io.Writer, stream bool) (*result, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("--router %s: %w", addr, err)
	}
	defer conn.Close()
	s, err := batonv1.NewRouterServiceClient(conn).Generate(ctx, req)
	if err != nil {
		return nil, describe(addr, err)
	}
	res := &result{PromptIDs: []int32{}, GeneratedIDs: []int32{}}
	var text strings.Builder
	for {
		resp, err := s.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, describe(addr, err)
		}
		ev := resp.GetEvent()
		if res.RequestID == "" {
			res.RequestID = ev.GetRequestId()
		}
		for _, id := range ev.GetPromptTokenIds() {
			res.PromptIDs = append(res.PromptIDs, int32(id))
		}
		for _, id := range ev.GetTokenIds() {
			res.GeneratedIDs = append(res.GeneratedIDs, int32(id))
		}
		text.WriteString(ev.GetText())
		if stream && ev.GetText() != "" {
			fmt.Fprint(out, ev.GetText())
		}
		if fr := ev.GetFinishReason(); fr != batonv1.FinishReason_FINISH_REASON_UNSPECIFIED {
			res.FinishReason = strings.ToLower(strings.TrimPrefix(fr.String(), "FINISH_REASON_"))
			res.TTFT = ev.GetTiming().GetTimeToFirstTokenSeconds()
			res.E2E = ev.GetTiming().GetE2ESeconds()
		}
	}
	res.Text = text.String()
	return res, nil
}

// describe turns a gRPC error into one line an operator can act on.
func describe(addr string, err error) error {
	st := status.Convert(err)
	switch st.Code() {
	case codes.Unavailable:
		return fmt.Errorf("router %s unavailable: %s", addr, st.Message())
	case codes.DeadlineExceeded:
		return fmt.Errorf("timed out: %s", st.Message())
	case codes.Canceled:
		return fmt.Errorf("cancelled")
	}
	return fmt.Errorf("%s: %s", strings.ToLower(st.Code().String()), st.Message())
}

// multi is a repeatable string flag.
type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }
