package modelfile

import (
	"errors"
	"fmt"
	"net/url"
	"path"
	"strings"
	"unicode"
)

// HFScheme is the prefix of references to files on the Hugging Face hub.
const HFScheme = "hf://"

// DefaultRevision is the revision used when a reference names none.
const DefaultRevision = "main"

// ErrInvalidRef means a model reference is malformed.
var ErrInvalidRef = errors.New("invalid model reference")

// Ref is a parsed hf:// reference.
type Ref struct {
	Owner    string // user or organisation, e.g. "TheBloke"
	Repo     string // repository name
	Revision string // branch, tag or commit; DefaultRevision when the reference names none
	Path     string // slash-separated path of the file inside the repository
}

// String returns the canonical form of r; the revision is left out when it
// is the default.
func (r Ref) String() string {
	if r.Revision == DefaultRevision {
		return HFScheme + r.Owner + "/" + r.Repo + "/" + r.Path
	}
	return HFScheme + r.Owner + "/" + r.Repo + "@" + r.Revision + "/" + r.Path
}

// URL returns where r is downloaded from, given the hub's base URL.
func (r Ref) URL(baseURL string) string {
	segs := strings.Split(r.Path, "/")
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	return strings.TrimRight(baseURL, "/") + "/" + url.PathEscape(r.Owner) + "/" + url.PathEscape(r.Repo) +
		"/resolve/" + url.PathEscape(r.Revision) + "/" + strings.Join(segs, "/")
}

// ParseRef parses hf://OWNER/REPO[@REVISION]/path/in/repo/FILE.gguf. Every
// part is validated so that it can be used as a cache path and a URL path
// without escaping surprises; the error names the offending part.
func ParseRef(s string) (Ref, error) {
	rest, ok := strings.CutPrefix(s, HFScheme)
	if !ok {
		return Ref{}, fmt.Errorf("model: %q: %w: want %sOWNER/REPO/FILE.gguf", s, ErrInvalidRef, HFScheme)
	}
	bad := func(format string, args ...any) (Ref, error) {
		return Ref{}, fmt.Errorf("model: %q: %w: %s", s, ErrInvalidRef, fmt.Sprintf(format, args...))
	}
	parts := strings.Split(rest, "/")
	r := Ref{Owner: parts[0], Revision: DefaultRevision}
	if err := checkRepoName(r.Owner); err != nil {
		return bad("owner %q: %v", r.Owner, err)
	}
	if len(parts) < 2 {
		return bad("missing the repository: want %sOWNER/REPO/FILE.gguf", HFScheme)
	}
	r.Repo = parts[1]
	if name, rev, ok := strings.Cut(parts[1], "@"); ok {
		r.Repo, r.Revision = name, rev
		if err := checkRevision(rev); err != nil {
			return bad("revision %q: %v", rev, err)
		}
	}
	if err := checkRepoName(r.Repo); err != nil {
		return bad("repository %q: %v", r.Repo, err)
	}
	if len(parts) < 3 {
		return bad("missing the file: want %sOWNER/REPO/FILE.gguf", HFScheme)
	}
	segs := parts[2:]
	for i, seg := range segs {
		if err := checkPathSegment(seg); err != nil {
			return bad("path %q, segment %d %q: %v", strings.Join(segs, "/"), i+1, seg, err)
		}
	}
	r.Path = strings.Join(segs, "/")
	file := path.Base(r.Path)
	if ext := path.Ext(file); !strings.EqualFold(ext, ".gguf") || len(file) == len(ext) {
		return bad("file %q: not a .gguf file name", file)
	}
	return r, nil
}

// checkRepoName applies the hub's rules for user, organisation and
// repository names.
func checkRepoName(s string) error {
	switch {
	case s == "":
		return errors.New("empty")
	case len(s) > 96:
		return errors.New("longer than 96 characters")
	case strings.Contains(s, ".."), strings.Contains(s, "--"):
		return errors.New(`contains ".." or "--"`)
	case strings.IndexAny(s[:1], ".-") >= 0, strings.IndexAny(s[len(s)-1:], ".-") >= 0:
		return errors.New(`starts or ends with "." or "-"`)
	}
	for _, c := range s {
		if !isNameChar(c) {
			return fmt.Errorf("character %q not allowed (only letters, digits, '.', '-' and '_')", c)
		}
	}
	return nil
}

// checkRevision accepts branch names, tags and commit hashes that fit in one
// path segment; the cache stores each revision in a directory of that name.
func checkRevision(s string) error {
	switch {
	case s == "":
		return errors.New("empty")
	case len(s) > 255:
		return errors.New("longer than 255 characters")
	case strings.Contains(s, ".."):
		return errors.New(`contains ".."`)
	case s[0] == '.' || s[0] == '-':
		return errors.New(`starts with "." or "-"`)
	}
	for _, c := range s {
		if !isNameChar(c) {
			return fmt.Errorf("character %q not allowed (only letters, digits, '.', '-' and '_')", c)
		}
	}
	return nil
}

func isNameChar(c rune) bool {
	return c < 0x80 && (c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_')
}

// checkPathSegment rejects segments that would escape the cache directory,
// change meaning in a URL, or be invalid file names on common systems.
func checkPathSegment(s string) error {
	switch {
	case s == "":
		return errors.New("empty (doubled or trailing '/')")
	case s == "." || s == "..":
		return fmt.Errorf("%q not allowed", s)
	case len(s) > 255:
		return errors.New("longer than 255 bytes")
	}
	for _, c := range s {
		if unicode.IsControl(c) || c == unicode.ReplacementChar || strings.ContainsRune(`\:?#%*"<>|`, c) {
			return fmt.Errorf("character %q not allowed", c)
		}
	}
	return nil
}
