package decode

import (
	"errors"
	"io"
	"math"
	"testing"

	"github.com/baton-serving/baton/engine/gguf"
	"github.com/baton-serving/baton/engine/model"
	"github.com/baton-serving/baton/engine/sample"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/svckit/workerapi/workertest"
	"google.golang.org/protobuf/proto"
)

// echoRequest asks for the prompt's log-probabilities with top
// alternatives, greedy, maxNew tokens.
func echoRequest(id string, promptTokens, maxNew, top int, endpoint string) *batonv1.DecodeServiceGenerateRequest {
	temp := float32(0)
	return &batonv1.DecodeServiceGenerateRequest{
		Request: &batonv1.GenerateRequest{RequestId: id, PromptTokenIds: prompt(promptTokens), Sampling: &batonv1.SamplingParams{
			Temperature: &temp, MaxNewTokens: uint32(maxNew), IgnoreEos: true, TopLogprobs: uint32(top), PromptLogprobs: true,
		}},
		PrefillEndpoint: endpoint,
	}
}

// echoed reads a started call to its end and returns the prompt
// log-probabilities, failing unless exactly one event carried them: the
// first token's.
func echoed(t *testing.T, c *call) ([]*batonv1.TokenLogprob, []uint32) {
	t.Helper()
	var lps []*batonv1.TokenLogprob
	var tokens []uint32
	carriers := 0
	for i := 0; ; i++ {
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
			lps = ev.GetPromptLogprobs()
			if i != 0 || len(ev.GetTokenIds()) != 1 {
				t.Errorf("prompt logprobs on event %d (%d tokens), want the first token's", i, len(ev.GetTokenIds()))
			}
		}
		tokens = append(tokens, ev.GetTokenIds()...)
	}
	if carriers > 1 {
		t.Errorf("prompt logprobs on %d events, want one", carriers)
	}
	return lps, tokens
}

// referenceEcho computes the prompt's log-probabilities one token at a time
// through Forward on workertest's model.
func referenceEcho(t *testing.T, ids []uint32, top int) []*batonv1.TokenLogprob {
	t.Helper()
	f, err := gguf.Open(workertest.Model(t))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := model.Load(f, model.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	cache, err := model.NewContiguousCache(m.Config(), len(ids))
	if err != nil {
		t.Fatal(err)
	}
	logits := make([]float32, m.Config().Vocab)
	var out []*batonv1.TokenLogprob
	for i, id := range ids {
		if i > 0 {
			lp, alts := sample.Logprobs(logits, int32(id), top)
			w := &batonv1.TokenLogprob{TokenId: id, Logprob: lp}
			for _, a := range alts {
				w.TopLogprobs = append(w.TopLogprobs, &batonv1.TopLogprob{TokenId: uint32(a.ID), Logprob: a.Logprob})
			}
			out = append(out, w)
		}
		if err := m.Forward([]int32{int32(id)}, i, cache, logits); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// TestPromptLogprobsPDMatchesColocated: a request asking for its prompt's
// log-probabilities (echo) gets them on its first token, one per prompt
// token after the first, identical whether prefill computed the prompt
// (PD, in chunks of 16) or decode did (colocated, chunks of 16), equal to
// the prompt run one token at a time through Forward (F32 KV caches), top
// alternatives ordered most likely first; a request without the flag gets
// none; both workers end idle.
func TestPromptLogprobsPDMatchesColocated(t *testing.T) {
	chunked := []string{"--max-batch-tokens", "16", "--kv-dtype", "f32"}
	p := startPD(t, chunked, append([]string{"--credit-window", "1"}, chunked...), nil)
	const n, top = 60, 3
	local, localTokens := echoed(t, p.start(t, echoRequest("echo-local", n, 2, top, localPrefill)))
	remote, remoteTokens := echoed(t, p.start(t, echoRequest("echo-pd", n, 2, top, p.prefill.Addr())))
	if len(local) != n-1 {
		t.Fatalf("colocated: %d prompt logprobs for %d tokens, want %d", len(local), n, n-1)
	}
	if len(remote) != len(local) {
		t.Fatalf("PD: %d prompt logprobs, colocated %d", len(remote), len(local))
	}
	for i := range local {
		if !proto.Equal(local[i], remote[i]) {
			t.Fatalf("prompt logprob %d: PD %v, colocated %v", i, remote[i], local[i])
		}
	}
	if len(localTokens) != 2 || len(remoteTokens) != 2 || localTokens[0] != remoteTokens[0] || localTokens[1] != remoteTokens[1] {
		t.Errorf("tokens: colocated %v, PD %v", localTokens, remoteTokens)
	}
	ids := prompt(n)
	ref := referenceEcho(t, ids, top)
	for i, lp := range local {
		r := ref[i]
		if lp.GetTokenId() != ids[i+1] || math.Abs(float64(lp.GetLogprob()-r.GetLogprob())) > 1e-5 || len(lp.GetTopLogprobs()) != top {
			t.Fatalf("prompt logprob %d: %v, Forward one token at a time %v", i, lp, r)
		}
		for k, alt := range lp.GetTopLogprobs() {
			if alt.GetTokenId() != r.GetTopLogprobs()[k].GetTokenId() || math.Abs(float64(alt.GetLogprob()-r.GetTopLogprobs()[k].GetLogprob())) > 1e-5 {
				t.Fatalf("prompt logprob %d alternative %d: %v, reference %v", i, k, alt, r.GetTopLogprobs()[k])
			}
			if k > 0 {
				prev := lp.GetTopLogprobs()[k-1]
				if prev.GetLogprob() < alt.GetLogprob() || prev.GetLogprob() == alt.GetLogprob() && prev.GetTokenId() > alt.GetTokenId() {
					t.Fatalf("prompt logprob %d: alternatives %v not most likely first", i, lp.GetTopLogprobs())
				}
			}
		}
	}
	plain := request("plain", n, 3, p.prefill.Addr())
	if lps, _ := echoed(t, p.start(t, plain)); lps != nil {
		t.Errorf("a request without prompt_logprobs got %d", len(lps))
	}
	p.waitIdle(t)
}
