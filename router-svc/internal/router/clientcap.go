package router

// The per-client-address cap on requests in flight
// (--max-inflight-per-client), checked with the global limiter at
// admission: one address — one misbehaving client, or 256 trickling ones
// from a single host — cannot take every slot while readiness says SERVING.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// Metadata the REST gateway adds to the calls it makes for HTTP clients:
// the client's address, and a per-process token proving that the gateway,
// not a client, set it.
const (
	mdGatewayToken = "x-baton-gateway-token"
	mdClientAddr   = "x-baton-client-addr"
)

// clientCap counts requests in flight by client address.
type clientCap struct {
	max   int    // 0: no cap
	token string // the gateway's proof (mdGatewayToken)

	mu       sync.Mutex
	inflight map[string]int
}

func newClientCap(max int) *clientCap {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return &clientCap{max: max, token: hex.EncodeToString(b[:]), inflight: map[string]int{}}
}

// acquire counts one request from client; release must be called once. A
// nil clientCap is unbounded.
func (c *clientCap) acquire(client string) (release func(), err error) {
	if c == nil || c.max <= 0 {
		return func() {}, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.inflight[client] >= c.max {
		return nil, status.Errorf(codes.ResourceExhausted,
			"too many requests in flight from %s (the limit is %d per client address, --max-inflight-per-client); retry shortly", client, c.max)
	}
	c.inflight[client]++
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.inflight[client]--; c.inflight[client] <= 0 {
				delete(c.inflight, client)
			}
		})
	}, nil
}

// clientOf is the address (host only: every connection has its own port)
// of the client that made the request in ctx: the HTTP client's for a REST
// call the gateway forwards, else the gRPC (or, through package openai,
// HTTP) peer's.
func (c *clientCap) clientOf(ctx context.Context) string {
	if md, ok := metadata.FromIncomingContext(ctx); ok && c != nil {
		if tok := md.Get(mdGatewayToken); len(tok) == 1 && tok[0] == c.token {
			if a := md.Get(mdClientAddr); len(a) == 1 {
				return hostOf(a[0])
			}
		}
	}
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return hostOf(p.Addr.String())
	}
	return ""
}

func hostOf(addr string) string {
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h
	}
	return addr
}

// admit takes a slot for a request: first its client address's, then one
// of --max-concurrent-requests. release gives both back.
func (s *Service) admit(ctx context.Context) (release func(), err error) {
	cc := s.clientCap
	releaseClient, err := cc.acquire(cc.clientOf(ctx))
	if err != nil {
		return nil, err
	}
	releaseSlot, err := s.limit.acquire()
	if err != nil {
		releaseClient()
		return nil, err
	}
	return func() { releaseSlot(); releaseClient() }, nil
}

// gatewayMetadata is what the REST gateway adds to each call: the HTTP
// client's address, vouched for by the token.
func (c *clientCap) gatewayMetadata(remoteAddr string) metadata.MD {
	if c == nil {
		return nil
	}
	return metadata.Pairs(mdGatewayToken, c.token, mdClientAddr, remoteAddr)
}

// String describes the cap for logs.
func (c *clientCap) String() string {
	if c == nil || c.max <= 0 {
		return "none"
	}
	return fmt.Sprintf("%d per client address", c.max)
}
