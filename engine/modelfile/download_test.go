package modelfile

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// cachePath is where testRef lands in cache.
func cachePath(cache string) string {
	return filepath.Join(cache, "hf", testOwner, testRepo, "main", testFile)
}

// assertComplete checks the downloaded file, its checksum record and that
// no download leftovers remain.
func assertComplete(t *testing.T, got string, h *fakeHub, cache string) {
	t.Helper()
	if want := cachePath(cache); got != want {
		t.Fatalf("path = %q, want %q", got, want)
	}
	data, err := os.ReadFile(got)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(data, h.content) {
		t.Fatalf("downloaded %d bytes that differ from the served %d bytes", len(data), len(h.content))
	}
	sum, err := os.ReadFile(got + ".sha256")
	if err != nil {
		t.Fatal(err)
	}
	if want := h.sha + "  " + testFile + "\n"; string(sum) != want {
		t.Errorf("checksum file = %q, want %q", sum, want)
	}
	for _, ext := range []string{".partial", ".partial.meta", ".sha256.tmp", ".partial.meta.tmp"} {
		if _, err := os.Stat(got + ext); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left behind (stat error %v)", ext, err)
		}
	}
}

func assertNoFiles(t *testing.T, cache string, exts ...string) {
	t.Helper()
	for _, ext := range exts {
		if _, err := os.Stat(cachePath(cache) + ext); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%q exists (stat error %v)", testFile+ext, err)
		}
	}
}

func TestResolveDownloadsOnceThenUsesCache(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  func(*hubConfig)
	}{
		{"redirect with X-Linked-Etag", func(c *hubConfig) { c.redirect = true }},
		{"direct with X-Linked-Etag", func(c *hubConfig) {}},
		{"direct with ETag", func(c *hubConfig) { c.hashInTag = true }},
		{"no hash announced", func(c *hubConfig) { c.announce = "-" }},
		{"chunked slowly", func(c *hubConfig) { c.chunk, c.delay = 50_000, time.Millisecond }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkGoroutines(t)
			h := newFakeHub(t, 300_000)
			h.set(tc.cfg)
			cache := t.TempDir()
			var calls [][2]int64
			opts := h.opts(cache)
			opts.Progress = func(done, total int64) { calls = append(calls, [2]int64{done, total}) }

			got, err := Resolve(context.Background(), testRef, opts)
			if err != nil {
				t.Fatal(err)
			}
			assertComplete(t, got, h, cache)
			if n := h.requestCount(); n != 1 {
				t.Errorf("%d requests for the first Resolve, want 1", n)
			}
			if len(calls) == 0 || calls[len(calls)-1] != [2]int64{300_000, 300_000} {
				t.Errorf("progress calls %v do not end with {300000 300000}", calls)
			}

			got2, err := Resolve(context.Background(), testRef, opts)
			if err != nil || got2 != got {
				t.Fatalf("second Resolve = %q, %v; want %q", got2, err, got)
			}
			if n := h.requestCount(); n != 1 {
				t.Errorf("cached Resolve made %d more requests, want 0", n-1)
			}
		})
	}
}

func TestResolveResumesInterruptedDownload(t *testing.T) {
	const size, cutAt = 500_000, 123_457
	for _, tc := range []struct {
		name      string
		noRanges  bool
		redirect  bool
		wantRange string // Range header of the second request
	}{
		{"range supported", false, false, fmt.Sprintf("bytes=%d-", cutAt)},
		{"range supported behind redirect", false, true, fmt.Sprintf("bytes=%d-", cutAt)},
		{"no range support restarts", true, false, fmt.Sprintf("bytes=%d-", cutAt)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkGoroutines(t)
			h := newFakeHub(t, size)
			h.set(func(c *hubConfig) { c.cutAfter, c.cuts, c.noRanges, c.redirect = cutAt, 1, tc.noRanges, tc.redirect })
			cache := t.TempDir()

			_, err := Resolve(context.Background(), testRef, h.opts(cache))
			if err == nil || !strings.Contains(err.Error(), "interrupted after") {
				t.Fatalf("first Resolve error = %v, want an interruption", err)
			}
			fi, err := os.Stat(cachePath(cache) + ".partial")
			if err != nil {
				t.Fatalf("no partial file kept: %v", err)
			}
			if fi.Size() != cutAt {
				t.Fatalf("partial file has %d bytes, want %d", fi.Size(), cutAt)
			}
			assertNoFiles(t, cache, "", ".sha256")

			var first [2]int64
			opts := h.opts(cache)
			opts.Progress = func(done, total int64) {
				if first == ([2]int64{}) {
					first = [2]int64{done, total}
				}
			}
			got, err := Resolve(context.Background(), testRef, opts)
			if err != nil {
				t.Fatal(err)
			}
			assertComplete(t, got, h, cache)
			if r := h.rangeHeaders(); len(r) != 2 || r[0] != "" || r[1] != tc.wantRange {
				t.Errorf("Range headers = %q, want [\"\" %q]", r, tc.wantRange)
			}
			wantFirst := [2]int64{cutAt, size}
			if tc.noRanges {
				wantFirst = [2]int64{0, size}
			}
			if first != wantFirst {
				t.Errorf("first progress report = %v, want %v", first, wantFirst)
			}
		})
	}
}

