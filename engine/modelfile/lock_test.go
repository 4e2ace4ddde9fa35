package modelfile

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// testMutualExclusion checks that lock excludes a second holder until the
// first releases it, and that a waiter gives up when its context ends.
func testMutualExclusion(t *testing.T, lock func(context.Context, string) (func(), error)) {
	checkGoroutines(t)
	path := filepath.Join(t.TempDir(), "m.gguf.lock")
	unlock, err := lock(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 3*lockPoll)
	defer cancel()
	if _, err := lock(ctx, path); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second lock while held: %v, want a deadline error", err)
	}

	var got atomic.Bool
	done := make(chan error)
	go func() {
		u, err := lock(context.Background(), path)
		if err == nil {
			got.Store(true)
			u()
		}
		done <- err
	}()
	time.Sleep(3 * lockPoll)
	if got.Load() {
		t.Fatal("second holder got the lock while the first held it")
	}
	unlock()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("waiter did not get the lock after release")
	}
}

func TestLockFile(t *testing.T) {
	testMutualExclusion(t, lockFile)
}

func TestLockExcl(t *testing.T) {
	testMutualExclusion(t, func(ctx context.Context, p string) (func(), error) {
		return lockExcl(ctx, p, time.Minute)
	})
}

func TestLockExclBreaksStaleLock(t *testing.T) {
	checkGoroutines(t)
	path := filepath.Join(t.TempDir(), "m.gguf.lock")
	if err := os.WriteFile(path, []byte("pid 999999\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(path, old, old); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	unlock, err := lockExcl(ctx, path, time.Minute)
	if err != nil {
		t.Fatalf("stale lock not broken: %v", err)
	}
	unlock()
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("lock file left after unlock: %v", err)
	}
}

func TestLockExclHeartbeatKeepsLockFresh(t *testing.T) {
	checkGoroutines(t)
	path := filepath.Join(t.TempDir(), "m.gguf.lock")
	const stale = 400 * time.Millisecond
	unlock, err := lockExcl(context.Background(), path, stale)
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	// Well past the stale age, a live holder's lock must still hold.
	ctx, cancel := context.WithTimeout(context.Background(), 3*stale)
	defer cancel()
	if _, err := lockExcl(ctx, path, stale); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a live lock was broken or errored: %v", err)
	}
}
