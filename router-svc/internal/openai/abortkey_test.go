package openai_test

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// otherKey is a second client's valid key.
const otherKey = "sk-baton-other-9876543210"

// TestAbortOnlyByOwnKey (issue 18, defect 9): with API keys on, a request
// may be aborted only with the key that made it. Another client's valid
// key gets NOT_FOUND — the same answer as an unknown id, so ids of other
// clients' requests cannot be probed — and the request runs on; its own
// key aborts it, over gRPC and REST alike.
func TestAbortOnlyByOwnKey(t *testing.T) {
	keys := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(keys, []byte(testKey+"\n"+otherKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tr := startRouter(t, "--api-keys-file", keys, "--request-timeout", "1m")
	client := batonv1.NewRouterServiceClient(tr.grpc)

	for _, via := range []string{"grpc", "rest"} {
		t.Run(via, func(t *testing.T) {
			id := "owned-" + via
			ctx, cancel := context.WithCancel(tr.authed())
			defer cancel()
			stream := startHeldStream(ctx, t, tr, id, 120)
			abort := func(key string) (int, error) {
				if via == "grpc" {
					md := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+key)
					_, err := client.Abort(md, &batonv1.AbortRequest{RequestId: id, Reason: "test"})
					return 0, err
				}
				req, _ := http.NewRequest("POST", tr.http+"/v1/requests/"+id+":abort", strings.NewReader(`{"reason":"test"}`))
				req.Header.Set("Authorization", "Bearer "+key)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					return 0, err
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				return resp.StatusCode, nil
			}
			code, err := abort(otherKey)
			switch {
			case via == "grpc" && status.Code(err) != codes.NotFound:
				t.Errorf("Abort with another client's key: %v, want NOT_FOUND", err)
			case via == "rest" && (err != nil || code != http.StatusNotFound):
				t.Errorf("REST abort with another client's key: %d %v, want 404", code, err)
			}
			// The request runs on: it is still listed (to its own key) and
			// still streams.
			lr, err := client.ListRequests(tr.authed(), &batonv1.ListRequestsRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if n := len(lr.GetRequests()); n != 1 {
				t.Errorf("after the foreign abort: %d requests in flight, want 1", n)
			}
			for range 3 {
				if _, err := stream.Recv(); err != nil {
					t.Fatalf("stream after the foreign abort: %v", err)
				}
			}
			code, err = abort(testKey)
			switch {
			case via == "grpc" && err != nil:
				t.Errorf("Abort with the request's own key: %v", err)
			case via == "rest" && (err != nil || code != http.StatusOK):
				t.Errorf("REST abort with the request's own key: %d %v, want 200", code, err)
			}
			deadline := time.Now().Add(5 * time.Second)
			for {
				if _, err = stream.Recv(); err != nil || time.Now().After(deadline) {
					break
				}
			}
			if status.Code(err) != codes.Aborted {
				t.Errorf("stream after its own key's abort: %v, want ABORTED", err)
			}
			tr.idle(t)
		})
	}
}

// TestListRequestsOnlyOwnKey (issue 18, defect 9): with API keys on,
// ListRequests shows a caller only the requests its own key made — over
// gRPC and REST — so another client's request ids, peers and trace ids are
// not listed (the admin listener's /debug/requests still lists all).
func TestListRequestsOnlyOwnKey(t *testing.T) {
	keys := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(keys, []byte(testKey+"\n"+otherKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tr := startRouter(t, "--api-keys-file", keys, "--request-timeout", "1m")
	ctx, cancel := context.WithCancel(tr.authed())
	defer cancel()
	startHeldStream(ctx, t, tr, "listed-to-owner", 120)
	client := batonv1.NewRouterServiceClient(tr.grpc)
	list := func(key string) []string {
		md := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+key)
		lr, err := client.ListRequests(md, &batonv1.ListRequestsRequest{})
		if err != nil {
			t.Fatalf("ListRequests: %v", err)
		}
		var ids []string
		for _, r := range lr.GetRequests() {
			ids = append(ids, r.GetRequestId())
		}
		req, _ := http.NewRequest("GET", tr.http+"/v1/requests", nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("GET /v1/requests: %v", err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || strings.Contains(string(b), "listed-to-owner") != slices.Contains(ids, "listed-to-owner") {
			t.Errorf("GET /v1/requests: %d %s; gRPC listed %v", resp.StatusCode, b, ids)
		}
		return ids
	}
	if ids := list(otherKey); len(ids) != 0 {
		t.Errorf("ListRequests with another client's key: %v, want none", ids)
	}
	if ids := list(testKey); !slices.Equal(ids, []string{"listed-to-owner"}) {
		t.Errorf("ListRequests with the request's own key: %v, want [listed-to-owner]", ids)
	}
	cancel()
	tr.idle(t)
}

// startHeldStream starts a Generate over its own connection with small
// flow-control windows, asking for a large answer (20 logprobs a token),
// and reads its first event: a test reading no more keeps the request in
// flight until it is aborted or ctx ends.
func startHeldStream(ctx context.Context, t *testing.T, tr *testRouter, id string, maxNew uint32) batonv1.RouterService_GenerateClient {
	t.Helper()
	conn, err := grpc.NewClient(tr.grpc.Target(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(1<<16), grpc.WithInitialConnWindowSize(1<<16))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	stream, err := batonv1.NewRouterServiceClient(conn).Generate(ctx, &batonv1.GenerateRequest{RequestId: id, Prompt: "Once upon a time",
		Sampling: &batonv1.SamplingParams{Temperature: proto.Float32(0), MaxNewTokens: maxNew, IgnoreEos: true, Logprobs: true, TopLogprobs: 20}})
	if err == nil {
		_, err = stream.Recv()
	}
	if err != nil {
		t.Fatal(err)
	}
	return stream
}
