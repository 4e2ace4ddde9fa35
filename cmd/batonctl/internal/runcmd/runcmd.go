// Package runcmd implements the batonctl sub-commands that work on a model
// file in-process, without any service: `run` (generate text), `tokenize`
// (show a text's token ids) and `gen-model` (write a random-weight Llama GGUF
// of a chosen shape for tests and benchmarks).
//
// Each command takes its arguments and output streams and returns the
// process exit code: 0 on success, 1 when the work fails, 2 for bad flags,
// 130 when interrupted. Errors are one line on stderr.
package runcmd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/baton-serving/baton/engine/gguf"
	"github.com/baton-serving/baton/engine/modelfile"
)

// Exit codes.
const (
	exitOK          = 0
	exitFailed      = 1
	exitUsage       = 2
	exitInterrupted = 130 // 128 + SIGINT, as shells report it
)

// flagErr reports a parse error and returns the exit code for it.
func flagErr(stderr io.Writer, cmd string, err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	fmt.Fprintf(stderr, "batonctl %s: %v\n", cmd, err)
	return exitUsage
}

// modelFlagHelp documents --model the same way for every command.
const modelFlagHelp = "GGUF model: a path or hf://OWNER/REPO/FILE.gguf (default: $BATON_MODEL, else " + modelfile.DefaultHelp + ")"

// openModel resolves ref (flag value, $BATON_MODEL or the shared default),
// downloading an hf:// reference with progress on stderr, and opens it.
func openModel(ctx context.Context, flagValue string, stderr io.Writer) (*gguf.File, error) {
	ref := modelfile.FromEnv(flagValue)
	if ref == "" {
		return nil, fmt.Errorf("no model: pass --model PATH or set %s", modelfile.EnvModel)
	}
	var opts modelfile.Options
	if strings.HasPrefix(ref, modelfile.HFScheme) && modelfile.IsTerminal(stderr) {
		opts.Progress = modelfile.TerminalProgress(stderr)
	}
	path, err := modelfile.Resolve(ctx, ref, opts)
	if err != nil {
		return nil, err
	}
	return gguf.Open(path)
}

// oneLine flattens an error message onto one line.
func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}
