package logtest

import (
	"sync"
	"testing"
)

// TestBuffer logs from several goroutines at once (run with -race) and
// finds each record by its message, with its attributes.
func TestBuffer(t *testing.T) {
	var b Buffer
	log := b.Logger()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() { log.Info("hit", "n", i) })
	}
	wg.Wait()
	log.Warn("other")
	if n := b.Count("hit"); n != 8 {
		t.Fatalf("Count(hit) = %d, want 8:\n%s", n, b.String())
	}
	seen := map[float64]bool{}
	for _, r := range b.Records("hit") {
		seen[r["n"].(float64)] = true
	}
	if len(seen) != 8 {
		t.Errorf("attributes n seen: %v, want 0..7", seen)
	}
	if got := b.Records("other"); len(got) != 1 || got[0]["level"] != "WARN" {
		t.Errorf("Records(other) = %v", got)
	}
	if b.Count("missing") != 0 {
		t.Error("Count(missing) != 0")
	}
}
