package modelfile

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// checkGoroutines fails the test if goroutines started during it are still
// running shortly after its other cleanups (servers, transports) ran. Call
// it first so that its cleanup runs last; tests using it must not be
// parallel.
func checkGoroutines(t *testing.T) {
	t.Helper()
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(3 * time.Second)
		for {
			n := runtime.NumGoroutine()
			if n <= before {
				return
			}
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				buf = buf[:runtime.Stack(buf, true)]
				t.Errorf("%d goroutines left running (was %d before the test):\n%s", n-before, before, buf)
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
}

// testContent returns n reproducible pseudo-random bytes and their sha256.
func testContent(n int) ([]byte, string) {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(1, uint64(n)))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	sum := sha256.Sum256(b)
	return b, hex.EncodeToString(sum[:])
}

// hubConfig sets how a fakeHub behaves.
type hubConfig struct {
	announce  string // hash put in the hash header; "" means the true one, "-" none
	hashInTag bool   // announce in ETag instead of X-Linked-Etag
	redirect  bool   // answer with a 302 to cdnBase+/cdn/<file>, as the hub does for LFS files
	cdnBase   string // where redirects go; "" is this server
	noRanges  bool   // ignore Range and always answer 200
	cutAfter  int    // the first cuts data responses drop the connection after this many body bytes
	cuts      int
	stallAt   int           // when > 0, data responses stop after this many bytes until the client leaves
	noHeaders bool          // never answer; wait for the client to leave
	chunk     int           // when > 0, send the body in chunks of this size...
	delay     time.Duration // ...with this pause after each
	status    int           // when non-zero, answer the resolve URL with this status
	token     string        // when set, the resolve URL requires it
}

// fakeHub imitates the Hugging Face hub's resolve endpoint for one file,
// and its CDN.
type fakeHub struct {
	content []byte
	sha     string
	srv     *httptest.Server

	mu       sync.Mutex
	cfg      hubConfig
	requests int      // requests to the resolve URL
	ranges   []string // their Range headers
	auths    []string // Authorization headers on data responses
}

const (
	testOwner = "acme"
	testRepo  = "tiny-llm"
	testFile  = "model.Q8_0.gguf"
	testRef   = "hf://" + testOwner + "/" + testRepo + "/" + testFile
)

func newFakeHub(t *testing.T, size int) *fakeHub {
	t.Helper()
	h := &fakeHub{}
	h.content, h.sha = testContent(size)
	h.srv = httptest.NewServer(h)
	t.Cleanup(h.srv.Close)
	return h
}

// set changes the configuration; the mutex orders it before the requests
// that follow.
func (h *fakeHub) set(f func(c *hubConfig)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	f(&h.cfg)
}

func (h *fakeHub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	resolvePath := "/" + testOwner + "/" + testRepo + "/resolve/main/" + testFile
	h.mu.Lock()
	c := h.cfg
	if r.URL.Path == resolvePath {
		h.requests++
		h.ranges = append(h.ranges, r.Header.Get("Range"))
	}
	h.mu.Unlock()
	switch {
	case r.URL.Path == resolvePath:
		if c.noHeaders {
			<-r.Context().Done()
			return
		}
		if c.status != 0 {
			w.Header().Set("X-Error-Message", "Entry not found\n")
			http.Error(w, "not here", c.status)
			return
		}
		if c.token != "" && r.Header.Get("Authorization") != "Bearer "+c.token {
			http.Error(w, "Invalid credentials", http.StatusUnauthorized)
			return
		}
		if c.redirect {
			h.setHash(w, c, "X-Linked-Etag")
			w.Header().Set("ETag", `"0123456789abcdef0123456789abcdef01234567"`) // a git blob id, not a content hash
			http.Redirect(w, r, c.cdnBase+"/cdn/"+testFile+"?sig=xyz", http.StatusFound)
			return
		}
		h.serveData(w, r, c)
	case r.URL.Path == "/cdn/"+testFile && c.redirect:
		// A CDN's ETag is not the sha256 of the file; it must be ignored.
		w.Header().Set("ETag", `"`+strings.Repeat("ab", 32)+`"`)
		h.serveData(w, r, c)
	default:
		http.NotFound(w, r)
	}
}

func (h *fakeHub) setHash(w http.ResponseWriter, c hubConfig, key string) {
	switch c.announce {
	case "-":
	case "":
		w.Header().Set(key, `"`+h.sha+`"`)
	default:
		w.Header().Set(key, `"`+c.announce+`"`)
	}
}

func (h *fakeHub) serveData(w http.ResponseWriter, r *http.Request, c hubConfig) {
	h.mu.Lock()
	h.auths = append(h.auths, r.Header.Get("Authorization"))
	cut := h.cfg.cuts > 0
	if cut {
		h.cfg.cuts--
	}
	h.mu.Unlock()
	if !c.redirect {
		if c.hashInTag {
			h.setHash(w, c, "ETag")
		} else {
			h.setHash(w, c, "X-Linked-Etag")
		}
	}
	if !c.noRanges && !cut && c.stallAt == 0 && c.chunk == 0 {
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(h.content))
		return
	}
	w.Header().Set("Content-Length", fmt.Sprint(len(h.content)))
	w.WriteHeader(http.StatusOK)
	body := h.content
	switch {
	case cut:
		w.Write(body[:c.cutAfter])
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler) // drops the connection mid-body
	case c.stallAt > 0:
		w.Write(body[:c.stallAt])
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	case c.chunk > 0:
		for len(body) > 0 {
			n := min(c.chunk, len(body))
			if _, err := w.Write(body[:n]); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			body = body[n:]
			select {
			case <-time.After(c.delay):
			case <-r.Context().Done():
				return
			}
		}
	default:
		w.Write(body)
	}
}

func (h *fakeHub) dataAuths() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.auths...)
}

func (h *fakeHub) requestCount() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.requests
}

func (h *fakeHub) rangeHeaders() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.ranges...)
}

func (h *fakeHub) opts(cache string) Options {
	return Options{CacheDir: cache, BaseURL: h.srv.URL, StallTimeout: 5 * time.Second}
}
