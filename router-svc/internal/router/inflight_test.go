package router

import (
	"testing"
	"time"
)

// TestEntriesWhileSending checks what reconciliation is told about a
// request: its pair while the workers may be computing it, and no worker
// while the router waits on a slow client to take an event (the workers
// may have finished it then, and that is no orphan).
func TestEntriesWhileSending(t *testing.T) {
	tab := newInflight()
	r := &request{id: "slow"}
	remove, err := tab.add(r)
	if err != nil {
		t.Fatal(err)
	}
	defer remove()
	r.setRoute("p:1", "d:1", 0)
	if es := tab.entries(); len(es) != 1 || es[0].Decode != "d:1" || es[0].Prefill != "p:1" {
		t.Fatalf("entries while computing: %+v, want the pair", es)
	}
	r.sending.Store(true)
	if es := tab.entries(); len(es) != 1 || es[0].Decode != "" || es[0].Prefill != "" {
		t.Fatalf("entries while sending: %+v, want no worker", es)
	}
}

// TestRetryShowsAttempt: a retry's workers in /debug/requests name the
// attempt; the client's request id stays as it was.
func TestRetryShowsAttempt(t *testing.T) {
	r := &request{id: "req-1"}
	r.setRoute("p:1", "d:1", 0)
	if got := r.info(time.Now()).GetWorkers(); got != "prefill=p:1 decode=d:1" {
		t.Errorf("first attempt: workers %q", got)
	}
	r.setRoute("p:2", "d:1", 1)
	if ri := r.info(time.Now()); ri.GetWorkers() != "prefill=p:2 decode=d:1 attempt=1" || ri.GetRequestId() != "req-1" {
		t.Errorf("retry: %v", ri)
	}
}
