package modelfile

import (
	"net/http"
	"strings"
	"testing"
)

func TestParseContentRange(t *testing.T) {
	for _, tc := range []struct {
		in                 string
		first, last, total int64
		ok                 bool
	}{
		{"bytes 0-99/100", 0, 99, 100, true},
		{"bytes 100-199/*", 100, 199, -1, true},
		{"bytes */500", -1, -1, 500, true},
		{"bytes 5-4/10", 0, 0, 0, false},
		{"bytes 0-10/10", 0, 0, 0, false},
		{"bytes */*", 0, 0, 0, false},
		{"bytes -1-5/10", 0, 0, 0, false},
		{"items 0-1/2", 0, 0, 0, false},
		{"bytes 0-1", 0, 0, 0, false},
		{"", 0, 0, 0, false},
	} {
		f, l, n, err := parseContentRange(tc.in)
		if (err == nil) != tc.ok || tc.ok && (f != tc.first || l != tc.last || n != tc.total) {
			t.Errorf("parseContentRange(%q) = %d, %d, %d, %v", tc.in, f, l, n, err)
		}
	}
}

func TestExpectedSHA256(t *testing.T) {
	sum := strings.Repeat("aB", 32)
	lower := strings.ToLower(sum)
	other := strings.Repeat("cd", 32)
	hdr := func(kv ...string) http.Header {
		h := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			h.Set(kv[i], kv[i+1])
		}
		return h
	}
	for _, tc := range []struct {
		name    string
		headers []http.Header
		want    string
	}{
		{"linked etag quoted", []http.Header{hdr("X-Linked-Etag", `"`+sum+`"`)}, lower},
		{"etag bare", []http.Header{hdr("ETag", sum)}, lower},
		{"linked etag wins", []http.Header{hdr("ETag", `"`+other+`"`, "X-Linked-Etag", `"`+sum+`"`)}, lower},
		{"linked etag on a later hop wins", []http.Header{hdr("ETag", `"`+other+`"`), hdr("X-Linked-Etag", sum)}, lower},
		{"git blob id ignored", []http.Header{hdr("ETag", `"0123456789abcdef0123456789abcdef01234567"`)}, ""},
		{"weak etag ignored", []http.Header{hdr("ETag", `W/"`+sum+`"`)}, ""},
		{"non-hex ignored", []http.Header{hdr("ETag", strings.Repeat("zz", 32))}, ""},
		{"none", []http.Header{{}}, ""},
	} {
		if got := expectedSHA256(tc.headers); got != tc.want {
			t.Errorf("%s: got %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestOneLine(t *testing.T) {
	if got := oneLine("  a\nb\x1b[31m  ", 100); got != "a b [31m" {
		t.Errorf("oneLine = %q", got)
	}
	if got := oneLine(strings.Repeat("é", 10), 5); got != "éé..." {
		t.Errorf("oneLine cut = %q", got)
	}
}
