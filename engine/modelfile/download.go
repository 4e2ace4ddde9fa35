package modelfile

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unicode"
)

// Errors a download can end with; test for them with errors.Is.
var (
	// ErrUnreachable means the hub could not be contacted at all.
	ErrUnreachable = errors.New("cannot reach")
	// ErrStalled means the server stopped sending for Options.StallTimeout.
	ErrStalled = errors.New("download stalled")
	// ErrHashMismatch means the downloaded bytes do not have the sha256 the
	// server announced; the download is deleted.
	ErrHashMismatch = errors.New("sha256 mismatch")
)

// StatusError is an HTTP response other than success from the hub.
type StatusError struct {
	URL        string // the URL requested; redirect targets are left out as they carry signatures
	StatusCode int
	Status     string // e.g. "404 Not Found"
	Message    string // the server's explanation, when it gave a short one
	Hint       string // what the user can do about it, if anything
}

func (e *StatusError) Error() string {
	s := "GET " + e.URL + ": " + e.Status
	if e.Message != "" {
		s += ": " + e.Message
	}
	if e.Hint != "" {
		s += " (" + e.Hint + ")"
	}
	return s
}

// errRestart asks download to discard the partial file and start over: the
// server's answer to a resume does not fit what is on disk.
var errRestart = errors.New("restart download")

// copyBufSize is the read size of the body copy; big enough that the
// per-read bookkeeping (hash, stall timer) costs nothing.
const copyBufSize = 256 << 10

// download makes sure the file r names is in the cache, fetching it under
// the file's lock if needed, and returns its path.
func download(ctx context.Context, r Ref, o Options) (string, error) {
	final := filepath.Join(o.CacheDir, "hf", r.Owner, r.Repo, r.Revision, filepath.FromSlash(r.Path))
	if ok, err := isCached(final); ok || err != nil {
		return final, err
	}
	if err := os.MkdirAll(filepath.Dir(final), 0o755); err != nil {
		return "", fmt.Errorf("model: download %s: create cache directory: %w", r, err)
	}
	unlock, err := lockFile(ctx, final+".lock")
	if err != nil {
		return "", err
	}
	defer unlock()
	// Another process may have finished the download while this one waited.
	if ok, err := isCached(final); ok || err != nil {
		return final, err
	}

	tr := newTransport(o)
	defer tr.CloseIdleConnections()
	d := &fetcher{
		ref:       r,
		opts:      o,
		url:       r.URL(o.BaseURL),
		final:     final,
		partial:   final + ".partial",
		meta:      final + ".partial.meta",
		transport: tr,
		progress:  throttle{fn: o.Progress, interval: progressInterval},
	}
	for attempt := 0; ; attempt++ {
		err := d.fetch(ctx)
		if err == nil {
			return final, nil
		}
		if !errors.Is(err, errRestart) {
			return "", err
		}
		if attempt > 0 {
			return "", fmt.Errorf("model: download %s: the server's answer to a fresh request does not fit either: %w", r, err)
		}
		if err := d.discard(); err != nil {
			return "", err
		}
	}
}

// isCached reports whether the complete file is at path.
func isCached(path string) (bool, error) {
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("model: cache: %w", err)
	case !fi.Mode().IsRegular():
		return false, fmt.Errorf("model: cache: %s is not a regular file", path)
	}
	return true, nil
}

func newTransport(o Options) *http.Transport {
	dialer := &net.Dialer{Timeout: o.ConnectTimeout, KeepAlive: 30 * time.Second}
	return &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		DialContext:         dialer.DialContext,
		TLSHandshakeTimeout: o.ConnectTimeout,
		// The stall timer normally fires first; this is a backstop.
		ResponseHeaderTimeout: o.StallTimeout + o.ConnectTimeout,
		// Transparent gzip would change the byte counts that ranges and
		// Content-Length refer to.
		DisableCompression: true,
		ForceAttemptHTTP2:  true,
		MaxIdleConns:       4,
		IdleConnTimeout:    30 * time.Second,
	}
}

// fetcher downloads one file; it runs with the file's lock held.
type fetcher struct {
	ref       Ref
	opts      Options
	url       string
	final     string
	partial   string
	meta      string
	transport *http.Transport
	progress  throttle
}

// identity is what a partial file is a prefix of, so that a resume does
// not splice two versions of a file together.
type identity struct {
	size   int64  // -1 when unknown
	sha256 string // "" when the server gave none
}

