package modelfile

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestFormatBytes(t *testing.T) {
	for _, tc := range []struct {
		n    int64
		want string
	}{
		{0, "0 B"}, {1023, "1023 B"}, {1024, "1.0 KiB"}, {1536, "1.5 KiB"},
		{5 << 20, "5.0 MiB"}, {3 << 30, "3.0 GiB"}, {2 << 40, "2.0 TiB"}, {1 << 62, "4096.0 PiB"},
	} {
		if got := formatBytes(tc.n); got != tc.want {
			t.Errorf("formatBytes(%d) = %q, want %q", tc.n, got, tc.want)
		}
	}
}

func TestProgressLine(t *testing.T) {
	for _, tc := range []struct {
		done, total int64
		rate        float64
		want        string
	}{
		{0, 100 << 20, 0, "[>                             ]   0.0%  0 B / 100.0 MiB"},
		{50 << 20, 100 << 20, 10 << 20, "[===============>              ]  50.0%  50.0 MiB / 100.0 MiB  10.0 MiB/s  ETA 5s"},
		{100 << 20, 100 << 20, 10 << 20, "[==============================] 100.0%  100.0 MiB / 100.0 MiB  10.0 MiB/s"},
		{3 << 10, -1, 1 << 10, "3.0 KiB  1.0 KiB/s"},
		{0, 0, 0, "0 B / 0 B"},
	} {
		if got := progressLine(tc.done, tc.total, tc.rate); got != tc.want {
			t.Errorf("progressLine(%d, %d, %g) =\n%q, want\n%q", tc.done, tc.total, tc.rate, got, tc.want)
		}
	}
}

func TestTerminalProgress(t *testing.T) {
	var buf bytes.Buffer
	p := TerminalProgress(&buf)
	p(0, 2048)
	time.Sleep(10 * time.Millisecond)
	p(1024, 2048)
	p(2048, 2048)
	p(2048, 2048) // a repeated final report draws nothing
	out := buf.String()
	lines := strings.Split(out, "\r")
	if len(lines) != 4 || lines[0] != "" {
		t.Fatalf("output %q: want three \\r-started redraws", out)
	}
	if !strings.Contains(lines[1], "0.0%") || !strings.Contains(lines[2], " 50.0%  1.0 KiB / 2.0 KiB") || !strings.Contains(lines[2], "/s") {
		t.Errorf("output %q lacks percentage, bytes or rate", out)
	}
	if !strings.HasSuffix(out, "\n") || strings.Count(out, "\n") != 1 {
		t.Errorf("output %q: want exactly one newline, at the end", out)
	}

	// A shorter line overwrites the rest of a longer one with spaces.
	buf.Reset()
	p = TerminalProgress(&buf)
	p(5<<30, -1)
	p(1, -1)
	parts := strings.Split(buf.String(), "\r")
	if len(parts) != 3 || len(parts[2]) < len(parts[1]) {
		t.Errorf("redraw %q does not cover the previous line %q", parts[2], parts[1])
	}
}

func TestThrottle(t *testing.T) {
	var calls []int64
	th := throttle{fn: func(done, total int64) { calls = append(calls, done) }, interval: time.Hour}
	for i := range int64(100) {
		th.report(i, 100)
	}
	th.finish(100, 100)
	if len(calls) != 2 || calls[0] != 0 || calls[1] != 100 {
		t.Errorf("calls = %v, want the first report and the final one", calls)
	}
	(&throttle{interval: time.Hour}).report(1, 1) // no function: no panic
}
