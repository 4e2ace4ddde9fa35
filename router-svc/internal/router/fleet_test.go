package router

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/router-svc/internal/workers"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// TestMain fails the package if a test leaves a goroutine behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Behaviours of a fake decode worker's Generate.
const (
	serve        = iota // the prompt echoed, three tokens, LENGTH
	failEarly           // the prompt echoed, then UNAVAILABLE before any token
	failLate            // the prompt echoed, one token, then UNAVAILABLE
	hang                // the prompt echoed, then nothing until cancelled
	refuseEarly         // UNAVAILABLE at once
	timeoutEarly        // the prompt echoed, then DEADLINE_EXCEEDED before any token (a silent peer)
	hangLate            // the prompt echoed, one token, then nothing until cancelled
	timeoutLate         // the prompt echoed, then DEADLINE_EXCEEDED shortly before the call's own deadline
	echoEOF             // the prompt echoed, then the stream ends without a token or a finish
)

// fakeDecode is a decode worker's DecodeService and WorkerService on a
// loopback port, without an engine.
type fakeDecode struct {
	batonv1.UnimplementedDecodeServiceServer
	batonv1.UnimplementedWorkerServiceServer
	addr     string
	srv      *grpc.Server
	behave   atomic.Int32
	quiet    atomic.Bool // WatchLoad goes silent, its stream open
	down     atomic.Bool // WatchLoad reports NOT_SERVING
	calls    atomic.Int32
	inflight atomic.Int32
	ended    chan error

	// listeners, when set, are the HTTP and admin addresses Info reports.
	listeners atomic.Pointer[[2]string]
}

func startFakeDecode(t *testing.T, behave int) *fakeDecode {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeDecode{addr: lis.Addr().String(), srv: grpc.NewServer(), ended: make(chan error, 16)}
	f.behave.Store(int32(behave))
	batonv1.RegisterDecodeServiceServer(f.srv, f)
	batonv1.RegisterWorkerServiceServer(f.srv, f)
	go f.srv.Serve(lis)
	t.Cleanup(f.srv.Stop)
	return f
}

func (f *fakeDecode) Generate(in *batonv1.DecodeServiceGenerateRequest, stream batonv1.DecodeService_GenerateServer) (err error) {
	f.calls.Add(1)
	f.inflight.Add(1)
	defer func() {
		f.inflight.Add(-1)
		f.ended <- err
	}()
	id := in.GetRequest().GetRequestId()
	send := func(ev *batonv1.GenerateEvent) error {
		ev.RequestId = id
		return stream.Send(&batonv1.DecodeServiceGenerateResponse{Event: ev})
	}
	behave := f.behave.Load()
	if behave == refuseEarly {
		return status.Error(codes.Unavailable, "refusing")
	}
	if err := send(&batonv1.GenerateEvent{PromptTokenIds: in.GetRequest().GetPromptTokenIds()}); err != nil {
		return err
	}
	switch behave {
	case failEarly:
		return status.Error(codes.Unavailable, "prefill went away")
	case timeoutEarly:
		return status.Error(codes.DeadlineExceeded, "prefill did not send within 10s")
	case hang:
		<-stream.Context().Done()
		return status.FromContextError(stream.Context().Err()).Err()
	case timeoutLate:
		// A worker's own timer firing a moment before the client's: the
		// router gets DEADLINE_EXCEEDED with almost no time left.
		if dl, ok := stream.Context().Deadline(); ok {
			select {
			case <-stream.Context().Done():
			case <-time.After(time.Until(dl) - 300*time.Millisecond):
			}
		}
		return status.Error(codes.DeadlineExceeded, "prefill did not send in time")
	case echoEOF:
		return nil
	}
	for i := range 3 {
		if err := send(&batonv1.GenerateEvent{TokenIds: []uint32{uint32(10 + i)}, Text: "t"}); err != nil {
			return err
		}
		switch behave {
		case failLate:
			return status.Error(codes.Unavailable, "scheduler closed")
		case hangLate:
			<-stream.Context().Done()
			return status.FromContextError(stream.Context().Err()).Err()
		}
	}
	return send(&batonv1.GenerateEvent{FinishReason: batonv1.FinishReason_FINISH_REASON_LENGTH})
}

