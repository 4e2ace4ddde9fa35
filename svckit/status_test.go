package svckit

import (
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/gguf"
	"github.com/baton-serving/baton/engine/grammar"
	"github.com/baton-serving/baton/engine/model"
	"github.com/baton-serving/baton/engine/modelfile"
	"github.com/baton-serving/baton/engine/sample"
	"github.com/baton-serving/baton/engine/sched"
	"github.com/baton-serving/baton/kvtransfer"
	"github.com/baton-serving/baton/svckit/device"
	"github.com/baton-serving/baton/svckit/tlsconf"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// sentinelRoots are the source trees (relative to svckit/) whose exported
// Err* variables can reach a handler: the engine, kvtransfer, svckit and the
// two workers.
var sentinelRoots = []string{"../engine", "../kvtransfer", ".", "../decode-svc", "../prefill-svc"}

// sentinelValues are the values of the sentinels the walk finds, by
// "dir.Name" relative to the repository root. The walk fails on one
// missing here, so a new sentinel is covered as soon as it is written.
var sentinelValues = map[string]error{
	"engine.ErrInvalidInput":            engine.ErrInvalidInput,
	"engine.ErrUnsupported":             engine.ErrUnsupported,
	"engine.ErrContextOverflow":         engine.ErrContextOverflow,
	"engine.ErrKVCacheFull":             engine.ErrKVCacheFull,
	"engine/sched.ErrClosed":            sched.ErrClosed,
	"engine/sched.ErrSlowConsumer":      sched.ErrSlowConsumer,
	"engine/sched.ErrDuplicateID":       sched.ErrDuplicateID,
	"engine/sched.ErrQueueFull":         sched.ErrQueueFull,
	"engine/sched.ErrStepHung":          sched.ErrStepHung,
	"engine/sample.ErrNoAllowedToken":   sample.ErrNoAllowedToken,
	"engine/sample.ErrDiverged":         sample.ErrDiverged,
	"engine/grammar.ErrRejected":        grammar.ErrRejected,
	"engine/model.ErrClosed":            model.ErrClosed,
	"engine/modelfile.ErrUnreachable":   modelfile.ErrUnreachable,
	"engine/modelfile.ErrStalled":       modelfile.ErrStalled,
	"engine/modelfile.ErrHashMismatch":  modelfile.ErrHashMismatch,
	"engine/modelfile.ErrInvalidRef":    modelfile.ErrInvalidRef,
	"engine/gguf.ErrBadMagic":           gguf.ErrBadMagic,
	"engine/gguf.ErrUnsupportedVersion": gguf.ErrUnsupportedVersion,
	"engine/gguf.ErrTruncated":          gguf.ErrTruncated,
	"engine/gguf.ErrBadValueType":       gguf.ErrBadValueType,
	"engine/gguf.ErrBadTensorType":      gguf.ErrBadTensorType,
	"engine/gguf.ErrBadShape":           gguf.ErrBadShape,
	"engine/gguf.ErrBadAlignment":       gguf.ErrBadAlignment,
	"engine/gguf.ErrMisaligned":         gguf.ErrMisaligned,
	"engine/gguf.ErrOutOfBounds":        gguf.ErrOutOfBounds,
	"engine/gguf.ErrOverlap":            gguf.ErrOverlap,
	"engine/gguf.ErrDuplicate":          gguf.ErrDuplicate,
	"engine/gguf.ErrInvalid":            gguf.ErrInvalid,
	"kvtransfer.ErrAborted":             kvtransfer.ErrAborted,
	"svckit/device.ErrUnavailable":      device.ErrUnavailable,
	"kvtransfer.ErrStalled":             kvtransfer.ErrStalled,
	"kvtransfer.ErrSendStalled":         kvtransfer.ErrSendStalled,
	"svckit.ErrDraining":                ErrDraining,
	"svckit.ErrBodyTimeout":             ErrBodyTimeout,
	"svckit.ErrPeerUnavailable":         ErrPeerUnavailable,
	"svckit.ErrPeerTimeout":             ErrPeerTimeout,
	"svckit.ErrMismatch":                ErrMismatch,
	"svckit.ErrCorrupt":                 ErrCorrupt,
	"svckit.ErrSuperseded":              ErrSuperseded,
	"svckit.ErrPeerNotAllowed":          ErrPeerNotAllowed,
	"svckit/tlsconf.ErrNoCertificate":   tlsconf.ErrNoCertificate,
	"svckit/tlsconf.ErrNoRole":          tlsconf.ErrNoRole,
	"svckit/tlsconf.ErrWrongRole":       tlsconf.ErrWrongRole,
}

// TestEverySentinelMapped walks the source trees for exported Err*
// variables and fails on one whose wrapped form Status maps to Internal or
// Unknown: every sentinel has its code in codeTable. Packages that import
// "testing" outside their tests are test support and skipped.
func TestEverySentinelMapped(t *testing.T) {
	found := sentinelNames(t)
	if len(found) < 20 {
		t.Fatalf("the walk found only %d sentinels (%v): is it reading the source tree?", len(found), found)
	}
	for _, name := range found {
		v, ok := sentinelValues[name]
		if !ok {
			t.Errorf("%s: a sentinel with no code; add it to codeTable (svckit/status.go) and to sentinelValues here", name)
			continue
		}
		st := status.Convert(Status(fmt.Errorf("handler: %w", v)))
		if c := st.Code(); c == codes.Internal || c == codes.Unknown {
			t.Errorf("%s maps to %v; give it its code in codeTable", name, c)
		}
		if !strings.Contains(st.Message(), v.Error()) {
			t.Errorf("%s: message %q lost the error's text", name, st.Message())
		}
	}
	for name := range sentinelValues {
		if !slices.Contains(found, name) {
			t.Errorf("sentinelValues names %s, which the walk did not find", name)
		}
	}
}

// sentinelNames returns "dir.Name" for every exported package-level Err*
// variable under sentinelRoots, dir relative to the repository root.
func sentinelNames(t *testing.T) []string {
	t.Helper()
	var out []string
	fset := token.NewFileSet()
	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	for _, root := range sentinelRoots {
		dirs := map[string]bool{}
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			if !d.IsDir() && strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") {
				dirs[filepath.Dir(path)] = true
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		for dir := range dirs {
			var names []string
			support := false
			files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
			for _, file := range files {
				if strings.HasSuffix(file, "_test.go") {
					continue
				}
				f, err := parser.ParseFile(fset, file, nil, parser.SkipObjectResolution)
				if err != nil {
					t.Fatal(err)
				}
				for _, imp := range f.Imports {
					if p, _ := strconv.Unquote(imp.Path.Value); p == "testing" {
						support = true
					}
				}
				for _, decl := range f.Decls {
					g, ok := decl.(*ast.GenDecl)
					if !ok || g.Tok != token.VAR {
						continue
					}
					for _, spec := range g.Specs {
						for _, n := range spec.(*ast.ValueSpec).Names {
							if strings.HasPrefix(n.Name, "Err") && n.IsExported() {
								names = append(names, n.Name)
							}
						}
					}
				}
			}
			if support {
				continue
			}
			abs, err := filepath.Abs(dir)
			if err != nil {
				t.Fatal(err)
			}
			rel, err := filepath.Rel(repo, abs)
			if err != nil {
				t.Fatal(err)
			}
			rel = filepath.ToSlash(rel)
			for _, n := range names {
				out = append(out, rel+"."+n)
			}
		}
	}
	slices.Sort(out)
	return out
}

// TestStatusCodes checks codes the services' behaviour depends on.
func TestStatusCodes(t *testing.T) {
	for _, c := range []struct {
		err  error
		want codes.Code
	}{
		// A draining prefill must be a failover, not a 429.
		{fmt.Errorf("submit: %w", sched.ErrClosed), codes.Unavailable},
		{fmt.Errorf("submit: %w", sched.ErrDuplicateID), codes.AlreadyExists},
		{sched.ErrQueueFull, codes.ResourceExhausted},
		{fmt.Errorf("prefill p:1: %w", ErrPeerTimeout), codes.DeadlineExceeded},
		{context.Canceled, codes.Canceled},
		// Shutdown's error wraps both ErrStepHung and the context's cause:
		// a hung step is the worker going away, not the caller's deadline.
		{fmt.Errorf("%w (running for 1s): %w", sched.ErrStepHung, context.DeadlineExceeded), codes.Unavailable},
		{fmt.Errorf("%w: %w", sched.ErrStepHung, context.Canceled), codes.Unavailable},
		// A --prefill-allow refusal: the router picked the endpoint, so
		// it is a failover, not the client's 400.
		{fmt.Errorf("prefill_endpoint %q: %w", "p:1", ErrPeerNotAllowed), codes.Unavailable},
		{status.Error(codes.NotFound, "as it is"), codes.NotFound},
		{errors.New("other"), codes.Internal},
	} {
		if got := status.Code(Status(c.err)); got != c.want {
			t.Errorf("Status(%v) = %v, want %v", c.err, got, c.want)
		}
	}
	if Status(nil) != nil {
		t.Error("Status(nil) is not nil")
	}
}
