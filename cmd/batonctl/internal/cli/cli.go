// Package cli dispatches batonctl's sub-commands. Each sub-command lives in its
// own package under cmd/batonctl/internal and is registered in the commands
// table below.
package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"syscall"

	"github.com/baton-serving/baton/cmd/batonctl/internal/bench"
	"github.com/baton-serving/baton/cmd/batonctl/internal/benchengine"
	"github.com/baton-serving/baton/cmd/batonctl/internal/certs"
	"github.com/baton-serving/baton/cmd/batonctl/internal/diagnose"
	"github.com/baton-serving/baton/cmd/batonctl/internal/generate"
	"github.com/baton-serving/baton/cmd/batonctl/internal/runcmd"
	"github.com/baton-serving/baton/cmd/batonctl/internal/up"
)

// Command is one batonctl sub-command. Run gets the process's output
// streams and the arguments after the command's name, and returns the exit
// code.
type Command struct {
	Summary string
	Run     func(ctx context.Context, stdout, stderr io.Writer, args []string) int
}

// commandTable lists the sub-commands. Add one line per command; the command's
// code lives in its own package.
func commandTable() map[string]Command {
	return map[string]Command{
		"run":          {runcmd.RunSummary, runcmd.Run},
		"tokenize":     {runcmd.TokenizeSummary, runcmd.Tokenize},
		"gen-model":    {runcmd.GenModelSummary, runcmd.GenModel},
		"generate":     {generate.Summary, generate.Run},
		"bench":        {bench.Summary, bench.Run},
		"bench-engine": {benchengine.Summary, benchengine.Run},
		"diagnose":     {diagnose.Summary, diagnose.Run},
		"certs":        {certs.Summary, certs.Run},
		"up":           {"start router, prefill and decode on loopback and stop them on Ctrl-C", up.Run},
	}
}

// Main runs batonctl with args (without the program name) and returns the exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	commands := commandTable()
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr, commands)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "batonctl: unknown command %q (run 'batonctl help' for the list)\n", args[0])
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return c.Run(ctx, stdout, stderr, args[1:])
}

func usage(w io.Writer, commands map[string]Command) {
	fmt.Fprintln(w, "batonctl — Baton's operator tool")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Usage: batonctl COMMAND [flags]")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Commands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-12s %s\n", n, commands[n].Summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Run 'batonctl COMMAND --help' for a command's flags.")
}