func (f *fakeDecode) Info(context.Context, *batonv1.InfoRequest) (*batonv1.InfoResponse, error) {
	info := &batonv1.InfoResponse{Role: batonv1.WorkerRole_WORKER_ROLE_DECODE}
	if l := f.listeners.Load(); l != nil {
		info.HttpAddr, info.AdminAddr = l[0], l[1]
	}
	return info, nil
}

func (f *fakeDecode) WatchLoad(req *batonv1.WatchLoadRequest, stream batonv1.WorkerService_WatchLoadServer) error {
	t := time.NewTicker(time.Duration(req.GetIntervalMs()) * time.Millisecond)
	defer t.Stop()
	for {
		if !f.quiet.Load() {
			if err := stream.Send(&batonv1.WatchLoadResponse{Load: &batonv1.LoadReport{
				Ready: !f.down.Load(), RunningRequests: uint32(f.inflight.Load()), PagesTotal: 64}}); err != nil {
				return err
			}
		}
		select {
		case <-stream.Context().Done():
			return nil
		case <-t.C:
		}
	}
}

// fleetRouter is a colocated router over the given decode workers, with
// its worker set running (no canary, no servers: tests call run).
func fleetRouter(t *testing.T, maxInflight int, decodes ...*fakeDecode) *Service {
	t.Helper()
	s := testRouter(t)
	s.logger = slog.New(slog.DiscardHandler)
	s.metrics = newMetrics(prometheus.NewRegistry(), s.inflight)
	s.limit = newLimiter(0)
	s.fleet = fleetFlags{maxInflight: maxInflight}
	var addrs workers.Static
	for _, d := range decodes {
		addrs = append(addrs, d.addr)
	}
	s.decodes = workers.NewSet(workers.Config{Role: batonv1.WorkerRole_WORKER_ROLE_DECODE, Source: addrs,
		LoadInterval: 50 * time.Millisecond, LostAfter: 500 * time.Millisecond, Logger: s.logger,
		DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}})
	var err error
	if s.decodePolicy, err = workers.NewPolicy("round-robin"); err != nil {
		t.Fatal(err)
	}
	s.prefillPolicyName, s.decPolicy = "local", "round-robin"
	s.pairer = &workers.Pairer{Decode: s.decodes, DecodePolicy: s.decodePolicy, MaxInflight: maxInflight}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { s.decodes.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	deadline := time.Now().Add(5 * time.Second)
	for len(s.decodes.Ready()) < len(decodes) {
		if time.Now().After(deadline) {
			t.Fatalf("decode workers not ready: %s", workers.Describe(s.decodes))
		}
		time.Sleep(10 * time.Millisecond)
	}
	return s
}

// collect runs one request through s and returns its events.
func collect(ctx context.Context, s *Service) ([]*batonv1.GenerateEvent, error) {
	var evs []*batonv1.GenerateEvent
	err := s.run(ctx, &batonv1.GenerateRequest{Prompt: "Once upon a time"}, func(ev *batonv1.GenerateEvent) error {
		evs = append(evs, ev)
		return nil
	})
	return evs, err
}

func tokens(evs []*batonv1.GenerateEvent) (prompts, toks int) {
	for _, ev := range evs {
		if len(ev.GetPromptTokenIds()) > 0 {
			prompts++
		}
		toks += len(ev.GetTokenIds())
	}
	return prompts, toks
}

