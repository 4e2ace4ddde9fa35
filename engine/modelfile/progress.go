package modelfile

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// progressInterval bounds how often Options.Progress is called.
const progressInterval = 100 * time.Millisecond

// throttle forwards progress reports at most once per interval, plus the
// first and the last.
type throttle struct {
	fn       func(done, total int64)
	interval time.Duration
	last     time.Time
}

func (t *throttle) report(done, total int64) {
	if t.fn == nil {
		return
	}
	now := time.Now()
	if !t.last.IsZero() && now.Sub(t.last) < t.interval {
		return
	}
	t.last = now
	t.fn(done, total)
}

// finish reports the final state unconditionally.
func (t *throttle) finish(done, total int64) {
	if t.fn == nil {
		return
	}
	t.last = time.Now()
	t.fn(done, total)
}

// IsTerminal reports whether w is a character device (a terminal), where a
// redrawn progress line makes sense.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// TerminalProgress returns a progress function for Options.Progress that
// redraws one line on w with a bar, the percentage, the bytes so far and the
// rate, using carriage returns. It is meant for terminals only; the caller
// decides whether w is one (IsTerminal). A total below zero means the size
// is unknown.
// The line is ended with a newline once done reaches a known total.
func TerminalProgress(w io.Writer) func(done, total int64) {
	var (
		mu        sync.Mutex
		start     time.Time
		startDone int64
		lastLen   int
		finished  bool
	)
	return func(done, total int64) {
		mu.Lock()
		defer mu.Unlock()
		now := time.Now()
		if start.IsZero() || done < startDone {
			// The rate counts only bytes moved since the first report, so a
			// resumed download does not look instantly fast.
			start, startDone, finished = now, done, false
		}
		if finished {
			return
		}
		var rate float64
		if el := now.Sub(start).Seconds(); el > 0 {
			rate = float64(done-startDone) / el
		}
		line := progressLine(done, total, rate)
		pad := ""
		if n := lastLen - len(line); n > 0 {
			pad = strings.Repeat(" ", n)
		}
		lastLen = len(line)
		end := ""
		if total >= 0 && done >= total {
			end, finished = "\n", true
		}
		// Write errors are ignored: progress output is decoration and must
		// not fail the download.
		_, _ = io.WriteString(w, "\r"+line+pad+end)
	}
}

const barWidth = 30

// progressLine formats one progress line without the leading \r.
func progressLine(done, total int64, rate float64) string {
	var b strings.Builder
	if total > 0 {
		frac := float64(done) / float64(total)
		frac = min(max(frac, 0), 1)
		fill := int(frac * barWidth)
		b.WriteByte('[')
		b.WriteString(strings.Repeat("=", fill))
		if fill < barWidth {
			b.WriteByte('>')
			b.WriteString(strings.Repeat(" ", barWidth-fill-1))
		}
		fmt.Fprintf(&b, "] %5.1f%%  %s / %s", frac*100, formatBytes(done), formatBytes(total))
	} else {
		b.WriteString(formatBytes(done))
		if total == 0 {
			b.WriteString(" / 0 B")
		}
	}
	if rate > 0 {
		fmt.Fprintf(&b, "  %s/s", formatBytes(int64(rate)))
		if total > done {
			eta := time.Duration(float64(total-done) / rate * float64(time.Second))
			fmt.Fprintf(&b, "  ETA %s", eta.Round(time.Second))
		}
	}
	return b.String()
}

// formatBytes renders n with binary (IEC) units.
func formatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v, i := float64(n)/unit, 0
	for v >= unit && i < 4 {
		v /= unit
		i++
	}
	return fmt.Sprintf("%.1f %ciB", v, "KMGTP"[i])
}
