package diagnose

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/svckit/tlsconf"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/encoding/protojson"
)

// reader reads one service once.
type reader interface {
	read(ctx context.Context) Sample
	// requests lists the service's in-flight requests (for following the
	// probe).
	requests(ctx context.Context) ([]Request, error)
	close()
}

// httpReader reads a service's HTTP endpoints: /metrics, /health/ready and
// /debug/requests.
type httpReader struct {
	base   string
	admin  string // the admin listener's base URL, for /debug/*; "": base
	client *http.Client
}

func (h *httpReader) close() {}

func (h *httpReader) get(ctx context.Context, path string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, h.base+path, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := h.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 32<<20))
	return resp.StatusCode, b, err
}

func (h *httpReader) read(ctx context.Context) Sample {
	smp := Sample{At: time.Now()}
	var (
		wg                   sync.WaitGroup
		metricsErr, readyErr error
		reqsErr              error
		metrics              map[string]float64
		readyCode            int
		readyBody            []byte
		reqs                 []Request
	)
	wg.Add(3)
	go func() {
		defer wg.Done()
		code, b, err := h.get(ctx, "/metrics")
		if err == nil && code != http.StatusOK {
			err = fmt.Errorf("GET /metrics: HTTP %d", code)
		}
		if err == nil {
			metrics, err = parseMetrics(bytes.NewReader(b))
		}
		metricsErr = err
	}()
	go func() {
		defer wg.Done()
		readyCode, readyBody, readyErr = h.get(ctx, "/health/ready")
	}()
	go func() {
		defer wg.Done()
		reqs, reqsErr = h.requests(ctx)
	}()
	wg.Wait()
	if metricsErr != nil && readyErr != nil && reqsErr != nil {
		smp.Err = shorten(readyErr.Error(), 200)
		return smp
	}
	smp.Metrics = metrics
	smp.Requests, smp.RequestsRead = reqs, reqsErr == nil
	switch {
	case readyErr != nil:
		smp.NotReady = "readiness unknown: " + readyErr.Error()
	case readyCode == http.StatusOK:
		smp.Ready = true
	default:
		smp.NotReady = readyReasons(readyCode, readyBody)
	}
	return smp
}

// readyReasons renders /health/ready's failing checks ("name: reason; ...").
func readyReasons(code int, body []byte) string {
	var r struct {
		Status  string            `json:"status"`
		Failing map[string]string `json:"failing"`
	}
	if json.Unmarshal(body, &r) != nil || len(r.Failing) == 0 {
		return fmt.Sprintf("HTTP %d %s", code, shorten(string(body), 120))
	}
	names := make([]string, 0, len(r.Failing))
	for n := range r.Failing {
		names = append(names, n)
	}
	sort.Strings(names)
	for i, n := range names {
		names[i] = n + ": " + r.Failing[n]
	}
	return strings.Join(names, "; ")
}

func (h *httpReader) requests(ctx context.Context) ([]Request, error) {
	r := h
	if h.admin != "" {
		r = &httpReader{base: h.admin, client: h.client}
	}
	code, b, err := r.get(ctx, "/debug/requests")
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("GET /debug/requests: HTTP %d", code)
	}
	var list batonv1.WorkerServiceListRequestsResponse
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(b, &list); err != nil {
		return nil, fmt.Errorf("GET /debug/requests: %w", err)
	}
	return fromProto(list.GetRequests()), nil
}

func fromProto(in []*batonv1.RequestInfo) []Request {
	out := make([]Request, 0, len(in))
	for _, r := range in {
		out = append(out, Request{
			ID: r.GetRequestId(), State: strings.TrimPrefix(r.GetState().String(), "REQUEST_STATE_"),
			AgeSeconds: r.GetAgeSeconds(), SinceProgress: r.GetSinceProgressSeconds(), Pages: int(r.GetPagesHeld()),
			Peer: r.GetPeer(), TraceID: r.GetTraceId(), Workers: r.GetWorkers(),
		})
	}
	return out
}

// grpcReader reads a worker known only by its gRPC address: gRPC health
// and WorkerService (load and request list). It has no metrics.
type grpcReader struct {
	conn *grpc.ClientConn
}

// With id (--tls-cert, --tls-key, --tls-ca) it dials with mutual TLS,
// expecting the worker's role in its certificate; workers serving mTLS
// refuse a plaintext client.
func newGRPCReader(addr string, role Role, id *tlsconf.Identity) (*grpcReader, error) {
	creds := grpc.WithTransportCredentials(insecure.NewCredentials())
	if id != nil {
		creds = id.DialOption(tlsconf.Role(role))
	}
	conn, err := grpc.NewClient(addr, creds)
	if err != nil {
		return nil, fmt.Errorf("worker %s: %w", addr, err)
	}
	return &grpcReader{conn: conn}, nil
}

func (g *grpcReader) close() { _ = g.conn.Close() }

func (g *grpcReader) read(ctx context.Context) Sample {
	smp := Sample{At: time.Now()}
	h, herr := healthpb.NewHealthClient(g.conn).Check(ctx, &healthpb.HealthCheckRequest{})
	reqs, rerr := g.requests(ctx)
	if herr != nil && rerr != nil {
		smp.Err = shorten(herr.Error(), 200)
		return smp
	}
	smp.Requests, smp.RequestsRead = reqs, rerr == nil
	switch {
	case herr != nil:
		smp.NotReady = "readiness unknown: " + herr.Error()
	case h.GetStatus() == healthpb.HealthCheckResponse_SERVING:
		smp.Ready = true
	default:
		smp.NotReady = "gRPC health " + h.GetStatus().String()
	}
	return smp
}

func (g *grpcReader) requests(ctx context.Context) ([]Request, error) {
	resp, err := batonv1.NewWorkerServiceClient(g.conn).ListRequests(ctx, &batonv1.WorkerServiceListRequestsRequest{})
	if err != nil {
		return nil, err
	}
	return fromProto(resp.GetRequests()), nil
}

// target is a service and its reader.
type target struct {
	svc Service
	r   reader
}

func newTarget(svc Service, client *http.Client, id *tlsconf.Identity) (target, error) {
	if svc.HTTP != "" {
		return target{svc, &httpReader{base: strings.TrimRight(svc.HTTP, "/"), admin: strings.TrimRight(svc.Admin, "/"), client: client}}, nil
	}
	g, err := newGRPCReader(svc.GRPC, svc.Role, id)
	if err != nil {
		return target{}, err
	}
	return target{svc, g}, nil
}

// sample reads every target n times, every interval, each read bounded by
// timeout; reads of one round run in parallel.
func sample(ctx context.Context, targets []target, n int, interval, timeout time.Duration) []ServiceObs {
	obs := make([]ServiceObs, len(targets))
	for i, t := range targets {
		obs[i].Service = t.svc
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for round := range n {
		if round > 0 {
			select {
			case <-ctx.Done():
				return obs
			case <-tick.C:
			}
		}
		var wg sync.WaitGroup
		for i, t := range targets {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rctx, cancel := context.WithTimeout(ctx, timeout)
				defer cancel()
				obs[i].Samples = append(obs[i].Samples, t.r.read(rctx))
			}()
		}
		wg.Wait()
	}
	return obs
}
