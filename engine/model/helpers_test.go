package model

import (
	"os"
	"path/filepath"
	"testing"
)

// sharedDir returns the ../shared directory beside the workspace root (the
// directory holding go.work), or skips the test when it is absent — except
// under CI, where missing reference data is a failure.
func sharedDir(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			missing(t, "no go.work above the test directory")
			return ""
		}
		dir = parent
	}
	shared := filepath.Join(filepath.Dir(dir), "shared")
	if _, err := os.Stat(shared); err != nil {
		missing(t, "reference data directory "+shared+" is absent")
	}
	return shared
}

func missing(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("%s (CI is set, so this is a failure)", why)
	}
	t.Skipf("%s; skipping", why)
}
