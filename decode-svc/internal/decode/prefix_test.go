package decode

import (
	"errors"
	"io"
	"testing"
)

// cachedTokens reads a Generate stream to its end and returns its tokens
// and the final usage's cached_tokens.
func (c *call) cachedTokens(t *testing.T) ([]uint32, uint32) {
	t.Helper()
	var toks []uint32
	var cached uint32
	for {
		resp, err := c.stream.Recv()
		if errors.Is(err, io.EOF) {
			return toks, cached
		}
		if err != nil {
			t.Fatal(err)
		}
		toks = append(toks, resp.GetEvent().GetTokenIds()...)
		if u := resp.GetEvent().GetUsage(); u != nil {
			cached = u.GetCachedTokens()
		}
	}
}

// TestPrefixCacheCachedTokens: the same 50-token prompt twice reuses three
// full 16-token pages the second time — colocated, decode's own cache; PD,
// prefill's, which decode reports — with output identical to the first
// time; both workers end idle (their cached pages held by no request).
func TestPrefixCacheCachedTokens(t *testing.T) {
	p := startPD(t, nil, nil, nil)
	for _, tc := range []struct{ name, endpoint string }{{"colocated", localPrefill}, {"pd", p.prefill.Addr()}} {
		first, c1 := p.start(t, request(tc.name+"-1", 50, 8, tc.endpoint)).cachedTokens(t)
		again, c2 := p.start(t, request(tc.name+"-2", 50, 8, tc.endpoint)).cachedTokens(t)
		if c1 != 0 || c2 != 48 {
			t.Errorf("%s: cached_tokens %d then %d, want 0 then 48", tc.name, c1, c2)
		}
		if len(first) != 8 || !equalU32(first, again) {
			t.Errorf("%s: with the cache %v, without %v", tc.name, again, first)
		}
	}
	if got := p.prefill.Counter(t, "baton:prefix_cache_pages"); got == 0 {
		t.Error("prefill caches no page")
	}
	p.waitIdle(t)
}

func equalU32(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
