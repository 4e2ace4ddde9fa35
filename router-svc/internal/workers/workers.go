// Package workers keeps the router's view of its prefill and decode workers:
// one gRPC connection each, and a live load report from each worker's
// WatchLoad stream. A worker is routable only while its stream reports it
// ready and its identity (role, model fingerprint) matches what the router
// serves.
package workers

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"google.golang.org/grpc"
)

// Worker is one prefill or decode worker.
type Worker struct {
	Addr string
	Role batonv1.WorkerRole
	Conn *grpc.ClientConn

	load     atomic.Pointer[batonv1.LoadReport]
	lastErr  atomic.Pointer[string]
	updated  atomic.Int64 // unix nanos of the last report
	inflight atomic.Int64 // requests the router has on this worker
}

// Load is the last load report (nil before the first).
func (w *Worker) Load() *batonv1.LoadReport { return w.load.Load() }

// Ready reports whether the worker's last report, received within staleAfter,
// said it was ready.
func (w *Worker) Ready(staleAfter time.Duration) bool {
	l := w.load.Load()
	return l != nil && l.GetReady() && time.Since(time.Unix(0, w.updated.Load())) < staleAfter
}

// LastError is the last reason the worker was unusable ("" if none).
func (w *Worker) LastError() string {
	if p := w.lastErr.Load(); p != nil {
		return *p
	}
	return ""
}

// Inflight is the number of router requests currently on the worker.
func (w *Worker) Inflight() int64 { return w.inflight.Load() }

// Acquire counts a request on the worker; the returned func releases it and is
// safe to call more than once.
func (w *Worker) Acquire() (release func()) {
	w.inflight.Add(1)
	var once sync.Once
	return func() { once.Do(func() { w.inflight.Add(-1) }) }
}

func (w *Worker) setErr(err error) {
	s := err.Error()
	w.lastErr.Store(&s)
	w.load.Store(nil)
}

// Set is the workers of one role.
type Set struct {
	Role        batonv1.WorkerRole
	Workers     []*Worker
	Fingerprint string // expected model fingerprint ("" accepts any)
	Interval    time.Duration
	Logger      *slog.Logger
}

// NewSet connects (lazily, as gRPC does) to each address.
func NewSet(role batonv1.WorkerRole, addrs []string, fingerprint string, interval time.Duration, logger *slog.Logger, opts ...grpc.DialOption) (*Set, error) {
	s := &Set{Role: role, Fingerprint: fingerprint, Interval: interval, Logger: logger}
	for _, a := range addrs {
		conn, err := grpc.NewClient(a, opts...)
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("worker %s: %w", a, err)
		}
		s.Workers = append(s.Workers, &Worker{Addr: a, Role: role, Conn: conn})
	}
	return s, nil
}

// Ready returns the workers that can take requests now.
func (s *Set) Ready() []*Worker {
	var out []*Worker
	for _, w := range s.Workers {
		if w.Ready(s.staleAfter()) {
			out = append(out, w)
		}
	}
	return out
}

func (s *Set) staleAfter() time.Duration { return 3*s.Interval + time.Second }

// Watch keeps every worker's load current until ctx ends: it checks the
// worker's identity, then follows its WatchLoad stream, reconnecting with
// backoff when it breaks. It returns when ctx ends and all its goroutines
// have stopped.
func (s *Set) Watch(ctx context.Context) {
	var wg sync.WaitGroup
	for _, w := range s.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.watch(ctx, w)
		}()
	}
	wg.Wait()
}

func (s *Set) watch(ctx context.Context, w *Worker) {
	backoff := 100 * time.Millisecond
	for failures := 0; ctx.Err() == nil; failures++ {
		err := s.follow(ctx, w)
		if ctx.Err() != nil {
			return
		}
		w.setErr(err)
		if w.updated.Load() != 0 {
			failures = 0 // it had been reachable: this is news
		}
		// Workers starting alongside the router are refused for a moment;
		// only a worker that stays unreachable, or one that was reachable,
		// is worth a warning.
		level := slog.LevelDebug
		if failures == 0 && w.updated.Load() != 0 || failures == 5 || failures%50 == 49 {
			level = slog.LevelWarn
		}
		s.Logger.Log(ctx, level, "worker unavailable", "worker", w.Addr, "role", s.Role.String(), "err", err, "attempts", failures+1, "retry_in", backoff.String())
		w.updated.Store(0)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// follow checks the worker's identity and streams its load reports until the
// stream breaks.
func (s *Set) follow(ctx context.Context, w *Worker) error {
	client := batonv1.NewWorkerServiceClient(w.Conn)
	ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
	info, err := client.Info(ictx, &batonv1.InfoRequest{})
	cancel()
	if err != nil {
		return fmt.Errorf("info: %w", err)
	}
	if info.GetRole() != s.Role {
		return fmt.Errorf("worker reports role %v, configured as %v", info.GetRole(), s.Role)
	}
	if fp := info.GetModel().GetFingerprint(); s.Fingerprint != "" && fp != "" && fp != s.Fingerprint {
		return fmt.Errorf("worker serves model fingerprint %s, the router %s", fp, s.Fingerprint)
	}
	stream, err := client.WatchLoad(ctx, &batonv1.WatchLoadRequest{IntervalMs: uint32(s.Interval.Milliseconds())})
	if err != nil {
		return fmt.Errorf("watch load: %w", err)
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			return fmt.Errorf("watch load: %w", err)
		}
		w.load.Store(resp.GetLoad())
		w.updated.Store(time.Now().UnixNano())
		w.lastErr.Store(nil)
	}
}

// Close closes every connection.
func (s *Set) Close() error {
	for _, w := range s.Workers {
		w.Conn.Close()
	}
	return nil
}
