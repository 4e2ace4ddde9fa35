package modelfile

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Environment variables consulted when the matching Options field is empty.
const (
	EnvModel      = "BATON_MODEL"       // FromEnv: the model when --model is unset
	EnvCacheDir   = "BATON_CACHE_DIR"   // Options.CacheDir
	EnvHFEndpoint = "BATON_HF_ENDPOINT" // Options.BaseURL
	EnvHFToken    = "HF_TOKEN"          // Options.Token
)

// Defaults for the corresponding Options fields.
const (
	DefaultBaseURL      = "https://huggingface.co"
	DefaultStallTimeout = 30 * time.Second
	// DefaultConnectTimeout bounds dialing and the TLS handshake.
	DefaultConnectTimeout = 15 * time.Second
)

// Options tunes Resolve. The zero value is ready to use.
type Options struct {
	// CacheDir holds downloaded models; default $BATON_CACHE_DIR, else
	// os.UserCacheDir()/baton/models.
	CacheDir string
	// BaseURL is the hub's address; default $BATON_HF_ENDPOINT, else
	// DefaultBaseURL.
	BaseURL string
	// Token is sent as "Authorization: Bearer" for gated and private
	// repositories; default $HF_TOKEN. It never appears in errors.
	Token string
	// Progress, when set, is called from Resolve's goroutine with the bytes
	// downloaded so far and the total (-1 when unknown), at most every
	// 100 ms and once at the end with done == total.
	Progress func(done, total int64)
	// StallTimeout aborts a download when no response headers, or no body
	// bytes, arrive for this long; default DefaultStallTimeout.
	StallTimeout time.Duration
	// ConnectTimeout bounds dialing and the TLS handshake; default
	// DefaultConnectTimeout.
	ConnectTimeout time.Duration
}

// withDefaults fills the empty fields of o from the environment and the
// package defaults.
func (o Options) withDefaults() (Options, error) {
	if o.CacheDir == "" {
		o.CacheDir = os.Getenv(EnvCacheDir)
	}
	if o.CacheDir == "" {
		dir, err := os.UserCacheDir()
		if err != nil {
			return o, fmt.Errorf("model: no cache directory (set %s): %w", EnvCacheDir, err)
		}
		o.CacheDir = filepath.Join(dir, "baton", "models")
	}
	if o.BaseURL == "" {
		o.BaseURL = os.Getenv(EnvHFEndpoint)
	}
	if o.BaseURL == "" {
		o.BaseURL = DefaultBaseURL
	}
	u, err := url.Parse(o.BaseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return o, fmt.Errorf("model: hub address %q: want an http:// or https:// URL", o.BaseURL)
	}
	o.BaseURL = strings.TrimRight(o.BaseURL, "/")
	if o.Token == "" {
		o.Token = os.Getenv(EnvHFToken)
	}
	if o.StallTimeout <= 0 {
		o.StallTimeout = DefaultStallTimeout
	}
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = DefaultConnectTimeout
	}
	return o, nil
}

// Resolve returns the path of the GGUF file that ref names: a local path,
// checked to be a readable regular file, or an hf:// reference, downloaded
// into the cache unless it is already there (see the package documentation).
// Cancelling ctx stops a download and keeps what arrived for a later resume.
func Resolve(ctx context.Context, ref string, opts Options) (string, error) {
	switch {
	case ref == "":
		return "", fmt.Errorf("model: %w: empty", ErrInvalidRef)
	case strings.HasPrefix(ref, HFScheme):
		r, err := ParseRef(ref)
		if err != nil {
			return "", err
		}
		opts, err := opts.withDefaults()
		if err != nil {
			return "", err
		}
		return download(ctx, r, opts)
	}
	if scheme, _, ok := strings.Cut(ref, "://"); ok && isScheme(scheme) {
		return "", fmt.Errorf("model: %q: %w: scheme %q not supported (want a local path or %sOWNER/REPO/FILE.gguf)", ref, ErrInvalidRef, scheme, HFScheme)
	}
	return checkLocal(ref)
}

