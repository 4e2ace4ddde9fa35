package refdata

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// layout builds <tmp>/repo/go.work and <tmp>/shared/models/stories260K.gguf
// and returns the repository's folder.
func layout(t *testing.T, withModel bool) string {
	t.Helper()
	tmp := t.TempDir()
	repo := filepath.Join(tmp, "repo")
	if err := os.MkdirAll(filepath.Join(repo, "engine", "gguf"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(repo, "go.work"), []byte("go 1.26\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if withModel {
		model := filepath.Join(tmp, "shared", filepath.FromSlash(ModelFile))
		if err := os.MkdirAll(filepath.Dir(model), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(model, []byte("GGUF"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return repo
}

func TestFound(t *testing.T) {
	repo := layout(t, true)
	t.Chdir(filepath.Join(repo, "engine", "gguf"))
	if got, err := Root(); err != nil || got != repo {
		t.Errorf("Root() = %q, %v; want %q", got, err, repo)
	}
	if got := RepoRoot(t); got != repo {
		t.Errorf("RepoRoot = %q, want %q", got, repo)
	}
	shared := filepath.Join(filepath.Dir(repo), "shared")
	if got := Dir(t); got != shared {
		t.Errorf("Dir = %q, want %q", got, shared)
	}
	want := filepath.Join(shared, "models", "stories260K.gguf")
	if got := Model(t); got != want {
		t.Errorf("Model = %q, want %q", got, want)
	}
	if got, ok := Lookup(ModelFile); !ok || got != want {
		t.Errorf("Lookup(ModelFile) = %q, %v; want %q, true", got, ok, want)
	}
	if _, ok := Lookup(GoldenFile); ok {
		t.Error("Lookup(GoldenFile) found a file that is not there")
	}
}

func TestNoRoot(t *testing.T) {
	t.Chdir(t.TempDir())
	if _, err := Root(); !errors.Is(err, ErrNoRoot) {
		t.Errorf("Root() error = %v, want ErrNoRoot", err)
	}
	if _, ok := Lookup(); ok {
		t.Error("Lookup() found reference data without a go.work")
	}
}

// TestMissingSkipsOrFails runs Path on absent data in a subtest and checks
// that it skipped without CI; with CI set it must fail, which a subtest
// cannot show without failing its parent, so that case runs the test binary
// again.
func TestMissingSkipsOrFails(t *testing.T) {
	if os.Getenv("REFDATA_CHILD") != "" {
		t.Chdir(layout(t, false))
		Golden(t)
		t.Fatal("Golden returned on missing data")
	}
	t.Chdir(layout(t, false))
	t.Setenv(EnvCI, "")
	var reached bool
	t.Run("skip", func(t *testing.T) {
		Golden(t)
		reached = true
	})
	if reached {
		t.Error("Golden returned on missing data without CI")
	}

	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		ci   string
		fail bool
	}{{"", false}, {"true", true}} {
		cmd := exec.Command(exe, "-test.run=^TestMissingSkipsOrFails$", "-test.v")
		cmd.Env = append(os.Environ(), "REFDATA_CHILD=1", EnvCI+"="+tc.ci)
		out, err := cmd.CombinedOutput()
		if failed := err != nil; failed != tc.fail {
			t.Errorf("CI=%q: failed = %v, want %v\n%s", tc.ci, failed, tc.fail, out)
		}
	}
}