func TestResolveCompletePartialIsFinished(t *testing.T) {
	// A run that died between the last write and the rename leaves a
	// complete partial file; the server answers the resume with 416.
	checkGoroutines(t)
	h := newFakeHub(t, 10_000)
	cache := t.TempDir()
	if err := os.MkdirAll(filepath.Dir(cachePath(cache)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cachePath(cache)+".partial", h.content, 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := Resolve(context.Background(), testRef, h.opts(cache))
	if err != nil {
		t.Fatal(err)
	}
	assertComplete(t, got, h, cache)
	if r := h.rangeHeaders(); len(r) != 1 || r[0] != "bytes=10000-" {
		t.Errorf("Range headers = %q, want one resume from 10000", r)
	}
}

func TestResolveRestartsWhenRemoteFileChanged(t *testing.T) {
	checkGoroutines(t)
	h := newFakeHub(t, 20_000)
	cache := t.TempDir()
	if err := os.MkdirAll(filepath.Dir(cachePath(cache)), 0o755); err != nil {
		t.Fatal(err)
	}
	// A partial of some older version of the file.
	old, oldSHA := testContent(30_000)
	if err := os.WriteFile(cachePath(cache)+".partial", old[:5000], 0o644); err != nil {
		t.Fatal(err)
	}
	meta := fmt.Sprintf("size 30000\nsha256 %s\n", oldSHA)
	if err := os.WriteFile(cachePath(cache)+".partial.meta", []byte(meta), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := Resolve(context.Background(), testRef, h.opts(cache))
	if err != nil {
		t.Fatal(err)
	}
	assertComplete(t, got, h, cache)
	if r := h.rangeHeaders(); len(r) != 2 || r[0] != "bytes=5000-" || r[1] != "" {
		t.Errorf("Range headers = %q, want a resume then a fresh request", r)
	}
}

func TestResolveHashMismatchDeletesDownload(t *testing.T) {
	for _, redirect := range []bool{false, true} {
		t.Run(fmt.Sprint("redirect=", redirect), func(t *testing.T) {
			checkGoroutines(t)
			h := newFakeHub(t, 50_000)
			bad := strings.Repeat("0f", 32)
			h.set(func(c *hubConfig) { c.redirect, c.announce = redirect, bad })
			cache := t.TempDir()
			_, err := Resolve(context.Background(), testRef, h.opts(cache))
			if !errors.Is(err, ErrHashMismatch) {
				t.Fatalf("error = %v, want ErrHashMismatch", err)
			}
			for _, s := range []string{bad, h.sha} {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not name hash %s", err, s)
				}
			}
			assertNoFiles(t, cache, "", ".partial", ".partial.meta", ".sha256")
		})
	}
}

func TestResolveHTTPStatusErrors(t *testing.T) {
	t.Setenv(EnvHFToken, "")
	for _, tc := range []struct {
		name     string
		status   int
		token    string // server requires it
		clientTk string
		want     []string
	}{
		{"not found", 404, "", "", []string{"404 Not Found", "Entry not found", "check the owner"}},
		{"server error", 503, "", "", []string{"503 Service Unavailable"}},
		{"gated without token", 0, "s3cret", "", []string{"401 Unauthorized", "Invalid credentials", "set HF_TOKEN"}},
		{"wrong token", 0, "s3cret", "hunter2", []string{"401 Unauthorized", "token was refused"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkGoroutines(t)
			h := newFakeHub(t, 1000)
			h.set(func(c *hubConfig) { c.status, c.token = tc.status, tc.token })
			cache := t.TempDir()
			opts := h.opts(cache)
			opts.Token = tc.clientTk
			_, err := Resolve(context.Background(), testRef, opts)
			var se *StatusError
			if !errors.As(err, &se) {
				t.Fatalf("error = %v, want a *StatusError", err)
			}
			url := h.srv.URL + "/" + testOwner + "/" + testRepo + "/resolve/main/" + testFile
			for _, s := range append(tc.want, url, testRef) {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not contain %q", err, s)
				}
			}
			if tc.clientTk != "" && strings.Contains(err.Error(), tc.clientTk) {
				t.Errorf("error %q reveals the token", err)
			}
			assertNoFiles(t, cache, "", ".partial", ".sha256")
		})
	}
}

func TestResolveSendsTokenToHubOnly(t *testing.T) {
	checkGoroutines(t)
	h := newFakeHub(t, 1000)
	cdn := newFakeHub(t, 1000) // another port, hence another host to net/http
	cdn.set(func(c *hubConfig) { c.redirect = true })
	h.set(func(c *hubConfig) { c.redirect, c.cdnBase, c.token = true, cdn.srv.URL, "from-env" })
	t.Setenv(EnvHFToken, "from-env")
	cache := t.TempDir()
	got, err := Resolve(context.Background(), testRef, h.opts(cache))
	if err != nil {
		t.Fatal(err)
	}
	assertComplete(t, got, cdn, cache)
	if a := cdn.dataAuths(); len(a) != 1 || a[0] != "" {
		t.Errorf("the CDN on another host received Authorization %q", a)
	}
}

func TestResolveUnreachable(t *testing.T) {
	checkGoroutines(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + ln.Addr().String()
	ln.Close()
	cache := t.TempDir()
	start := time.Now()
	_, err = Resolve(context.Background(), testRef, Options{CacheDir: cache, BaseURL: base})
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("took %v to fail", el)
	}
	if !errors.Is(err, ErrUnreachable) {
		t.Fatalf("error = %v, want ErrUnreachable", err)
	}
	url := base + "/" + testOwner + "/" + testRepo + "/resolve/main/" + testFile
	want := "model: download " + testRef + ": cannot reach " + url + ": "
	if !strings.HasPrefix(err.Error(), want) || !strings.HasSuffix(err.Error(), "; the file is not in the cache at "+cachePath(cache)) {
		t.Errorf("error = %q\nwant   %q<cause>; the file is not in the cache at %s", err, want, cachePath(cache))
	}
}

func TestResolveStalls(t *testing.T) {
	for _, tc := range []struct {
		name      string
		cfg       func(*hubConfig)
		wantBytes int64 // kept in the partial file
		wantMsg   string
	}{
		{"after headers", func(c *hubConfig) { c.stallAt = 4096 }, 4096, "no data from"},
		{"before headers", func(c *hubConfig) { c.noHeaders = true }, -1, "no response from"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkGoroutines(t)
			h := newFakeHub(t, 100_000)
			h.set(tc.cfg)
			cache := t.TempDir()
			opts := h.opts(cache)
			opts.StallTimeout = 200 * time.Millisecond
			start := time.Now()
			_, err := Resolve(context.Background(), testRef, opts)
			if el := time.Since(start); el > 5*time.Second {
				t.Errorf("took %v to give up", el)
			}
			if !errors.Is(err, ErrStalled) || !strings.Contains(err.Error(), tc.wantMsg) {
				t.Fatalf("error = %v, want ErrStalled with %q", err, tc.wantMsg)
			}
			fi, err := os.Stat(cachePath(cache) + ".partial")
			switch {
			case tc.wantBytes < 0 && err == nil:
				t.Errorf("partial file of %d bytes exists", fi.Size())
			case tc.wantBytes >= 0 && err != nil:
				t.Errorf("partial file not kept: %v", err)
			case tc.wantBytes >= 0 && fi.Size() != tc.wantBytes:
				t.Errorf("partial file has %d bytes, want %d", fi.Size(), tc.wantBytes)
			}
		})
	}
}

