//go:build e2e

package tests

import (
	"context"
	"strings"
	"testing"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/svckit/tlsconf"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// TestHandshakeMismatch: a decode worker with another model or KV layout is
// refused with FAILED_PRECONDITION naming the difference.
func TestHandshakeMismatch(t *testing.T) {
	c := startCluster(t, workerFlags)
	info, err := batonv1.NewWorkerServiceClient(dial(t, c.prefill.grpc)).Info(context.Background(), &batonv1.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	wrongPage := proto.Clone(info.GetKvLayout()).(*batonv1.KVLayout)
	wrongPage.PageSizeTokens *= 2
	wrongType := proto.Clone(info.GetKvLayout()).(*batonv1.KVLayout)
	wrongType.Dtype = batonv1.KVDataType_KV_DATA_TYPE_F32
	cases := []struct {
		name        string
		fingerprint string
		layout      *batonv1.KVLayout
		want        string
	}{
		{"other model", "sha256:0000", info.GetKvLayout(), "model_fingerprint"},
		{"other page size", info.GetModel().GetFingerprint(), wrongPage, "kv_layout.page_size_tokens"},
		{"other dtype", info.GetModel().GetFingerprint(), wrongType, "kv_layout.dtype"},
	}
	kv := dialAs(t, c.prefill.grpc, tlsconf.Decode) // the test plays a decode worker
	for _, cs := range cases {
		t.Run(cs.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			stream, err := batonv1.NewPrefillServiceClient(kv).TransferKV(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := stream.Send(&batonv1.TransferKVRequest{Msg: &batonv1.TransferKVRequest_Handshake{Handshake: &batonv1.Handshake{
				RequestId: "mismatch", PromptTokenIds: []uint32{1, 403}, ModelFingerprint: cs.fingerprint,
				KvLayout: cs.layout, PagesReserved: 1, InitialCredits: 4}}}); err != nil {
				t.Fatal(err)
			}
			_, err = stream.Recv()
			if status.Code(err) != codes.FailedPrecondition || !strings.Contains(status.Convert(err).Message(), cs.want) {
				t.Errorf("got %v, want FAILED_PRECONDITION naming %s", err, cs.want)
			}
		})
	}
	c.waitIdle(t, 2*time.Second)
}

// longPrompt is n real token ids from the golden data, repeated.
func longPrompt(g golden, n int) []uint32 {
	var out []uint32
	for len(out) < n {
		for _, gen := range g.Generations {
			out = append(out, u32s(gen.GeneratedIDs)...)
		}
	}
	out[0] = 1
	return out[:n]
}

// TestTransferStall: the network between decode and prefill stops
// forwarding without closing, (a) before prefill accepts and (b) in the
// middle of the KV transfer. Decode reports DEADLINE_EXCEEDED within its
// deadlines, and both workers release everything.
func TestTransferStall(t *testing.T) {
	g := loadGolden(t)
	c := startCluster(t, map[string][]string{
		"prefill": {"--kv-cache-bytes", "64MiB", "--transfer-idle-timeout", "500ms"},
		"decode": {"--kv-cache-bytes", "64MiB", "--transfer-idle-timeout", "500ms", "--handshake-timeout", "500ms",
			"--abort-ack-timeout", "200ms", "--credit-window", "1"},
	})
	decode := batonv1.NewDecodeServiceClient(dial(t, c.decode.grpc))
	for _, cs := range []struct {
		name        string
		freezeAfter int64
		want        string
	}{
		{"before accept", 1, "did not accept the transfer"},
		{"mid-transfer", 20 << 10, "did not send the next KV chunk"},
	} {
		t.Run(cs.name, func(t *testing.T) {
			px := startProxy(t, c.prefill.grpc, cs.freezeAfter)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			start := time.Now()
			stream, err := decode.Generate(ctx, &batonv1.DecodeServiceGenerateRequest{
				PrefillEndpoint: px.addr(),
				Request: &batonv1.GenerateRequest{RequestId: "stall-" + strings.ReplaceAll(cs.name, " ", "-"),
					PromptTokenIds: longPrompt(g, 200), Sampling: &batonv1.SamplingParams{
						Temperature: proto.Float32(0), Seed: proto.Uint64(1), MaxNewTokens: 8}},
			})
			for err == nil {
				_, err = stream.Recv()
			}
			took := time.Since(start)
			if status.Code(err) != codes.DeadlineExceeded || !strings.Contains(status.Convert(err).Message(), cs.want) {
				t.Errorf("got %v after %v, want DEADLINE_EXCEEDED saying %q", err, took, cs.want)
			}
			t.Logf("stall detected after %v: %v", took, status.Convert(err).Message())
			c.waitIdle(t, 3*time.Second)
		})
	}
}

// TestFirstTokenDeadline: whatever stalls before the first token — here a
// prefill that never answers, with generous transfer deadlines — the
// first-token deadline ends the request and both workers release.
func TestFirstTokenDeadline(t *testing.T) {
	g := loadGolden(t)
	c := startCluster(t, map[string][]string{
		"prefill": {"--kv-cache-bytes", "64MiB"},
		"decode": {"--kv-cache-bytes", "64MiB", "--handshake-timeout", "30s", "--transfer-idle-timeout", "30s",
			"--first-token-timeout", "400ms", "--abort-ack-timeout", "200ms"},
	})
	px := startProxy(t, c.prefill.grpc, 1)
	decode := batonv1.NewDecodeServiceClient(dial(t, c.decode.grpc))
	start := time.Now()
	stream, err := decode.Generate(context.Background(), &batonv1.DecodeServiceGenerateRequest{
		PrefillEndpoint: px.addr(),
		Request: &batonv1.GenerateRequest{RequestId: "first-token", PromptTokenIds: longPrompt(g, 50),
			Sampling: &batonv1.SamplingParams{Temperature: proto.Float32(0), Seed: proto.Uint64(1), MaxNewTokens: 8}},
	})
	for err == nil {
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.DeadlineExceeded || !strings.Contains(status.Convert(err).Message(), "first-token-timeout") {
		t.Errorf("got %v after %v, want DEADLINE_EXCEEDED naming --first-token-timeout", err, time.Since(start))
	}
	c.waitIdle(t, 3*time.Second)
}
