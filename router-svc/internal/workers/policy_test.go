package workers

import (
	"testing"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
)

func worker(addr string, queued, running, used, total uint32) *Worker {
	w := &Worker{Addr: addr}
	w.load.Store(&batonv1.LoadReport{Ready: true, QueuedRequests: queued, RunningRequests: running, PagesUsed: used, PagesTotal: total})
	return w
}

func TestPolicies(t *testing.T) {
	a, b, c := worker("a", 2, 1, 0, 10), worker("b", 0, 1, 5, 10), worker("c", 0, 1, 1, 10)
	ll, _ := NewPolicy("least-load")
	if got := ll.Pick([]*Worker{a, b, c}); got != c {
		t.Errorf("least-load picked %s, want c (least work, then least KV use)", got.Addr)
	}
	// The router's own in-flight count wins over a lagging report.
	rel := c.Acquire()
	c.Acquire()
	if got := ll.Pick([]*Worker{a, b, c}); got != b {
		t.Errorf("least-load with c busy picked %s, want b", got.Addr)
	}
	rel()
	rel() // idempotent
	if c.Inflight() != 1 {
		t.Errorf("inflight = %d, want 1", c.Inflight())
	}
	rr, _ := NewPolicy("round-robin")
	seen := map[string]int{}
	for range 6 {
		seen[rr.Pick([]*Worker{a, b, c}).Addr]++
	}
	if seen["a"] != 2 || seen["b"] != 2 || seen["c"] != 2 {
		t.Errorf("round-robin spread %v", seen)
	}
	if rr.Pick(nil) != nil || ll.Pick(nil) != nil {
		t.Error("pick from no candidates")
	}
	if _, err := NewPolicy("random"); err == nil {
		t.Error("unknown policy accepted")
	}
}
