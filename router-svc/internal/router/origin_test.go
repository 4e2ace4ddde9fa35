package router

import "testing"

// TestRequestOrigins: the origin the workers see names one request at one
// router process. Prefill lets a handshake replace a live transfer of its
// id only when the origins match, so two routers (the fleet overlay runs
// two) whose clients chose the same id, or one router's requests with an id
// used twice in a row, must never share one.
func TestRequestOrigins(t *testing.T) {
	seen := map[string]bool{}
	for _, tab := range []*inflight{newInflight(), newInflight()} {
		for range 2 {
			r := &request{id: "same-id"}
			remove, err := tab.add(r)
			if err != nil {
				t.Fatal(err)
			}
			remove()
			if r.origin == "" || seen[r.origin] {
				t.Fatalf("origin %q: empty or given twice (%v)", r.origin, seen)
			}
			seen[r.origin] = true
		}
	}
}
