package decode

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/baton-serving/baton/engine/sample"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/svckit"
	"github.com/baton-serving/baton/svckit/apiconv"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// choices reads a Generate stream of n > 1 choices to its end: each
// choice's tokens and finish by index, and the stream's last usage.
func (c *call) choices(t *testing.T, n int) ([]output, *batonv1.Usage) {
	t.Helper()
	outs := make([]output, n)
	var usage *batonv1.Usage
	for {
		resp, err := c.stream.Recv()
		if errors.Is(err, io.EOF) {
			return outs, usage
		}
		if err != nil {
			t.Fatal(err)
		}
		ev := resp.GetEvent()
		k := int(ev.GetIndex())
		if k >= n {
			t.Fatalf("event of choice %d of %d", k, n)
		}
		if usage != nil {
			t.Fatalf("event %v after the usage", ev)
		}
		if outs[k].finish != batonv1.FinishReason_FINISH_REASON_UNSPECIFIED {
			t.Fatalf("choice %d: event after its finish", k)
		}
		outs[k].tokens = append(outs[k].tokens, ev.GetTokenIds()...)
		outs[k].finish = ev.GetFinishReason()
		usage = ev.GetUsage()
	}
}

// TestChoicesMatchIndependent: a request for 3 choices, colocated and PD
// (one transfer; the other choices fork on decode), gives each choice the
// tokens a request of its own with the choice's derived seed gives, and
// usage counts the prompt once and every choice's tokens.
func TestChoicesMatchIndependent(t *testing.T) {
	p := startPD(t, nil, nil, nil)
	const n = 3
	for _, tc := range []struct{ name, endpoint string }{{"colocated", localPrefill}, {"pd", p.prefill.Addr()}} {
		var want [n][]uint32
		for k := range n {
			in := request(fmt.Sprintf("%s-alone-%d", tc.name, k), 21, 6, tc.endpoint)
			seed := sample.ChoiceSeed(in.Request.Sampling.GetSeed(), k)
			in.Request.Sampling.Seed = &seed
			out, err := p.start(t, in).rest()
			if err != nil {
				t.Fatal(err)
			}
			want[k] = out.tokens
		}
		in := request(tc.name+"-n", 21, 6, tc.endpoint)
		in.Request.Sampling.N = proto.Uint32(n)
		got, usage := p.start(t, in).choices(t, n)
		for k := range n {
			if !equalU32(got[k].tokens, want[k]) || got[k].finish != batonv1.FinishReason_FINISH_REASON_LENGTH {
				t.Errorf("%s choice %d: %v (%s), alone %v", tc.name, k, got[k].tokens, got[k].finish, want[k])
			}
		}
		if usage.GetPromptTokens() != 21 || usage.GetCompletionTokens() != n*6 || usage.GetTotalTokens() != 21+n*6 {
			t.Errorf("%s: usage %v", tc.name, usage)
		}
	}
	p.waitIdle(t)
}

// TestChoicesBadN: n = 0 and n above decode's --max-n are refused naming
// sampling.n; cancelling a request of 4 choices mid-decode frees them all.
func TestChoicesBadN(t *testing.T) {
	p := startPD(t, nil, []string{"--max-n", "4"}, nil)
	for _, n := range []uint32{0, 5} {
		in := request("bad", 5, 3, localPrefill)
		in.Request.Sampling.N = proto.Uint32(n)
		stream, err := p.client.Generate(t.Context(), in)
		if err == nil {
			_, err = stream.Recv()
		}
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "sampling.n") {
			t.Errorf("n = %d: %v, want INVALID_ARGUMENT naming sampling.n", n, err)
		}
	}
	in := request("cancel", 9, 60, localPrefill)
	in.Request.Sampling.N = proto.Uint32(4)
	c := p.start(t, in)
	seen := map[uint32]bool{}
	for len(seen) < 4 {
		resp, err := c.stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		seen[resp.GetEvent().GetIndex()] = true
	}
	c.cancel()
	if _, err := c.rest(); status.Code(err) != codes.Canceled {
		t.Fatalf("err = %v, want CANCELED", err)
	}
	p.waitIdle(t)
}

