package svckit

import (
	"bytes"
	"errors"
	"flag"
	"strings"
	"testing"
)

// TestParseArgs checks the quiet parse that batonctl's commands share: a
// bad flag is one error and no usage text, -h prints the usage, positional
// arguments are refused and the environment is never consulted.
func TestParseArgs(t *testing.T) {
	newFS := func(out *bytes.Buffer) (*flag.FlagSet, *int) {
		fs := NewFlagSet("cmd", "test", out)
		return fs, fs.Int("n", 1, "a number")
	}
	t.Setenv(EnvName("n"), "7")

	var out bytes.Buffer
	fs, n := newFS(&out)
	if err := ParseArgs(fs, nil); err != nil || *n != 1 {
		t.Errorf("no args: n = %d, err = %v; want the default 1 (no environment)", *n, err)
	}

	for _, tc := range []struct {
		args      []string
		err       string // substring; "" for success
		help      bool   // the usage is printed and flag.ErrHelp returned
		wantUsage bool
	}{
		{args: []string{"--n", "3"}},
		{args: []string{"--n", "x"}, err: "(see --help)"},
		{args: []string{"--nope"}, err: "flag provided but not defined: -nope"},
		{args: []string{"extra"}, err: `unexpected argument "extra"`},
		{args: []string{"--n", "2", "--help"}, help: true, wantUsage: true},
		{args: []string{"-h"}, help: true, wantUsage: true},
		{args: []string{"--", "-h"}, err: `unexpected argument "-h"`},
	} {
		var out bytes.Buffer
		fs, _ := newFS(&out)
		err := ParseArgs(fs, tc.args)
		switch {
		case tc.help:
			if !errors.Is(err, flag.ErrHelp) {
				t.Errorf("%q: err = %v, want flag.ErrHelp", tc.args, err)
			}
		case tc.err == "":
			if err != nil {
				t.Errorf("%q: %v", tc.args, err)
			}
		case err == nil || !strings.Contains(err.Error(), tc.err):
			t.Errorf("%q: err = %v, want it to contain %q", tc.args, err, tc.err)
		}
		if got := strings.Contains(out.String(), "Usage: cmd"); got != tc.wantUsage {
			t.Errorf("%q: usage printed = %v, want %v:\n%s", tc.args, got, tc.wantUsage, out.String())
		}
	}
}