func (d *fetcher) errorf(format string, args ...any) error {
	return fmt.Errorf("model: download %s: "+format, append([]any{d.ref}, args...)...)
}

// discard deletes the partial download and its metadata.
func (d *fetcher) discard() error {
	for _, p := range []string{d.partial, d.meta} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return d.errorf("%w", err)
		}
	}
	return nil
}

// fetch makes one request, resuming the partial file if there is one, and
// on success leaves the verified file at d.final.
func (d *fetcher) fetch(ctx context.Context) error {
	offset, h, err := d.hashPartial(ctx)
	if err != nil {
		return err
	}

	reqCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// The stall timer covers the wait for response headers (redirects
	// included) and every gap between body reads.
	stall := time.AfterFunc(d.opts.StallTimeout, func() { cancel(ErrStalled) })
	defer stall.Stop()

	req, err := http.NewRequestWithContext(reqCtx, http.MethodGet, d.url, nil)
	if err != nil {
		return d.errorf("%w", err)
	}
	req.Header.Set("User-Agent", "baton-modelfile")
	if offset > 0 {
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-", offset))
	}
	if d.opts.Token != "" {
		req.Header.Set("Authorization", "Bearer "+d.opts.Token)
	}
	// Hashes are trusted only from the hub itself, never from the CDN it
	// redirects to, whose ETags mean something else.
	var hubHeaders []http.Header
	client := &http.Client{
		Transport: d.transport,
		CheckRedirect: func(next *http.Request, via []*http.Request) error {
			if len(via) >= 10 {
				return errors.New("stopped after 10 redirects")
			}
			if prev := next.Response; prev != nil && prev.Request.URL.Host == req.URL.Host {
				hubHeaders = append(hubHeaders, prev.Header)
			}
			// net/http forwards Authorization to subdomains and other
			// ports of the same host (cdn-lfs.huggingface.co, say); the
			// token is for the hub alone, and signed CDN URLs need none.
			if next.URL.Host != req.URL.Host {
				next.Header.Del("Authorization")
			}
			stall.Reset(d.opts.StallTimeout)
			return nil
		},
	}
	resp, err := client.Do(req)
	if err != nil {
		var cause error = err
		if ue, ok := err.(*url.Error); ok {
			cause = ue.Err
		}
		switch {
		case ctx.Err() != nil:
			return d.errorf("%w", ctx.Err())
		case context.Cause(reqCtx) == ErrStalled:
			return d.errorf("%w: no response from %s within %v; the file is not in the cache at %s", ErrStalled, d.url, d.opts.StallTimeout, d.final)
		}
		return d.errorf("%w %s: %w; the file is not in the cache at %s", ErrUnreachable, d.url, cause, d.final)
	}
	defer resp.Body.Close()
	stall.Reset(d.opts.StallTimeout)
	if resp.Request.URL.Host == req.URL.Host {
		hubHeaders = append(hubHeaders, resp.Header)
	}
	want := identity{size: -1, sha256: expectedSHA256(hubHeaders)}

	var end int64 // the offset the body should bring the file to
	switch resp.StatusCode {
	case http.StatusOK:
		offset, end = 0, resp.ContentLength
		want.size = end
		h.Reset()
		if err := d.writeMeta(want); err != nil {
			return err
		}
	case http.StatusPartialContent:
		start, last, size, err := parseContentRange(resp.Header.Get("Content-Range"))
		if err != nil {
			return d.errorf("GET %s: %w", d.url, err)
		}
		if start != offset {
			return fmt.Errorf("server resumed at byte %d, not %d: %w", start, offset, errRestart)
		}
		if resp.ContentLength >= 0 && resp.ContentLength != last-start+1 {
			return d.errorf("GET %s: Content-Length %d does not match Content-Range bytes %d-%d", d.url, resp.ContentLength, start, last)
		}
		if size >= 0 && last+1 != size {
			return d.errorf("GET %s: the server sent bytes %d-%d of %d only", d.url, start, last, size)
		}
		want.size, end = size, last+1
		if err := d.checkIdentity(want); err != nil {
			return err
		}
	case http.StatusRequestedRangeNotSatisfiable:
		// The partial file may already hold every byte: a previous run
		// stopped between the last write and the rename.
		_, _, size, err := parseContentRange(resp.Header.Get("Content-Range"))
		if offset == 0 || err != nil || size != offset {
			return fmt.Errorf("server refused range from byte %d: %w", offset, errRestart)
		}
		want.size = size
		if err := d.checkIdentity(want); err != nil {
			return err
		}
		return d.finish(h, offset, want)
	default:
		return d.errorf("%w", d.statusError(resp))
	}

	flag := os.O_WRONLY | os.O_CREATE
	if offset == 0 {
		flag |= os.O_TRUNC
	}
	f, err := os.OpenFile(d.partial, flag, 0o644)
	if err != nil {
		return d.errorf("%w", err)
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return d.errorf("%w", err)
	}

	done, buf := offset, make([]byte, copyBufSize)
	d.progress.report(done, end)
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			stall.Reset(d.opts.StallTimeout)
			if _, err := f.Write(buf[:n]); err != nil {
				return d.errorf("%w", err)
			}
			h.Write(buf[:n])
			done += int64(n)
			d.progress.report(done, end)
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			kept := fmt.Sprintf("the partial download at %s (%s) is kept for a later resume", d.partial, formatBytes(done))
			switch {
			case ctx.Err() != nil:
				return d.errorf("%w; %s", ctx.Err(), kept)
			case context.Cause(reqCtx) == ErrStalled:
				return d.errorf("%w: no data from %s for %v; %s", ErrStalled, d.url, d.opts.StallTimeout, kept)
			}
			return d.errorf("interrupted after %d of %s bytes: %w; %s", done, sizeString(end), rerr, kept)
		}
	}
	if end >= 0 && done != end {
		return d.errorf("the body ended after %d of %d bytes; run again to resume", done, end)
	}
	if err := f.Sync(); err != nil {
		return d.errorf("%w", err)
	}
	if err := f.Close(); err != nil {
		return d.errorf("%w", err)
	}
	if want.size < 0 {
		want.size = done
	}
	return d.finish(h, done, want)
}