// isScheme reports whether s looks like a URL scheme, so that
// "https://host/m.gguf" is refused as a URL rather than reported missing as
// a path.
func isScheme(s string) bool {
	if s == "" {
		return false
	}
	for i, c := range s {
		letter := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
		if !letter && (i == 0 || !(c >= '0' && c <= '9' || c == '+' || c == '-' || c == '.')) {
			return false
		}
	}
	return true
}

// checkLocal verifies that p is a readable regular file and returns its
// absolute path.
func checkLocal(p string) (string, error) {
	fi, err := os.Stat(p)
	if err != nil {
		return "", fmt.Errorf("model: %s: %w", p, pathErrCause(err))
	}
	if fi.IsDir() {
		return "", fmt.Errorf("model: %s: is a directory, not a model file", p)
	}
	if !fi.Mode().IsRegular() {
		return "", fmt.Errorf("model: %s: not a regular file (mode %v)", p, fi.Mode().Type())
	}
	// Stat succeeds on unreadable files; opening is the only honest check.
	// The mode test above comes first because opening a FIFO would block.
	f, err := os.Open(p)
	if err != nil {
		return "", fmt.Errorf("model: %s: %w", p, pathErrCause(err))
	}
	f.Close()
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", fmt.Errorf("model: %s: %w", p, err)
	}
	return abs, nil
}

// pathErrCause strips the operation and path from a *fs.PathError, which the
// caller already names, keeping the underlying error (and so errors.Is with
// fs.ErrNotExist or fs.ErrPermission) intact.
func pathErrCause(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// defaultModelRel is where the repository's reference model sits relative
// to a checkout, in slash form.
const defaultModelRel = "../shared/models/stories260K.gguf"

// maxDefaultWalk is how many parent directories DefaultPath climbs.
const maxDefaultWalk = 6

// DefaultHelp says in a flag's help where the default model is looked for.
const DefaultHelp = defaultModelRel + " beside the working directory or the binary, or a parent of either"

// DefaultPath returns the model used when neither --model nor $BATON_MODEL
// is set: the first existing ../shared/models/stories260K.gguf relative to
// the working directory or one of its ancestors, else relative to the
// running binary's directory or one of its ancestors — so that bin/batonctl
// finds it from any working directory. Each walk climbs at most six levels
// and stops at a folder holding go.work (the repository's root, beside
// which the reference data lives). It returns "" when there is none.
func DefaultPath() string {
	return defaultPathFrom(searchDirs()...)
}

// searchDirs are the folders DefaultPath starts from: the working
// directory, then the directory of the executable with symlinks resolved.
func searchDirs() []string {
	var dirs []string
	if wd, err := os.Getwd(); err == nil {
		dirs = append(dirs, wd)
	}
	if exe, err := os.Executable(); err == nil {
		if real, err := filepath.EvalSymlinks(exe); err == nil {
			exe = real
		}
		dirs = append(dirs, filepath.Dir(exe))
	}
	return dirs
}

func defaultPathFrom(dirs ...string) string {
	for _, dir := range dirs {
		dir = filepath.Clean(dir)
		for range maxDefaultWalk + 1 {
			p := filepath.Join(dir, filepath.FromSlash(defaultModelRel))
			if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
				return p
			}
			parent := filepath.Dir(dir)
			if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil || parent == dir {
				break
			}
			dir = parent
		}
	}
	return ""
}

// FromEnv returns the model reference to use: flagValue if set, else
// $BATON_MODEL, else DefaultPath(). The result is "" when nothing is found.
func FromEnv(flagValue string) string {
	if flagValue != "" {
		return flagValue
	}
	if v := os.Getenv(EnvModel); v != "" {
		return v
	}
	return DefaultPath()
}
