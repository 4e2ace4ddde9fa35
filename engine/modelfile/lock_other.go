//go:build !(linux || darwin || dragonfly || freebsd || netbsd || openbsd || illumos)

package modelfile

import (
	"context"
	"time"
)

// lockFile falls back to an O_EXCL lock file where flock is unavailable. A
// holder refreshes it every 15 s, so one untouched for a minute is stale.
func lockFile(ctx context.Context, path string) (unlock func(), err error) {
	return lockExcl(ctx, path, time.Minute)
}
