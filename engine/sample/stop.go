package sample

import (
	"fmt"
	"slices"
	"strings"

	"github.com/baton-serving/baton/engine"
)

// Stopper watches a sequence's streamed text for stop strings and its tokens
// for stop ids. Text that might be the beginning of a stop string is held back
// until the following tokens show whether it is, so a stop string split across
// tokens is caught and none of it (nor anything after it) is ever emitted.
// A Stopper serves one sequence and is not safe for concurrent use.
type Stopper struct {
	stops   []string
	ids     []int32
	held    string
	stopped bool
}

// NewStopper returns a Stopper for the given stop strings and stop token ids.
// An empty stop string is an error wrapping engine.ErrInvalidInput.
func NewStopper(stops []string, ids []int32) (*Stopper, error) {
	for i, s := range stops {
		if s == "" {
			return nil, fmt.Errorf("sample: stop[%d] is empty: %w", i, engine.ErrInvalidInput)
		}
	}
	return &Stopper{stops: slices.Clone(stops), ids: slices.Clone(ids)}, nil
}

// Push takes the next token and the text it decoded to, and returns the text
// that is now safe to emit and whether generation must stop. On a stop token
// the held-back text is released and the token's own text dropped; on a stop
// string the text before it is released and the rest dropped. After a stop,
// Push returns ("", true).
func (s *Stopper) Push(id int32, text string) (emit string, stop bool) {
	if s.stopped {
		return "", true
	}
	if slices.Contains(s.ids, id) {
		s.stopped = true
		emit, s.held = s.held, ""
		return emit, true
	}
	buf := s.held + text
	if i := s.firstStop(buf); i >= 0 {
		s.stopped = true
		s.held = ""
		return buf[:i], true
	}
	k := s.partialSuffix(buf)
	s.held = buf[len(buf)-k:]
	return buf[:len(buf)-k], false
}

// Flush releases the held-back text at the end of a generation that ended for
// another reason (length limit, end-of-generation token).
func (s *Stopper) Flush() string {
	h := s.held
	s.held = ""
	return h
}

// Stopped reports whether a stop token or string has been seen.
func (s *Stopper) Stopped() bool { return s.stopped }

// firstStop returns the index of the earliest occurrence of any stop string
// in buf, or -1.
func (s *Stopper) firstStop(buf string) int {
	first := -1
	for _, st := range s.stops {
		if i := strings.Index(buf, st); i >= 0 && (first < 0 || i < first) {
			first = i
		}
	}
	return first
}

// partialSuffix returns the length of the longest suffix of buf that is a
// proper prefix of some stop string. Everything before that suffix can be
// emitted: a stop string starting earlier would either lie inside buf (and
// firstStop would have found it) or make a longer such suffix.
func (s *Stopper) partialSuffix(buf string) int {
	best := 0
	for _, st := range s.stops {
		for k := min(len(st)-1, len(buf)); k > best; k-- {
			if strings.HasSuffix(buf, st[:k]) {
				best = k
				break
			}
		}
	}
	return best
}
