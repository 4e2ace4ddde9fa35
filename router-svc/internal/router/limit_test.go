package router

import (
	"flag"
	"strings"
	"testing"

	"github.com/baton-serving/baton/svckit/apiconv"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestLimiter(t *testing.T) {
	l := newLimiter(2)
	r1, err1 := l.acquire()
	r2, err2 := l.acquire()
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	if _, err := l.acquire(); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "--max-concurrent-requests") {
		t.Errorf("third acquire: %v", err)
	}
	r1()
	r3, err := l.acquire()
	if err != nil {
		t.Errorf("after a release: %v", err)
	}
	r2()
	r3()
	for _, u := range []*limiter{nil, newLimiter(0)} {
		for range 1000 {
			if _, err := u.acquire(); err != nil {
				t.Fatalf("unbounded limiter: %v", err)
			}
		}
	}
}

func TestLimitFlags(t *testing.T) {
	cases := []struct {
		args []string
		want string // "" for valid
	}{
		{nil, ""},
		{[]string{"--max-prompt-tokens", "-1"}, "--max-prompt-tokens"},
		{[]string{"--max-new-tokens-limit", "100"}, "--max-new-tokens 256 exceeds --max-new-tokens-limit 100"},
		{[]string{"--max-new-tokens-limit", "100", "--max-new-tokens", "50"}, ""},
		{[]string{"--max-concurrent-requests", "-2"}, "--max-concurrent-requests"},
		{[]string{"--max-inflight-per-client", "-1"}, "--max-inflight-per-client"},
		{[]string{"--max-inflight-per-client", "0"}, ""},
		{[]string{"--request-timeout", "-1s"}, "--request-timeout"},
		{[]string{"--max-body-bytes", "10"}, "--max-body-bytes"},
		{[]string{"--max-n", "0"}, "--max-n: 0"},
		{[]string{"--max-n", "129"}, "--max-n: 129"},
		{[]string{"--max-n", "1"}, ""},
	}
	for _, c := range cases {
		s := New()
		fs := flag.NewFlagSet("router", flag.ContinueOnError)
		s.AddFlags(fs)
		if err := fs.Parse(c.args); err != nil {
			t.Fatal(err)
		}
		err := s.Validate()
		if (c.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%v: %v, want %q", c.args, err, c.want)
		}
	}
	s := New()
	fs := flag.NewFlagSet("router", flag.ContinueOnError)
	s.AddFlags(fs)
	_ = fs.Parse(nil)
	if s.limits.maxConcurrent != defaultMaxConcurrent || s.limits.requestTimeout != defaultRequestTimeout || s.limits.maxBodyBytes != defaultMaxBodyBytes ||
		s.limits.maxPerClient != defaultMaxPerClient || s.limits.maxN != apiconv.DefaultMaxN {
		t.Errorf("defaults = %+v", s.limits)
	}
}
