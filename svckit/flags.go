package svckit

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

// EnvPrefix is the prefix of the environment variables that override flags:
// --grpc-addr is BATON_GRPC_ADDR.
const EnvPrefix = "BATON_"

// EnvName returns the environment variable that overrides the named flag.
func EnvName(flagName string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// ParseFlags parses args into fs, then fills every flag not given on the
// command line from its environment variable (EnvName), if set. Flags given on
// the command line win over the environment. The usage text shows each
// flag's variable. An unparsable value names the flag or variable.
func ParseFlags(fs *flag.FlagSet, args []string, lookupEnv func(string) (string, bool)) error {
	if lookupEnv == nil {
		lookupEnv = os.LookupEnv
	}
	fs.VisitAll(func(f *flag.Flag) {
		if f.Name != "help" && !strings.Contains(f.Usage, "$"+EnvName(f.Name)) {
			f.Usage += " [$" + EnvName(f.Name) + "]"
		}
	})
	if err := ParseArgs(fs, args); err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] {
			return
		}
		name := EnvName(f.Name)
		v, ok := lookupEnv(name)
		if !ok {
			return
		}
		if err := fs.Set(f.Name, v); err != nil {
			errs = append(errs, fmt.Errorf("environment variable %s=%q: %w", name, v, err))
		}
	})
	return errors.Join(errs...)
}

// ParseArgs parses the command line args into fs quietly: -h, -help or
// --help (before any "--") prints the usage and returns flag.ErrHelp, but a
// bad flag returns an error without the usage, so that the caller can
// report it as one line. Positional arguments are refused. Unlike
// ParseFlags it does not consult the environment.
func ParseArgs(fs *flag.FlagSet, args []string) error {
	for _, a := range args {
		if a == "--" {
			break
		}
		if a == "-h" || a == "--help" || a == "-help" {
			fs.Usage()
			return flag.ErrHelp
		}
	}
	usage, out := fs.Usage, fs.Output()
	fs.Usage = func() {}
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	fs.Usage = usage
	fs.SetOutput(out)
	if err != nil {
		return fmt.Errorf("%w (see --help)", err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (flags start with --)", fs.Arg(0))
	}
	return nil
}

// NewFlagSet returns a flag set that reports errors instead of exiting, with a
// usage message that lists every flag with its default and variable.
func NewFlagSet(name, summary string, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprintf(out, "%s — %s\n\nUsage: %s [flags]\n\nFlags (each can also be set by the environment variable shown):\n", name, summary, name)
		fs.PrintDefaults()
	}
	return fs
}

// UsageError marks a start-up error as the fault of a flag's value (a
// device that is not there, a KV budget larger than the GPU): Main
// reports it as one line and exits 2, as for a flag that does not parse.
// Its message is the wrapped error's.
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

// Usage wraps err, which names the flag, as a UsageError; nil stays nil.
func Usage(err error) error {
	if err == nil {
		return nil
	}
	return &UsageError{Err: err}
}
