// Package logtest collects what a JSON slog logger writes, for tests that
// check what a component logged. It is for tests only.
package logtest

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
)

// Buffer is an io.Writer for slog.NewJSONHandler that goroutines may write
// to while a test reads it. The zero Buffer is ready to use.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Logger returns a JSON logger writing to b.
func (b *Buffer) Logger() *slog.Logger { return slog.New(slog.NewJSONHandler(b, nil)) }

// Write implements io.Writer.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// Records returns the logged records whose message is msg, in order.
func (b *Buffer) Records(msg string) []map[string]any {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(b.buf.String(), "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) == nil && rec[slog.MessageKey] == msg {
			out = append(out, rec)
		}
	}
	return out
}

// Count is the number of records whose message is msg.
func (b *Buffer) Count(msg string) int { return len(b.Records(msg)) }

// String returns everything logged so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
