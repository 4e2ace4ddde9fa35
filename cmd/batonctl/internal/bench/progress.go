package bench

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// progressBar redraws one line on a terminal as requests end. A nil bar,
// or one without a writer, draws nothing.
type progressBar struct {
	w     io.Writer
	label string
	total int
	start time.Time

	mu           sync.Mutex
	last         time.Time
	done, failed int
}

func newProgressBar(w io.Writer, label string, total int) *progressBar {
	return &progressBar{w: w, label: label, total: total, start: time.Now()}
}

// redrawEvery limits redraws so that a fast run does not flood the
// terminal.
const redrawEvery = 100 * time.Millisecond

// update records the counts (load.Config.Progress).
func (p *progressBar) update(done, failed int) {
	if p == nil || p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done, p.failed = done, failed
	if now := time.Now(); done == p.total || now.Sub(p.last) >= redrawEvery {
		p.last = now
		p.draw()
	}
}

func (p *progressBar) draw() {
	const width = 30
	filled := 0
	if p.total > 0 {
		filled = width * p.done / p.total
	}
	line := fmt.Sprintf("%s [%s%s] %d/%d", p.label, strings.Repeat("#", filled), strings.Repeat("-", width-filled), p.done, p.total)
	if p.failed > 0 {
		line += fmt.Sprintf(" (%d failed)", p.failed)
	}
	line += fmt.Sprintf(" %.1fs", time.Since(p.start).Seconds())
	// \r returns to the line's start; \x1b[K clears what a longer line
	// left behind.
	fmt.Fprintf(p.w, "\r%s\x1b[K", line)
}

// finish ends the bar's line.
func (p *progressBar) finish() {
	if p == nil || p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.draw()
	fmt.Fprintln(p.w)
}
