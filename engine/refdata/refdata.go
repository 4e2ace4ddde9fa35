// Package refdata finds the reference data that Baton's tests read: the
// folder "shared" beside the repository (the folder holding go.work), which
// holds a tiny trained model (models/stories260K.gguf) and llama.cpp's
// golden outputs for it (golden/). The data is not part of the repository,
// so a test that needs it skips when it is absent — except when the CI
// environment variable is set, where missing reference data is a failure,
// so that a misconfigured CI run cannot pass by skipping everything.
//
// Every module's tests use this package rather than a copy of the search.
package refdata

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// Paths inside the reference data folder, in slash form.
const (
	ModelFile  = "models/stories260K.gguf" // the tiny trained llama model
	GoldenFile = "golden/stories260K.json" // llama.cpp's tokenizations and greedy generations of it
)

// EnvCI names the environment variable that, when set to anything, turns a
// skip for missing reference data into a failure.
const EnvCI = "CI"

// ErrNoRoot means no folder above the working directory holds go.work.
var ErrNoRoot = errors.New("refdata: no go.work above the working directory")

// Root returns the folder holding go.work, found by walking up from the
// working directory; go test runs a package's tests in its own folder, so
// this is the repository's root.
func Root() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("refdata: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", ErrNoRoot
		}
		dir = parent
	}
}

// Lookup returns the path of rel (slash-separated, e.g. ModelFile) inside
// the reference data folder, and whether it exists. It never skips or fails,
// for callers that only use the data when it happens to be there, such as
// fuzz seeds and benchmarks.
func Lookup(rel ...string) (string, bool) {
	root, err := Root()
	if err != nil {
		return "", false
	}
	p := join(root, rel)
	_, err = os.Stat(p)
	return p, err == nil
}

// RepoRoot returns the folder holding go.work, failing the test when there
// is none: a test that needs the repository's root cannot run outside it.
func RepoRoot(t testing.TB) string {
	t.Helper()
	root, err := Root()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// Dir returns the reference data folder, ../shared beside the repository,
// or skips the test when it is absent (fails under CI).
func Dir(t testing.TB) string {
	t.Helper()
	return Path(t)
}

// Path returns the path of rel (slash-separated, e.g. GoldenFile) inside the
// reference data folder, or skips the test when it is absent (fails under
// CI). Path(t) with no rel is the folder itself.
func Path(t testing.TB, rel ...string) string {
	t.Helper()
	root, err := Root()
	if err != nil {
		Missing(t, "%v, so no ../shared beside it", err)
		return ""
	}
	p := join(root, rel)
	if _, err := os.Stat(p); err != nil {
		Missing(t, "reference data %s is absent", p)
	}
	return p
}

// Model returns the path of the reference model, stories260K.gguf, or skips
// the test when it is absent (fails under CI).
func Model(t testing.TB) string {
	t.Helper()
	return Path(t, ModelFile)
}

// Golden returns the path of llama.cpp's golden outputs for the reference
// model, or skips the test when they are absent (fails under CI).
func Golden(t testing.TB) string {
	t.Helper()
	return Path(t, GoldenFile)
}

// Missing skips the test because reference data it needs is missing or
// unreadable, or fails it when EnvCI is set.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	why := fmt.Sprintf(format, args...)
	if os.Getenv(EnvCI) != "" {
		t.Fatalf("%s (%s is set, so this is a failure)", why, EnvCI)
	}
	t.Skipf("%s; skipping (it lives in ../shared beside the repository)", why)
}

// join places the slash-separated parts rel inside ../shared beside root.
func join(root string, rel []string) string {
	parts := []string{filepath.Dir(root), "shared"}
	for _, r := range rel {
		parts = append(parts, filepath.FromSlash(r))
	}
	return filepath.Join(parts...)
}