// TestChoicesPromptLogprobsFirst: with prompt_logprobs and n = 2, the
// prompt's log-probabilities come on the stream's first event with a token
// or a finish, once — also when every choice ends before any token (the
// end-of-generation token first, forced by logit_bias), so that a choice's
// end comes first — colocated and PD.
func TestChoicesPromptLogprobsFirst(t *testing.T) {
	p := startPD(t, nil, nil, nil)
	for _, tc := range []struct{ name, endpoint string }{{"colocated", localPrefill}, {"pd", p.prefill.Addr()}} {
		for _, stop := range []bool{false, true} {
			in := echoRequest(fmt.Sprintf("%s-%t", tc.name, stop), 12, 2, 1, tc.endpoint)
			in.Request.Sampling.N = proto.Uint32(2)
			if stop {
				const eos = 2 // the test model's
				in.Request.Sampling.LogitBias = map[uint32]float32{eos: 100}
				in.Request.Sampling.IgnoreEos = false
			}
			c := p.start(t, in)
			carriers, seen := 0, false
			for {
				resp, err := c.stream.Recv()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				ev := resp.GetEvent()
				if len(ev.GetPromptLogprobs()) > 0 {
					carriers++
					if len(ev.GetPromptLogprobs()) != 11 || seen {
						t.Errorf("%s stop %t: %d prompt logprobs after %v", tc.name, stop, len(ev.GetPromptLogprobs()), seen)
					}
				}
				if !seen && (len(ev.GetTokenIds()) > 0 || ev.GetFinishReason() != 0) {
					seen = true
					if len(ev.GetPromptLogprobs()) == 0 {
						t.Errorf("%s stop %t: the first event with a token or a finish has no prompt logprobs: %v", tc.name, stop, ev)
					}
				}
			}
			if carriers != 1 {
				t.Errorf("%s stop %t: prompt logprobs on %d events", tc.name, stop, carriers)
			}
		}
	}
	p.waitIdle(t)
}

// TestChoicesJSONSchema: under a JSON Schema, each of n = 3 choices (each
// with its own matcher, compiled by decode) validates, ends with STOP and
// equals the request of its own with the choice's seed — colocated and PD.
func TestChoicesJSONSchema(t *testing.T) {
	p := startPD(t, nil, nil, nil)
	const n = 3
	sp := func(seed uint64) *batonv1.SamplingParams {
		s := seeded(0.9, seed, 110)
		s.JsonSchema, s.LogitBias = testSchema, noSpace()
		return s
	}
	for _, ep := range []string{localPrefill, p.prefill.Addr()} {
		s := sp(7)
		s.N = proto.Uint32(n)
		stream, err := p.client.Generate(t.Context(), &batonv1.DecodeServiceGenerateRequest{
			Request:         &batonv1.GenerateRequest{RequestId: "schema-n", PromptTokenIds: prompt(12), Sampling: s},
			PrefillEndpoint: ep,
		})
		if err != nil {
			t.Fatal(err)
		}
		texts := make([]strings.Builder, n)
		finishes := make([]batonv1.FinishReason, n)
		for {
			resp, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			ev := resp.GetEvent()
			texts[ev.GetIndex()].WriteString(ev.GetText())
			if f := ev.GetFinishReason(); f != batonv1.FinishReason_FINISH_REASON_UNSPECIFIED {
				finishes[ev.GetIndex()] = f
			}
		}
		for k := range n {
			alone, err := p.generate(t, fmt.Sprintf("schema-%d", k), ep, sp(sample.ChoiceSeed(7, k)))
			if err != nil {
				t.Fatal(err)
			}
			got := texts[k].String()
			if got != alone.text || finishes[k] != batonv1.FinishReason_FINISH_REASON_STOP {
				t.Errorf("%s choice %d: %q (%v), alone %q", ep, k, got, finishes[k], alone.text)
			}
			if err := validTestSchema(got); err != nil {
				t.Errorf("%s choice %d: %q does not validate: %v", ep, k, got, err)
			}
		}
	}
	p.waitIdle(t)
}

// TestMaxNFlag: decode's --max-n defaults to 16, is shown with its
// environment variable, and is refused outside 1-128 naming the flag.
func TestMaxNFlag(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{{nil, ""}, {[]string{"--max-n", "0"}, "--max-n: 0"}, {[]string{"--max-n", "129"}, "--max-n: 129"}} {
		s := New()
		fs := flag.NewFlagSet("decode", flag.ContinueOnError)
		s.AddFlags(fs)
		if err := svckit.ParseFlags(fs, c.args, func(string) (string, bool) { return "", false }); err != nil {
			t.Fatal(err)
		}
		if c.want == "" {
			if s.maxN != apiconv.DefaultMaxN || !strings.Contains(fs.Lookup("max-n").Usage, "$BATON_MAX_N") {
				t.Errorf("default --max-n %d, usage %q", s.maxN, fs.Lookup("max-n").Usage)
			}
			continue
		}
		if err := s.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.args, err, c.want)
		}
	}
}
