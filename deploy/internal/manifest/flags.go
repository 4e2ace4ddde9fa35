package manifest

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Flag is one flag of a service binary, as its --help lists it.
type Flag struct {
	Name    string // without dashes: "grpc-addr"
	Type    string // "string", "int", "duration", "value", ...; "bool" for flags without a value
	Default string // "" when the help shows none
	Env     string // the overriding environment variable: "BATON_GRPC_ADDR"
}

// FlagSet is a binary's flags by name.
type FlagSet map[string]Flag

// ByEnv returns the flag that the environment variable sets.
func (fs FlagSet) ByEnv(env string) (Flag, bool) {
	for _, f := range fs {
		if f.Env == env {
			return f, true
		}
	}
	return Flag{}, false
}

// EnvName is the variable that overrides a flag, by svckit's rule:
// --grpc-addr is BATON_GRPC_ADDR.
func EnvName(flag string) string {
	return "BATON_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

var (
	// flag.PrintDefaults writes "  -name type" (no type for booleans) and
	// then the usage on lines starting with four spaces and a tab.
	flagLine  = regexp.MustCompile(`^  -([A-Za-z0-9][A-Za-z0-9_.-]*)(?: (\S+))?$`)
	envRef    = regexp.MustCompile(`\[\$([A-Z0-9_]+)\]`)
	defQuoted = regexp.MustCompile(`\(default "((?:[^"\\]|\\.)*)"\)\s*$`)
	defPlain  = regexp.MustCompile(`\(default ([^)]*)\)\s*$`)
)

// ParseHelp reads the flags from a service's --help text. Every flag must
// name its environment variable, and that variable must be EnvName's, so a
// change to either convention fails here rather than passing unnoticed.
func ParseHelp(help string) (FlagSet, error) {
	fs := FlagSet{}
	var cur *Flag
	var usage strings.Builder
	finish := func() error {
		if cur == nil {
			return nil
		}
		u := usage.String()
		if m := envRef.FindStringSubmatch(u); m != nil {
			cur.Env = m[1]
		}
		if cur.Env != EnvName(cur.Name) {
			return fmt.Errorf("flag -%s: help names variable %q, want %q", cur.Name, cur.Env, EnvName(cur.Name))
		}
		if m := defQuoted.FindStringSubmatch(u); m != nil {
			s, err := strconv.Unquote(`"` + m[1] + `"`)
			if err != nil {
				return fmt.Errorf("flag -%s: default %q: %w", cur.Name, m[1], err)
			}
			cur.Default = s
		} else if m := defPlain.FindStringSubmatch(u); m != nil {
			cur.Default = m[1]
		}
		fs[cur.Name] = *cur
		cur = nil
		usage.Reset()
		return nil
	}
	for _, line := range strings.Split(help, "\n") {
		if m := flagLine.FindStringSubmatch(line); m != nil {
			if err := finish(); err != nil {
				return nil, err
			}
			typ := m[2]
			if typ == "" {
				typ = "bool"
			}
			cur = &Flag{Name: m[1], Type: typ}
			continue
		}
		if cur != nil && strings.HasPrefix(line, "    ") {
			usage.WriteString(strings.TrimSpace(line))
			usage.WriteByte(' ')
			continue
		}
		if err := finish(); err != nil {
			return nil, err
		}
	}
	if err := finish(); err != nil {
		return nil, err
	}
	if len(fs) == 0 {
		return nil, fmt.Errorf("no flags found in the help text")
	}
	return fs, nil
}