func sizeString(n int64) string {
	if n < 0 {
		return "unknown"
	}
	return strconv.FormatInt(n, 10)
}

// finish verifies the complete partial file, records its sha256 and moves
// it into place.
func (d *fetcher) finish(h hash.Hash, size int64, want identity) error {
	got := hex.EncodeToString(h.Sum(nil))
	if want.sha256 != "" && got != want.sha256 {
		if err := d.discard(); err != nil {
			return err
		}
		return d.errorf("%w: the server announced %s, the downloaded file has %s; the download was deleted", ErrHashMismatch, want.sha256, got)
	}
	// The checksum goes first so that a complete file always has one.
	sum := got + "  " + filepath.Base(d.final) + "\n"
	if err := writeFileAtomic(d.final+".sha256", []byte(sum)); err != nil {
		return d.errorf("%w", err)
	}
	if err := os.Rename(d.partial, d.final); err != nil {
		return d.errorf("%w", err)
	}
	syncDir(filepath.Dir(d.final))
	if err := os.Remove(d.meta); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return d.errorf("%w", err)
	}
	d.progress.finish(size, size)
	return nil
}

// hashPartial feeds the existing partial file through a new sha256, so the
// final hash covers the whole file, and returns its size.
func (d *fetcher) hashPartial(ctx context.Context) (int64, hash.Hash, error) {
	h := sha256.New()
	f, err := os.Open(d.partial)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, h, nil
	}
	if err != nil {
		return 0, nil, d.errorf("%w", err)
	}
	defer f.Close()
	n, err := io.Copy(h, ctxReader{ctx, f})
	if err != nil {
		if ctx.Err() != nil {
			return 0, nil, d.errorf("%w", ctx.Err())
		}
		return 0, nil, d.errorf("read %s: %w", d.partial, err)
	}
	return n, h, nil
}

// ctxReader stops reading once ctx is done; hashing a large partial file
// takes a while.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// writeMeta records what the partial file is a prefix of.
func (d *fetcher) writeMeta(id identity) error {
	data := fmt.Sprintf("size %d\nsha256 %s\n", id.size, id.sha256)
	if err := writeFileAtomic(d.meta, []byte(data)); err != nil {
		return d.errorf("%w", err)
	}
	return nil
}

