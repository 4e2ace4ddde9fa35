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

// TestPDSendsOnlyWhatDecodeLacks: a conversation's next turn through PD
// moves only the pages decode's prefix cache lacks — the KV bytes received
// are those of the new tokens past the pages the first turn left cached —
// and generates what a decode worker without a cache does.
func TestPDSendsOnlyWhatDecodeLacks(t *testing.T) {
	p := startPD(t, nil, nil, nil)
	ref := startPD(t, nil, []string{"--prefix-cache=false"}, nil)
	const ps = 16 // the test workers' page size (common)
	received := func(pp *pd) float64 { return pp.decode.Counter(t, "baton:kv_transfer_bytes_total") }

	b0 := received(p)
	turn1, _ := p.start(t, request("turn-1", 50, 8, p.prefill.Addr())).cachedTokens(t)
	b1 := received(p)
	// Turn 2 starts with turn 1's prompt: decode holds its three full
	// pages (48 tokens), so only the 22 tokens after them come.
	turn2, _ := p.start(t, request("turn-2", 70, 8, p.prefill.Addr())).cachedTokens(t)
	b2 := received(p)
	perToken := (b1 - b0) / 50
	if perToken <= 0 {
		t.Fatalf("turn 1 received %v bytes", b1-b0)
	}
	if got, want := b2-b1, perToken*float64(70-3*ps); got != want {
		t.Errorf("turn 2 received %v bytes, want %v (%v per token × %d tokens)", got, want, perToken, 70-3*ps)
	}
	want1, _ := ref.start(t, request("turn-1", 50, 8, ref.prefill.Addr())).cachedTokens(t)
	want2, _ := ref.start(t, request("turn-2", 70, 8, ref.prefill.Addr())).cachedTokens(t)
	if !equalU32(turn1, want1) || !equalU32(turn2, want2) {
		t.Errorf("with decode's cache %v, %v; without %v, %v", turn1, turn2, want1, want2)
	}
	if got := ref.decode.Counter(t, "baton:kv_transfer_bytes_total"); got != perToken*(50+70) {
		t.Errorf("without decode's cache %v bytes received, want every page (%v)", got, perToken*120)
	}
	p.waitIdle(t)
	ref.waitIdle(t)
}
