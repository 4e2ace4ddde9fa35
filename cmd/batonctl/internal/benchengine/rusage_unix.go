//go:build unix

package benchengine

import (
	"runtime"
	"syscall"
)

// maxRSS returns the process's peak resident set size in bytes
// (getrusage's ru_maxrss), or 0 if it cannot be read.
func maxRSS() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	rss := int64(ru.Maxrss)
	if runtime.GOOS != "darwin" && runtime.GOOS != "ios" {
		rss *= 1024 // kilobytes everywhere but Apple's systems
	}
	return rss
}