// checkIdentity compares the remote file being resumed with the one the
// partial file was started from, as far as both are known. A missing or
// unreadable record is not an error: the final hash check still applies.
func (d *fetcher) checkIdentity(cur identity) error {
	data, err := os.ReadFile(d.meta)
	if err != nil {
		return d.writeMeta(cur)
	}
	old := identity{size: -1}
	sc := bufio.NewScanner(strings.NewReader(string(data)))
	for sc.Scan() {
		key, val, _ := strings.Cut(sc.Text(), " ")
		switch key {
		case "size":
			if n, err := strconv.ParseInt(val, 10, 64); err == nil {
				old.size = n
			}
		case "sha256":
			old.sha256 = val
		}
	}
	if old.size >= 0 && cur.size >= 0 && old.size != cur.size {
		return fmt.Errorf("remote size changed from %d to %d: %w", old.size, cur.size, errRestart)
	}
	if old.sha256 != "" && cur.sha256 != "" && old.sha256 != cur.sha256 {
		return fmt.Errorf("remote sha256 changed from %s to %s: %w", old.sha256, cur.sha256, errRestart)
	}
	return nil
}

// expectedSHA256 returns the content hash the hub announced, if any: the
// hub puts the sha256 of LFS files in X-Linked-Etag (on its redirect) and,
// for files it serves itself, possibly in ETag.
func expectedSHA256(headers []http.Header) string {
	for _, key := range []string{"X-Linked-Etag", "Etag"} {
		for _, h := range headers {
			if s := sha256FromETag(h.Get(key)); s != "" {
				return s
			}
		}
	}
	return ""
}

// sha256FromETag returns the hash in a strong entity tag made of 64 hex
// digits, lower-cased, or "". Weak tags promise no byte equality.
func sha256FromETag(v string) string {
	v = strings.TrimSpace(v)
	if strings.HasPrefix(v, "W/") {
		return ""
	}
	v = strings.Trim(v, `"`)
	if len(v) != 64 {
		return ""
	}
	if _, err := hex.DecodeString(v); err != nil {
		return ""
	}
	return strings.ToLower(v)
}

// parseContentRange parses "bytes FIRST-LAST/SIZE", "bytes FIRST-LAST/*"
// and "bytes */SIZE"; unknown parts are -1.
func parseContentRange(v string) (first, last, size int64, err error) {
	bad := func() (int64, int64, int64, error) {
		return 0, 0, 0, fmt.Errorf("bad Content-Range %q", v)
	}
	rest, ok := strings.CutPrefix(v, "bytes ")
	if !ok {
		return bad()
	}
	rng, sz, ok := strings.Cut(rest, "/")
	if !ok {
		return bad()
	}
	size = -1
	if sz != "*" {
		if size, err = strconv.ParseInt(sz, 10, 64); err != nil || size < 0 {
			return bad()
		}
	}
	if rng == "*" {
		if size < 0 {
			return bad()
		}
		return -1, -1, size, nil
	}
	a, b, ok := strings.Cut(rng, "-")
	if !ok {
		return bad()
	}
	if first, err = strconv.ParseInt(a, 10, 64); err != nil || first < 0 {
		return bad()
	}
	if last, err = strconv.ParseInt(b, 10, 64); err != nil || last < first || (size >= 0 && last >= size) {
		return bad()
	}
	return first, last, size, nil
}

// statusError describes a failed response, with the hub's short
// explanation when it gave one.
func (d *fetcher) statusError(resp *http.Response) *StatusError {
	e := &StatusError{URL: d.url, StatusCode: resp.StatusCode, Status: resp.Status}
	msg := resp.Header.Get("X-Error-Message")
	if msg == "" {
		ct := resp.Header.Get("Content-Type")
		if strings.HasPrefix(ct, "text/plain") || strings.HasPrefix(ct, "application/json") {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
			msg = string(body)
		}
	}
	e.Message = oneLine(msg, 200)
	switch resp.StatusCode {
	case http.StatusUnauthorized, http.StatusForbidden:
		if d.opts.Token == "" {
			e.Hint = "the repository may be gated or private: set " + EnvHFToken
		} else {
			e.Hint = "the token was refused or has no access to this repository"
		}
	case http.StatusNotFound:
		e.Hint = "check the owner, repository, revision and file name"
	}
	return e
}

// oneLine makes untrusted server text safe to put in an error message.
func oneLine(s string, max int) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, strings.TrimSpace(s))
	if len(s) > max {
		s = strings.ToValidUTF8(s[:max], "") + "..."
	}
	return s
}

// writeFileAtomic replaces path with data so that readers see the old or
// the new content, never a mix. Callers hold the file's download lock, so
// the temporary name cannot collide.
func writeFileAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// syncDir makes a rename in dir durable where the system allows it; not
// every system can sync a directory, and the rename is already visible.
func syncDir(dir string) {
	if f, err := os.Open(dir); err == nil {
		_ = f.Sync()
		f.Close()
	}
}
