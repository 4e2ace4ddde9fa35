//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package gguf

import (
	"fmt"
	"math"
	"os"
	"syscall"
)

// Open maps the file at path read-only and parses it. Tensor data stays in
// the page cache, shared with other processes, and is paged in on first
// touch; Close unmaps it. If the file is truncated by someone else while
// mapped, touching the lost pages faults (SIGBUS), as with any mmap.
func Open(path string) (*File, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("gguf: %w", err)
	}
	// The mapping does not need the descriptor once made.
	defer fh.Close()
	st, err := fh.Stat()
	if err != nil {
		return nil, fmt.Errorf("gguf: %w", err)
	}
	size := st.Size()
	if size == 0 {
		// mmap rejects empty mappings; Parse reports the empty file.
		_, err := Parse(nil)
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if size < 0 || uint64(size) > math.MaxInt {
		return nil, fmt.Errorf("gguf: %s: file of %d bytes cannot be mapped", path, size)
	}
	data, err := syscall.Mmap(int(fh.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("gguf: mmap %s: %w", path, err)
	}
	f, err := Parse(data)
	if err != nil {
		_ = syscall.Munmap(data)
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	f.release = func() error {
		if err := syscall.Munmap(data); err != nil {
			return fmt.Errorf("gguf: munmap %s: %w", path, err)
		}
		return nil
	}
	return f, nil
}
