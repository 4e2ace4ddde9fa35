//go:build linux || darwin || freebsd || netbsd || openbsd

package modelfile

import (
	"context"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// A FIFO must be refused without opening it, which would block.
func TestResolveLocalFIFO(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "fifo.gguf")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Resolve(context.Background(), fifo, Options{})
	if err == nil || !strings.Contains(err.Error(), fifo) || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("error = %v, want %s named as not a regular file", err, fifo)
	}
}
