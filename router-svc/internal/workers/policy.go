package workers

import (
	"fmt"
	"sync/atomic"
)

// Policy picks one worker among ready candidates.
type Policy interface {
	Pick(candidates []*Worker) *Worker
	Name() string
}

// NewPolicy returns the named policy: "round-robin" or "least-load".
func NewPolicy(name string) (Policy, error) {
	switch name {
	case "round-robin":
		return &roundRobin{}, nil
	case "least-load":
		return leastLoad{}, nil
	}
	return nil, fmt.Errorf("policy %q: want round-robin or least-load", name)
}

type roundRobin struct{ next atomic.Uint64 }

func (r *roundRobin) Name() string { return "round-robin" }

func (r *roundRobin) Pick(c []*Worker) *Worker {
	if len(c) == 0 {
		return nil
	}
	return c[(r.next.Add(1)-1)%uint64(len(c))]
}

type leastLoad struct{}

func (leastLoad) Name() string { return "least-load" }

// score orders workers by work waiting or running (the worker's own counts,
// or the router's in-flight count when higher, since reports lag), then by
// KV cache use.
func score(w *Worker) (work int64, kv float64) {
	l := w.Load()
	work = int64(l.GetQueuedRequests() + l.GetRunningRequests() + l.GetTransferringRequests())
	work = max(work, w.Inflight())
	if l.GetPagesTotal() > 0 {
		kv = float64(l.GetPagesUsed()) / float64(l.GetPagesTotal())
	}
	return work, kv
}

func (leastLoad) Pick(c []*Worker) *Worker {
	var best *Worker
	var bw int64
	var bk float64
	for _, w := range c {
		wk, kv := score(w)
		if best == nil || wk < bw || (wk == bw && kv < bk) {
			best, bw, bk = w, wk, kv
		}
	}
	return best
}
