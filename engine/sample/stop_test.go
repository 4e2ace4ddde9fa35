package sample

import (
	"errors"
	"testing"

	"github.com/baton-serving/baton/engine"
)

type piece struct {
	id   int32
	text string
}

func pieces(texts ...string) []piece {
	p := make([]piece, len(texts))
	for i, s := range texts {
		p[i] = piece{int32(100 + i), s}
	}
	return p
}

func TestStopper(t *testing.T) {
	tests := []struct {
		name     string
		stops    []string
		ids      []int32
		in       []piece
		emits    []string // per Push
		stopAt   int      // index of the Push that stops, -1 = none
		flushed  string   // Flush after the last Push (when not stopped)
		complete string   // everything emitted
	}{
		{
			name: "no stops", in: pieces("Hel", "lo"),
			emits: []string{"Hel", "lo"}, stopAt: -1, complete: "Hello",
		},
		{
			name: "stop inside one token", stops: []string{"END"}, in: pieces("abENDcd", "x"),
			emits: []string{"ab"}, stopAt: 0, complete: "ab",
		},
		{
			name: "stop split across tokens", stops: []string{"END"}, in: pieces("ab", "cE", "N", "Dzz"),
			emits: []string{"ab", "c", "", ""}, stopAt: 3, complete: "abc",
		},
		{
			name: "false start released", stops: []string{"END"}, in: pieces("xE", "Nx", "y"),
			emits: []string{"x", "ENx", "y"}, stopAt: -1, complete: "xENxy",
		},
		{
			name: "held text flushed at the end", stops: []string{"END"}, in: pieces("abE", "N"),
			emits: []string{"ab", ""}, stopAt: -1, flushed: "EN", complete: "abEN",
		},
		{
			// "aab" contains the stop "ab" at index 1: the held "a" must be
			// resolved as text, the second "a" as the stop's start.
			name: "overlapping prefix", stops: []string{"ab"}, in: pieces("a", "a", "b"),
			emits: []string{"", "a", ""}, stopAt: 2, complete: "a",
		},
		{
			name: "self-overlapping stop", stops: []string{"aab"}, in: pieces("aa", "a", "b"),
			emits: []string{"", "a", ""}, stopAt: 2, complete: "a",
		},
		{
			name: "earliest of several stops", stops: []string{"xyz", "yz", "\n\n"}, in: pieces("ab", "xy", "z"),
			emits: []string{"ab", "", ""}, stopAt: 2, complete: "ab",
		},
		{
			name: "longer prefix of another stop held", stops: []string{"Q:", "User:"}, in: pieces("hi Us", "e", "r", ":"),
			emits: []string{"hi ", "", "", ""}, stopAt: 3, complete: "hi ",
		},
		{
			name: "stop at the very start", stops: []string{"Hi"}, in: pieces("Hi there"),
			emits: []string{""}, stopAt: 0, complete: "",
		},
		{
			name: "stop token releases held text", stops: []string{"END"}, ids: []int32{102}, in: pieces("a", "EN", "tok", "D"),
			emits: []string{"a", "", "EN"}, stopAt: 2, complete: "aEN",
		},
		{
			name: "multibyte stop", stops: []string{"東京"}, in: pieces("go 東", "京 now"),
			emits: []string{"go ", ""}, stopAt: 1, complete: "go ",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := NewStopper(tc.stops, tc.ids)
			if err != nil {
				t.Fatal(err)
			}
			var all string
			stoppedAt := -1
			for i, p := range tc.in {
				emit, stop := s.Push(p.id, p.text)
				if i < len(tc.emits) && emit != tc.emits[i] {
					t.Errorf("Push #%d (%q) emitted %q, want %q", i, p.text, emit, tc.emits[i])
				}
				all += emit
				if stop {
					stoppedAt = i
					break
				}
			}
			if stoppedAt != tc.stopAt {
				t.Errorf("stopped at push %d, want %d", stoppedAt, tc.stopAt)
			}
			if stoppedAt < 0 {
				f := s.Flush()
				if f != tc.flushed {
					t.Errorf("Flush = %q, want %q", f, tc.flushed)
				}
				all += f
			} else if !s.Stopped() {
				t.Error("Stopped() = false after a stop")
			}
			if all != tc.complete {
				t.Errorf("emitted %q, want %q", all, tc.complete)
			}
			if stoppedAt >= 0 {
				if e, stop := s.Push(1, "more"); e != "" || !stop {
					t.Errorf("Push after stop = %q, %v", e, stop)
				}
			}
		})
	}
}

func TestStopperEmpty(t *testing.T) {
	if _, err := NewStopper([]string{"ok", ""}, nil); !errors.Is(err, engine.ErrInvalidInput) {
		t.Errorf("empty stop string: err = %v, want ErrInvalidInput", err)
	}
}

// FuzzStopper checks the invariants on arbitrary splits: the emitted text is
// the input up to the first stop occurrence, and never contains a stop.
func FuzzStopper(f *testing.F) {
	f.Add("hello END world", "END", uint8(3))
	f.Add("aaab", "aab", uint8(1))
	f.Fuzz(func(t *testing.T, text, stop string, chunk uint8) {
		if stop == "" {
			return
		}
		n := int(chunk%7) + 1
		s, err := NewStopper([]string{stop}, nil)
		if err != nil {
			t.Fatal(err)
		}
		var out string
		stopped := false
		for i := 0; i < len(text) && !stopped; i += n {
			e, st := s.Push(0, text[i:min(i+n, len(text))])
			out += e
			stopped = st
		}
		if !stopped {
			out += s.Flush()
		}
		want := text
		if i := indexOf(text, stop); i >= 0 {
			want = text[:i]
		}
		if out != want {
			t.Fatalf("text %q stop %q chunk %d: emitted %q, want %q", text, stop, n, out, want)
		}
	})
}

func indexOf(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}
