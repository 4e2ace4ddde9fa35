// Package dockerfile parses the subset of the Dockerfile syntax that Baton's
// Dockerfile uses — instructions, line continuations, comments, stages — so
// that tests can check what the images will contain without a Docker daemon.
package dockerfile

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// Instruction is one instruction, its continuation lines joined.
type Instruction struct {
	Line int    // where it starts, 1-based
	Cmd  string // upper-cased: FROM, RUN, COPY, ...
	Args string // the rest, continuations joined with single spaces
}

// Stage is a FROM and the instructions up to the next FROM.
type Stage struct {
	Name         string // the AS name; "" when none
	Base         string // the image it starts from
	Platform     string // --platform, if given
	Instructions []Instruction
}

// File is a parsed Dockerfile.
type File struct {
	Args   []Instruction // ARGs before the first FROM
	Stages []Stage
}

// Stage returns the stage with the given AS name.
func (f *File) Stage(name string) (*Stage, bool) {
	for i := range f.Stages {
		if strings.EqualFold(f.Stages[i].Name, name) {
			return &f.Stages[i], true
		}
	}
	return nil, false
}

// Parse reads a Dockerfile. It understands comments (including parser
// directives, which it ignores), backslash continuations, and FROM's
// --platform and AS; the arguments of other instructions are kept as text.
func Parse(r io.Reader) (*File, error) {
	var f File
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	var cur *Instruction
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "#") || (line == "" && cur == nil) {
			continue
		}
		cont := strings.HasSuffix(line, "\\")
		line = strings.TrimSpace(strings.TrimSuffix(line, "\\"))
		if cur == nil {
			cmd, rest, _ := strings.Cut(line, " ")
			cur = &Instruction{Line: n, Cmd: strings.ToUpper(cmd), Args: strings.TrimSpace(rest)}
		} else if line != "" {
			cur.Args = strings.TrimSpace(cur.Args + " " + line)
		}
		if cont {
			continue
		}
		if err := f.add(*cur); err != nil {
			return nil, err
		}
		cur = nil
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if cur != nil {
		return nil, fmt.Errorf("line %d: %s continues past the end of the file", cur.Line, cur.Cmd)
	}
	if len(f.Stages) == 0 {
		return nil, fmt.Errorf("no FROM instruction")
	}
	return &f, nil
}

func (f *File) add(in Instruction) error {
	if in.Cmd != "FROM" {
		if len(f.Stages) == 0 {
			if in.Cmd != "ARG" {
				return fmt.Errorf("line %d: %s before the first FROM", in.Line, in.Cmd)
			}
			f.Args = append(f.Args, in)
			return nil
		}
		s := &f.Stages[len(f.Stages)-1]
		s.Instructions = append(s.Instructions, in)
		return nil
	}
	var st Stage
	fields := strings.Fields(in.Args)
	for len(fields) > 0 && strings.HasPrefix(fields[0], "--") {
		if p, ok := strings.CutPrefix(fields[0], "--platform="); ok {
			st.Platform = p
		}
		fields = fields[1:]
	}
	switch {
	case len(fields) == 1:
	case len(fields) == 3 && strings.EqualFold(fields[1], "AS"):
		st.Name = fields[2]
	default:
		return fmt.Errorf("line %d: FROM %s: want IMAGE [AS NAME]", in.Line, in.Args)
	}
	st.Base = fields[0]
	f.Stages = append(f.Stages, st)
	return nil
}

// Find returns the stage's instructions of one kind.
func (s *Stage) Find(cmd string) []Instruction {
	var out []Instruction
	for _, in := range s.Instructions {
		if in.Cmd == cmd {
			out = append(out, in)
		}
	}
	return out
}

// Env returns the variables the stage's ENV instructions set (KEY=VALUE
// pairs separated by spaces; values without spaces or quotes).
func (s *Stage) Env() (map[string]string, error) {
	env := map[string]string{}
	for _, in := range s.Find("ENV") {
		for _, kv := range strings.Fields(in.Args) {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return nil, fmt.Errorf("line %d: ENV %q: want KEY=VALUE pairs", in.Line, kv)
			}
			env[k] = v
		}
	}
	return env, nil
}

// ExecForm decodes an instruction written in exec (JSON array) form, as
// ENTRYPOINT ["/bin/x", "-f"]; shell form is an error, since it needs a
// shell in the image.
func ExecForm(in Instruction) ([]string, error) {
	var argv []string
	if err := json.Unmarshal([]byte(in.Args), &argv); err != nil || len(argv) == 0 {
		return nil, fmt.Errorf("line %d: %s %s: not exec form (a JSON array); shell form needs /bin/sh", in.Line, in.Cmd, in.Args)
	}
	return argv, nil
}
