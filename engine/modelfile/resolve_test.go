package modelfile

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/baton-serving/baton/engine/refdata"
)

func TestResolveLocalPath(t *testing.T) {
	dir := t.TempDir()
	model := filepath.Join(dir, "m.gguf")
	if err := os.WriteFile(model, []byte("GGUF"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	for _, ref := range []string{model, "m.gguf", "./m.gguf"} {
		got, err := Resolve(context.Background(), ref, Options{})
		if err != nil || got != model {
			t.Errorf("Resolve(%q) = %q, %v; want %q", ref, got, err, model)
		}
	}
}

func TestResolveLocalPathErrors(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "y.gguf")
	_, err := Resolve(context.Background(), missing, Options{})
	if want := "model: " + missing + ": no such file"; err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("missing file: error = %v, want it to start with %q", err, want)
	}
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file: error %v does not wrap fs.ErrNotExist", err)
	}

	_, err = Resolve(context.Background(), dir, Options{})
	if err == nil || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "is a directory") {
		t.Errorf("directory: error = %v, want it named as a directory", err)
	}

	if os.Geteuid() != 0 && runtime.GOOS != "windows" {
		locked := filepath.Join(dir, "locked.gguf")
		if err := os.WriteFile(locked, []byte("GGUF"), 0o000); err != nil {
			t.Fatal(err)
		}
		_, err = Resolve(context.Background(), locked, Options{})
		if !errors.Is(err, fs.ErrPermission) || !strings.Contains(err.Error(), locked) {
			t.Errorf("unreadable file: error = %v, want a permission error naming it", err)
		}
	}

	for _, ref := range []string{"", "https://example.com/m.gguf", "s3://bucket/m.gguf"} {
		if _, err := Resolve(context.Background(), ref, Options{}); !errors.Is(err, ErrInvalidRef) {
			t.Errorf("Resolve(%q) error = %v, want ErrInvalidRef", ref, err)
		}
	}
}

func TestDefaultPathFrom(t *testing.T) {
	root := t.TempDir()
	model := filepath.Join(root, "shared", "models", "stories260K.gguf")
	if err := os.MkdirAll(filepath.Dir(model), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(model, []byte("GGUF"), 0o644); err != nil {
		t.Fatal(err)
	}
	deep := filepath.Join(root, "repo", "1", "2", "3", "4", "5", "6", "7")
	if err := os.MkdirAll(deep, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		dir  string
		want string
	}{
		{filepath.Join(root, "repo"), model},                               // ../shared from the checkout
		{filepath.Join(root, "repo", "1", "2", "3", "4", "5", "6"), model}, // six levels up
		{deep, ""}, // seven levels up is too far
		{t.TempDir(), ""},
	} {
		if got := defaultPathFrom(tc.dir); got != tc.want {
			t.Errorf("defaultPathFrom(%q) = %q, want %q", tc.dir, got, tc.want)
		}
	}

	// The binary's directory is searched after the working directory, so
	// that bin/batonctl finds the model from anywhere.
	bin := filepath.Join(root, "repo", "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if got := defaultPathFrom(t.TempDir(), bin); got != model {
		t.Errorf("defaultPathFrom(elsewhere, %q) = %q, want %q", bin, got, model)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if exe, err = filepath.EvalSymlinks(exe); err != nil {
		t.Fatal(err)
	}
	if dirs := searchDirs(); len(dirs) != 2 || dirs[1] != filepath.Dir(exe) {
		t.Errorf("searchDirs() = %q, want the working directory and %q", dirs, filepath.Dir(exe))
	}

	// The walk stops at the folder holding go.work: reference data further
	// up belongs to another checkout.
	nested := filepath.Join(root, "repo", "vendor", "inner")
	if err := os.MkdirAll(filepath.Join(nested, "pkg"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(nested, "go.work"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := defaultPathFrom(filepath.Join(nested, "pkg")); got != "" {
		t.Errorf("defaultPathFrom climbed past go.work to %q", got)
	}

	// A directory of that name does not count.
	other := t.TempDir()
	if err := os.MkdirAll(filepath.Join(other, "shared", "models", "stories260K.gguf"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(other, "repo"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got := defaultPathFrom(filepath.Join(other, "repo")); got != "" {
		t.Errorf("defaultPathFrom found directory %q", got)
	}

	t.Chdir(filepath.Join(root, "repo", "1"))
	if got := DefaultPath(); got != model {
		t.Errorf("DefaultPath() from %s = %q, want %q", filepath.Join(root, "repo", "1"), got, model)
	}
	t.Setenv(EnvModel, "")
	if got := FromEnv(""); got != model {
		t.Errorf("FromEnv(\"\") = %q, want the default %q", got, model)
	}
	t.Setenv(EnvModel, "hf://o/r/env.gguf")
	if got := FromEnv(""); got != "hf://o/r/env.gguf" {
		t.Errorf("FromEnv(\"\") = %q, want $%s", got, EnvModel)
	}
	if got := FromEnv("/flag.gguf"); got != "/flag.gguf" {
		t.Errorf("FromEnv(flag) = %q, want the flag", got)
	}
	t.Setenv(EnvModel, "")
	t.Chdir(deep)
	if got := FromEnv(""); got != "" {
		t.Errorf("FromEnv(\"\") with no default = %q, want \"\"", got)
	}
}

// TestDefaultPathFindsSharedModel checks that from inside this repository
// the default resolves to the reference model in ../shared.
func TestDefaultPathFindsSharedModel(t *testing.T) {
	want := refdata.Model(t)
	if got := DefaultPath(); got != want {
		t.Errorf("DefaultPath() = %q, want %q", got, want)
	}
	got, err := Resolve(context.Background(), DefaultPath(), Options{})
	if err != nil || got != want {
		t.Errorf("Resolve(DefaultPath()) = %q, %v", got, err)
	}
}
