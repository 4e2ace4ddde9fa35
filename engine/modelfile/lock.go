package modelfile

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"
)

// lockPoll is how often a process waiting for another's download retries
// the lock. Downloads take seconds to hours, so a short poll costs nothing.
const lockPoll = 100 * time.Millisecond

// sleepCtx waits for d or until ctx is done.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// lockExcl takes a lock by creating path with O_EXCL, for systems without
// flock. The holder refreshes the file's modification time every stale/4,
// so a lock file older than stale belongs to a process that died, and is
// broken. Breaking is best effort: two waiters that see the same stale file
// at the same instant can, in a narrow window, both proceed.
func lockExcl(ctx context.Context, path string, stale time.Duration) (unlock func(), err error) {
	for {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err == nil {
			_, werr := fmt.Fprintf(f, "pid %d\n", os.Getpid())
			if cerr := f.Close(); werr == nil {
				werr = cerr
			}
			if werr != nil {
				os.Remove(path)
				return nil, fmt.Errorf("model: lock %s: %w", path, werr)
			}
			return heartbeat(path, stale/4), nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("model: lock %s: %w", path, err)
		}
		if fi, err := os.Stat(path); err == nil && time.Since(fi.ModTime()) > stale {
			// Renaming to a unique name first means that of several waiters
			// that saw the same stale file, only one removes it.
			tmp := fmt.Sprintf("%s.stale.%d.%d", path, os.Getpid(), time.Now().UnixNano())
			if os.Rename(path, tmp) == nil {
				os.Remove(tmp)
			}
			continue
		}
		if err := sleepCtx(ctx, lockPoll); err != nil {
			return nil, fmt.Errorf("model: waiting for lock %s: %w", path, err)
		}
	}
}

// heartbeat keeps the lock file at path fresh until the returned unlock is
// called, which also removes it.
func heartbeat(path string, every time.Duration) (unlock func()) {
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case now := <-t.C:
				// A failed refresh only risks another process breaking the
				// lock later; the download itself is unaffected.
				_ = os.Chtimes(path, now, now)
			}
		}
	}()
	return func() {
		close(stop)
		<-done
		os.Remove(path)
	}
}