func TestFailover(t *testing.T) {
	for _, tc := range []struct {
		name        string
		a, b        int // behaviours of the two decode workers
		code        codes.Code
		msg         string // in the error, with the failing worker's address
		callsA      int32
		callsB      int32
		wantPrompts int
		wantTokens  int
	}{
		{name: "retried before the first token", a: failEarly, b: serve, code: codes.OK, callsA: 1, callsB: 1, wantPrompts: 1, wantTokens: 3},
		{name: "refused, retried", a: refuseEarly, b: serve, code: codes.OK, callsA: 1, callsB: 1, wantPrompts: 1, wantTokens: 3},
		{name: "retried once only", a: failEarly, b: failEarly, code: codes.Unavailable, msg: "prefill went away", callsA: 1, callsB: 1},
		{name: "worker deadline before the first token, retried", a: timeoutEarly, b: serve, code: codes.OK, callsA: 1, callsB: 1, wantPrompts: 1, wantTokens: 3},
		{name: "not retried after a token", a: failLate, b: serve, code: codes.Unavailable, msg: "scheduler closed", callsA: 1, callsB: 0, wantPrompts: 1, wantTokens: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := startFakeDecode(t, tc.a), startFakeDecode(t, tc.b)
			s := fleetRouter(t, 0, a, b)
			// Round-robin over the sorted addresses: make a the first.
			if b.addr < a.addr {
				a, b = b, a
				a.behave.Store(int32(tc.a))
				b.behave.Store(int32(tc.b))
			}
			evs, err := collect(context.Background(), s)
			if status.Code(err) != tc.code {
				t.Fatalf("status %v (%v), want %v", status.Code(err), err, tc.code)
			}
			if tc.msg != "" && (!strings.Contains(err.Error(), tc.msg) || !strings.Contains(err.Error(), "decode 127.0.0.1:")) {
				t.Errorf("error %q should name the decode worker and say %q", err, tc.msg)
			}
			if a.calls.Load() != tc.callsA || b.calls.Load() != tc.callsB {
				t.Errorf("calls %d and %d, want %d and %d", a.calls.Load(), b.calls.Load(), tc.callsA, tc.callsB)
			}
			if p, n := tokens(evs); p != tc.wantPrompts || n != tc.wantTokens {
				t.Errorf("client saw %d prompt events and %d tokens, want %d and %d", p, n, tc.wantPrompts, tc.wantTokens)
			}
			for _, w := range s.decodes.Workers() {
				if w.Inflight() != 0 {
					t.Errorf("%s: in-flight %d after the request", w.Addr, w.Inflight())
				}
			}
			if n := s.inflight.len(); n != 0 {
				t.Errorf("router in-flight %d", n)
			}
		})
	}
}

// TestLostWorkerFailsFast: a worker whose load reports stop, its connection
// still open, fails the requests on it with UNAVAILABLE naming it, long
// before any request deadline.
func TestLostWorkerFailsFast(t *testing.T) {
	d := startFakeDecode(t, hang)
	s := fleetRouter(t, 0, d)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errc := make(chan error, 1)
	go func() { _, err := collect(ctx, s); errc <- err }()
	for d.inflight.Load() == 0 {
		time.Sleep(5 * time.Millisecond)
	}
	start := time.Now()
	d.quiet.Store(true)
	var err error
	select {
	case err = <-errc:
	case <-time.After(10 * time.Second):
		t.Fatal("the request on a lost worker did not end")
	}
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "worker lost") || !strings.Contains(err.Error(), d.addr) {
		t.Errorf("error %v, want UNAVAILABLE: worker lost, naming %s", err, d.addr)
	}
	t.Logf("failed %v after the worker went silent: %v", time.Since(start).Round(time.Millisecond), err)
	if got := <-d.ended; status.Code(got) != codes.Canceled {
		t.Errorf("the worker's call ended with %v, want CANCELED", got)
	}
}