func TestResolveCancelKeepsPartial(t *testing.T) {
	checkGoroutines(t)
	h := newFakeHub(t, 400_000)
	h.set(func(c *hubConfig) { c.chunk, c.delay = 10_000, 5*time.Millisecond })
	cache := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	opts := h.opts(cache)
	opts.Progress = func(done, total int64) {
		if done >= 50_000 {
			cancel()
		}
	}
	_, err := Resolve(ctx, testRef, opts)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("error = %v, want context.Canceled", err)
	}
	fi, err := os.Stat(cachePath(cache) + ".partial")
	if err != nil || fi.Size() < 50_000 || fi.Size() >= 400_000 {
		t.Fatalf("partial file: %v, %v; want between 50000 and 400000 bytes", fi, err)
	}
	assertNoFiles(t, cache, "", ".sha256")

	// A cancelled context fails before any request.
	n := h.requestCount()
	if _, err := Resolve(ctx, testRef, opts); !errors.Is(err, context.Canceled) {
		t.Errorf("Resolve with a cancelled context: %v", err)
	}
	if h.requestCount() != n {
		t.Errorf("Resolve with a cancelled context sent a request")
	}

	h.set(func(c *hubConfig) { c.chunk = 0 })
	got, err := Resolve(context.Background(), testRef, h.opts(cache))
	if err != nil {
		t.Fatal(err)
	}
	assertComplete(t, got, h, cache)
	if r := h.rangeHeaders(); r[len(r)-1] != fmt.Sprintf("bytes=%d-", fi.Size()) {
		t.Errorf("resume Range = %q, want from %d", r[len(r)-1], fi.Size())
	}
}

