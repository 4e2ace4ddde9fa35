// Package workerapi implements baton.v1.WorkerService, which prefill and decode
// workers both serve, over callbacks into the worker's own state.
package workerapi

import (
	"context"
	"time"

	"github.com/baton-serving/baton/engine/kvcache"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Source is what a worker exposes to the WorkerService.
type Source interface {
	// Info describes the worker.
	Info() *batonv1.InfoResponse
	// Load reports the current load.
	Load(ctx context.Context) *batonv1.LoadReport
	// Requests lists in-flight requests, oldest first.
	Requests() []*batonv1.RequestInfo
}

// CacheLog is a worker's prefix cache as WatchLoad follows it
// (*kvcache.Pool).
type CacheLog interface {
	CacheInfo() kvcache.CacheInfo
	CacheSnapshot() (hashes []kvcache.Hash, next uint64)
	CacheEventsSince(seq uint64, max int) (events []kvcache.CacheEvent, next uint64, ok bool)
}

// CacheSource is a Source with a prefix cache that the router may follow
// (WatchLoadRequest.cache_events). A Source without one reports its cache
// as off.
type CacheSource interface {
	CacheLog() CacheLog
}

// Service is the WorkerService over a Source.
type Service struct {
	batonv1.UnimplementedWorkerServiceServer
	src Source
	// httpAddr and adminAddr are the worker's bound listeners, reported in
	// Info so that the router's /debug/workers (and batonctl diagnose) can
	// find /metrics and the admin listener's /debug/requests.
	httpAddr, adminAddr string
}

// New returns the WorkerService for src.
func New(src Source) *Service { return &Service{src: src} }

// WithListeners makes Info report the worker's bound HTTP and admin
// addresses (svckit.Server.HTTPAddr and AdminAddr; "" for none) unless the
// Source reports its own.
func (s *Service) WithListeners(httpAddr, adminAddr string) *Service {
	s.httpAddr, s.adminAddr = httpAddr, adminAddr
	return s
}

// Info describes the worker.
func (s *Service) Info(context.Context, *batonv1.InfoRequest) (*batonv1.InfoResponse, error) {
	info := s.src.Info()
	if s.httpAddr == "" && s.adminAddr == "" {
		return info, nil
	}
	info = proto.Clone(info).(*batonv1.InfoResponse) // the Source may hand out a shared message
	if info.HttpAddr == "" {
		info.HttpAddr = s.httpAddr
	}
	if info.AdminAddr == "" {
		info.AdminAddr = s.adminAddr
	}
	return info, nil
}

// GetLoad reports the current load.
func (s *Service) GetLoad(ctx context.Context, _ *batonv1.GetLoadRequest) (*batonv1.GetLoadResponse, error) {
	return &batonv1.GetLoadResponse{Load: s.src.Load(ctx)}, nil
}

// MinWatchInterval is the shortest WatchLoad interval accepted.
const MinWatchInterval = 50 * time.Millisecond

// WatchLoad sends a report at once and then every interval until the caller
// goes away; with cache_events, each report carries the prefix cache's
// changes since the one before (the first, a snapshot).
func (s *Service) WatchLoad(req *batonv1.WatchLoadRequest, stream batonv1.WorkerService_WatchLoadServer) error {
	every := time.Duration(req.GetIntervalMs()) * time.Millisecond
	if every == 0 {
		every = time.Second
	}
	if every < MinWatchInterval {
		return status.Errorf(codes.InvalidArgument, "interval_ms: must be at least %d, got %d", MinWatchInterval.Milliseconds(), req.GetIntervalMs())
	}
	var cw *cacheWatch
	if req.GetCacheEvents() {
		cw = &cacheWatch{}
		if cs, ok := s.src.(CacheSource); ok {
			cw.log = cs.CacheLog()
		}
	}
	ctx := stream.Context()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		load := s.src.Load(ctx)
		var parts []*batonv1.CacheEvents
		if cw != nil {
			parts = splitCacheEvents(cw.next(), maxKeysPerMessage)
		}
		for i := 0; i == 0 || i < len(parts); i++ {
			msg := &batonv1.WatchLoadResponse{Load: load}
			if i < len(parts) {
				msg.Cache = parts[i]
			}
			if err := stream.Send(msg); err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-t.C:
		}
	}
}

// maxKeysPerMessage bounds the keys of one WatchLoadResponse (8 bytes
// each and a tag: about 600 KB), well inside gRPC's default 4 MiB receive
// limit whatever the size of the cache.
const maxKeysPerMessage = 1 << 16

// splitCacheEvents cuts ev into messages of at most max keys each: the
// first keeps snapshot, the rest continue it as plain changes (stored
// first, then removed — disjoint, so their order does not matter).
func splitCacheEvents(ev *batonv1.CacheEvents, max int) []*batonv1.CacheEvents {
	if len(ev.GetStored())+len(ev.GetRemoved()) <= max {
		return []*batonv1.CacheEvents{ev}
	}
	var out []*batonv1.CacheEvents
	stored, removed := ev.GetStored(), ev.GetRemoved()
	for first := true; first || len(stored) > 0 || len(removed) > 0; first = false {
		part := &batonv1.CacheEvents{Enabled: ev.GetEnabled(), Snapshot: first && ev.GetSnapshot(), Seed: ev.GetSeed(), PageSize: ev.GetPageSize()}
		n := min(len(stored), max)
		part.Stored, stored = stored[:n], stored[n:]
		m := min(len(removed), max-n)
		part.Removed, removed = removed[:m], removed[m:]
		out = append(out, part)
	}
	return out
}

// cacheWatch is one WatchLoad stream's place in the cache's event log.
type cacheWatch struct {
	log    CacheLog // nil: the worker has no prefix cache
	synced bool     // a snapshot was sent; seq is where the log continues
	seq    uint64
}

// next returns the changes since the last report: a snapshot first, and
// again whenever the log no longer reaches back to seq; otherwise each
// key's last change, so that stored and removed are disjoint and may be
// applied in any order.
func (c *cacheWatch) next() *batonv1.CacheEvents {
	if c.log == nil {
		return &batonv1.CacheEvents{Snapshot: true}
	}
	info := c.log.CacheInfo()
	if !info.Enabled {
		c.synced = false
		return &batonv1.CacheEvents{Snapshot: true}
	}
	out := &batonv1.CacheEvents{Enabled: true, Seed: uint64(info.Seed), PageSize: uint32(info.PageSize)}
	if c.synced {
		evs, next, ok := c.log.CacheEventsSince(c.seq, 0)
		if ok {
			c.seq = next
			last := make(map[kvcache.Hash]bool, len(evs))
			order := make([]kvcache.Hash, 0, len(evs))
			for _, e := range evs {
				if _, seen := last[e.Hash]; !seen {
					order = append(order, e.Hash)
				}
				last[e.Hash] = e.Stored
			}
			for _, h := range order {
				if last[h] {
					out.Stored = append(out.Stored, uint64(h))
				} else {
					out.Removed = append(out.Removed, uint64(h))
				}
			}
			return out
		}
	}
	hashes, next := c.log.CacheSnapshot()
	c.seq, c.synced, out.Snapshot = next, true, true
	out.Stored = make([]uint64, len(hashes))
	for i, h := range hashes {
		out.Stored[i] = uint64(h)
	}
	return out
}

// ListRequests lists in-flight requests.
func (s *Service) ListRequests(context.Context, *batonv1.WorkerServiceListRequestsRequest) (*batonv1.WorkerServiceListRequestsResponse, error) {
	return &batonv1.WorkerServiceListRequestsResponse{Requests: s.src.Requests()}, nil
}