func TestInflightLimit(t *testing.T) {
	a, b := startFakeDecode(t, hang), startFakeDecode(t, hang)
	s := fleetRouter(t, 1, a, b)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { _, _ = collect(ctx, s) })
	}
	for a.inflight.Load()+b.inflight.Load() < 2 {
		time.Sleep(5 * time.Millisecond)
	}
	_, err := collect(context.Background(), s)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "every decode worker") ||
		!strings.Contains(err.Error(), "--max-inflight-per-worker") {
		t.Errorf("third request: %v, want RESOURCE_EXHAUSTED naming decode and the flag", err)
	}
	// /debug/workers shows the two requests, one per worker.
	rec := httptest.NewRecorder()
	s.serveDebugWorkers(rec, httptest.NewRequest("GET", "/debug/workers", nil))
	var dw debugWorkers
	if err := json.Unmarshal(rec.Body.Bytes(), &dw); err != nil {
		t.Fatalf("/debug/workers: %v\n%s", err, rec.Body)
	}
	if dw.Mode != "colocated" || dw.MaxInflight != 1 || dw.Prefill != nil || dw.Canary != nil || len(dw.Decode.Workers) != 2 {
		t.Fatalf("/debug/workers = %s", rec.Body)
	}
	var addrs []string
	for _, w := range dw.Decode.Workers {
		addrs = append(addrs, w.Address)
		if !w.Ready || !w.Routable || w.Inflight != 1 || w.RoutedTotal != 1 || w.Load == nil || w.Load.PagesTotal != 64 || w.Role != "decode" {
			t.Errorf("worker %+v", w)
		}
	}
	if want := []string{a.addr, b.addr}; !slices.Equal(addrs, sortedCopy(want)) {
		t.Errorf("workers %v, want %v", addrs, want)
	}
	cancel()
	wg.Wait()
	for _, w := range s.decodes.Workers() {
		if w.Inflight() != 0 {
			t.Errorf("%s: in-flight %d after cancel", w.Addr, w.Inflight())
		}
	}
}

func sortedCopy(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}

func TestPickStatus(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code codes.Code
	}{
		{&workers.PickError{Role: batonv1.WorkerRole_WORKER_ROLE_DECODE, Full: true, Limit: 2}, codes.ResourceExhausted},
		{&workers.PickError{Role: batonv1.WorkerRole_WORKER_ROLE_PREFILL, Source: "a:1"}, codes.Unavailable},
		{errors.New("other"), codes.Unavailable},
	} {
		if got := status.Code(pickStatus(tc.err)); got != tc.code {
			t.Errorf("pickStatus(%v) = %v, want %v", tc.err, got, tc.code)
		}
	}
}

func TestFleetFlags(t *testing.T) {
	for _, tc := range []struct {
		f   fleetFlags
		err string
	}{
		{fleetFlags{resolveInterval: time.Second, canaryInterval: 15 * time.Second, canaryTimeout: time.Second}, ""},
		{fleetFlags{resolveInterval: time.Second, canaryTimeout: time.Second}, ""},
		{fleetFlags{resolveInterval: time.Millisecond, canaryTimeout: time.Second}, "--resolve-interval"},
		{fleetFlags{resolveInterval: time.Second, maxInflight: -1, canaryTimeout: time.Second}, "--max-inflight-per-worker"},
		{fleetFlags{resolveInterval: time.Second, canaryInterval: -1, canaryTimeout: time.Second}, "--canary-interval"},
		{fleetFlags{resolveInterval: time.Second, canaryInterval: time.Millisecond, canaryTimeout: time.Second}, "--canary-interval"},
		{fleetFlags{resolveInterval: time.Second}, "--canary-timeout"},
		{fleetFlags{resolveInterval: time.Second, canaryTimeout: time.Second, dnsServer: "nope"}, "--dns-server"},
	} {
		err := tc.f.validate()
		if (err == nil) != (tc.err == "") || err != nil && !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%+v: %v, want %q", tc.f, err, tc.err)
		}
	}
}

// TestClientDeadlineNotRetried: the client's own deadline ends its request
// with DEADLINE_EXCEEDED; it is not retried on another pair.
func TestClientDeadlineNotRetried(t *testing.T) {
	a, b := startFakeDecode(t, hang), startFakeDecode(t, hang)
	s := fleetRouter(t, 0, a, b)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := collect(ctx, s)
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("status %v (%v), want DEADLINE_EXCEEDED", status.Code(err), err)
	}
	if n := a.calls.Load() + b.calls.Load(); n != 1 {
		t.Errorf("%d attempts, want 1: the client's deadline is not retried", n)
	}
}

