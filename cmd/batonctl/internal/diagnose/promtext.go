package diagnose

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// parseMetrics reads Prometheus text exposition and returns each sample
// name's value summed over its label sets. Diagnose needs a handful of
// label-less gauges and counters, so summing loses nothing it uses, and a
// small reader keeps batonctl free of the Prometheus libraries.
func parseMetrics(r io.Reader) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" || text[0] == '#' {
			continue
		}
		name, v, err := parseSample(text)
		if err != nil {
			return nil, fmt.Errorf("metrics line %d: %w", line, err)
		}
		if !math.IsNaN(v) {
			out[name] += v
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading metrics: %w", err)
	}
	return out, nil
}

// parseSample splits `name{labels} value [timestamp]`.
func parseSample(s string) (string, float64, error) {
	end := strings.IndexAny(s, "{ \t")
	if end <= 0 {
		return "", 0, fmt.Errorf("no value in %q", s)
	}
	name, rest := s[:end], s[end:]
	if rest[0] == '{' {
		n, err := labelsEnd(rest)
		if err != nil {
			return "", 0, fmt.Errorf("%s: %w", name, err)
		}
		rest = rest[n:]
	}
	fields := strings.Fields(rest)
	if len(fields) < 1 || len(fields) > 2 {
		return "", 0, fmt.Errorf("%s: want a value and at most a timestamp, got %q", name, rest)
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return "", 0, fmt.Errorf("%s: value %q: %w", name, fields[0], err)
	}
	return name, v, nil
}

// labelsEnd returns the length of the label set at the start of s ("{...}"),
// honouring quoted values with escapes.
func labelsEnd(s string) (int, error) {
	quoted := false
	for i := 1; i < len(s); i++ {
		switch c := s[i]; {
		case quoted && c == '\\':
			i++
		case c == '"':
			quoted = !quoted
		case !quoted && c == '}':
			return i + 1, nil
		}
	}
	return 0, fmt.Errorf("unterminated label set")
}
