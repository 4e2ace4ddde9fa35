//go:build linux || darwin || dragonfly || freebsd || netbsd || openbsd || illumos

package modelfile

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
)

// lockFile takes an exclusive flock on path, creating it if needed, and
// waits until it is free or ctx is done. The kernel drops the lock when the
// holder dies, so there are no stale locks to detect.
func lockFile(ctx context.Context, path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("model: lock %s: %w", path, err)
	}
	fd := int(f.Fd())
	for {
		err := syscall.Flock(fd, syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() {
				_ = syscall.Flock(fd, syscall.LOCK_UN)
				f.Close()
			}, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			f.Close()
			return nil, fmt.Errorf("model: lock %s: %w", path, err)
		}
		if err := sleepCtx(ctx, lockPoll); err != nil {
			f.Close()
			return nil, fmt.Errorf("model: waiting for lock %s (another process is downloading this file): %w", path, err)
		}
	}
}