// TestNotServingWorker: a request on a decode worker that turns NOT_SERVING
// before its first token is cancelled there and retried on another pair; one
// past its first token stays and ends at its own deadline.
func TestNotServingWorker(t *testing.T) {
	for _, tc := range []struct {
		name   string
		behave int
		code   codes.Code
		callsB int32
	}{
		{"before the first token, retried", hang, codes.OK, 1},
		{"after the first token, its deadline", hangLate, codes.DeadlineExceeded, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := startFakeDecode(t, tc.behave), startFakeDecode(t, serve)
			s := fleetRouter(t, 0, a, b)
			if b.addr < a.addr { // round-robin picks the lower address first
				a, b = b, a
				a.behave.Store(int32(tc.behave))
				b.behave.Store(serve)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			errc := make(chan error, 1)
			go func() { _, err := collect(ctx, s); errc <- err }()
			for a.inflight.Load() == 0 {
				time.Sleep(5 * time.Millisecond)
			}
			time.Sleep(50 * time.Millisecond) // the token of hangLate reaches the router
			a.down.Store(true)
			err := <-errc
			if status.Code(err) != tc.code {
				t.Fatalf("status %v (%v), want %v", status.Code(err), err, tc.code)
			}
			if b.calls.Load() != tc.callsB {
				t.Errorf("%d calls on the serving worker, want %d", b.calls.Load(), tc.callsB)
			}
			if tc.code == codes.OK {
				if got := <-a.ended; status.Code(got) != codes.Canceled {
					t.Errorf("the NOT_SERVING worker's call ended with %v, want CANCELED", got)
				}
			}
		})
	}
}

// TestNoRetryAtTheDeadline: a worker's DEADLINE_EXCEEDED with too little of
// the request's time left for a second pair to answer is not retried: the
// retry could only time out. With time left, it is.
func TestNoRetryAtTheDeadline(t *testing.T) {
	for _, tc := range []struct {
		name     string
		a        int
		deadline time.Duration
		code     codes.Code
		callsB   int32
	}{
		{"a moment before the deadline, not retried", timeoutLate, 2 * time.Second, codes.DeadlineExceeded, 0},
		{"with time left, retried", timeoutEarly, time.Minute, codes.OK, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := startFakeDecode(t, tc.a), startFakeDecode(t, serve)
			s := fleetRouter(t, 0, a, b)
			if b.addr < a.addr { // round-robin picks the lower address first
				a, b = b, a
				a.behave.Store(int32(tc.a))
				b.behave.Store(serve)
			}
			ctx, cancel := context.WithTimeout(context.Background(), tc.deadline)
			defer cancel()
			_, err := collect(ctx, s)
			if status.Code(err) != tc.code {
				t.Fatalf("status %v (%v), want %v", status.Code(err), err, tc.code)
			}
			if a.calls.Load() != 1 || b.calls.Load() != tc.callsB {
				t.Errorf("calls %d and %d, want 1 and %d", a.calls.Load(), b.calls.Load(), tc.callsB)
			}
		})
	}
}

// TestClientSendFailureNotRetried: an attempt whose stream ends without a
// finish, while handing the held prompt event to the client failed (a slow
// client: DEADLINE_EXCEEDED), is not retried: the failure is the client's,
// and another pair would only stream to the same client.
func TestClientSendFailureNotRetried(t *testing.T) {
	a, b := startFakeDecode(t, echoEOF), startFakeDecode(t, serve)
	s := fleetRouter(t, 0, a, b)
	if b.addr < a.addr {
		a, b = b, a
		a.behave.Store(echoEOF)
		b.behave.Store(serve)
	}
	slow := status.Error(codes.DeadlineExceeded, "client took nothing within --client-write-timeout")
	err := s.run(context.Background(), &batonv1.GenerateRequest{Prompt: "Once upon a time"}, func(*batonv1.GenerateEvent) error { return slow })
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("status %v (%v), want the client's DEADLINE_EXCEEDED", status.Code(err), err)
	}
	if b.calls.Load() != 0 {
		t.Errorf("%d calls on the second worker, want 0: a failed send to the client is not retried", b.calls.Load())
	}
}