func TestResolveConcurrentCallsDownloadOnce(t *testing.T) {
	checkGoroutines(t)
	h := newFakeHub(t, 200_000)
	h.set(func(c *hubConfig) { c.chunk, c.delay = 20_000, 10*time.Millisecond })
	cache := t.TempDir()
	var wg sync.WaitGroup
	paths, errs := make([]string, 3), make([]error, 3)
	for i := range paths {
		wg.Go(func() { paths[i], errs[i] = Resolve(context.Background(), testRef, h.opts(cache)) })
	}
	wg.Wait()
	for i := range paths {
		if errs[i] != nil {
			t.Fatalf("call %d: %v", i, errs[i])
		}
		assertComplete(t, paths[i], h, cache)
	}
	if n := h.requestCount(); n != 1 {
		t.Errorf("%d requests, want 1", n)
	}
}

func TestResolveProgressRateIsBounded(t *testing.T) {
	checkGoroutines(t)
	h := newFakeHub(t, 100_000)
	h.set(func(c *hubConfig) { c.chunk, c.delay = 1000, 5*time.Millisecond }) // 100 writes over >= 500 ms
	var calls [][2]int64
	opts := h.opts(t.TempDir())
	opts.Progress = func(done, total int64) { calls = append(calls, [2]int64{done, total}) }
	start := time.Now()
	if _, err := Resolve(context.Background(), testRef, opts); err != nil {
		t.Fatal(err)
	}
	el := time.Since(start)
	if max := int(el/progressInterval) + 2; len(calls) > max {
		t.Errorf("%d progress calls in %v, want at most %d", len(calls), el, max)
	}
	if len(calls) < 2 {
		t.Errorf("only %d progress calls", len(calls))
	}
	for i, c := range calls {
		if c[1] != 100_000 || (i > 0 && c[0] < calls[i-1][0]) {
			t.Fatalf("progress calls %v are not monotonic with total 100000", calls)
		}
	}
	if last := calls[len(calls)-1]; last != [2]int64{100_000, 100_000} {
		t.Errorf("last progress call %v", last)
	}
}

func TestResolveUsesEnvironment(t *testing.T) {
	checkGoroutines(t)
	h := newFakeHub(t, 1000)
	cache := t.TempDir()
	t.Setenv(EnvCacheDir, cache)
	t.Setenv(EnvHFEndpoint, h.srv.URL+"/")
	got, err := Resolve(context.Background(), testRef, Options{})
	if err != nil {
		t.Fatal(err)
	}
	assertComplete(t, got, h, cache)
}

func TestResolveRejectsBadBaseURL(t *testing.T) {
	for _, base := range []string{"ftp://hub", "huggingface.co", "http://", "://x"} {
		_, err := Resolve(context.Background(), testRef, Options{CacheDir: t.TempDir(), BaseURL: base})
		if err == nil || !strings.Contains(err.Error(), "hub address") {
			t.Errorf("BaseURL %q: error = %v", base, err)
		}
	}
}

func TestResolveSlowButSteadyIsNotStalled(t *testing.T) {
	checkGoroutines(t)
	h := newFakeHub(t, 100_000)
	h.set(func(c *hubConfig) { c.chunk, c.delay = 5000, 40*time.Millisecond }) // 20 chunks over ~800 ms
	cache := t.TempDir()
	opts := h.opts(cache)
	opts.StallTimeout = 300 * time.Millisecond
	got, err := Resolve(context.Background(), testRef, opts)
	if err != nil {
		t.Fatalf("a transfer slower than StallTimeout overall, but never silent that long, failed: %v", err)
	}
	assertComplete(t, got, h, cache)
}
