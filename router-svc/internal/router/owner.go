package router

// Which requests a caller may see: with API keys on, a client sees (lists,
// aborts) only the requests its own key made.

import (
	"context"
	"slices"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/router-svc/internal/openai"
)

// ownedBy reports whether the caller of ctx may see r: authentication is
// off (r carries no key), or the caller's key is the one that made r.
func ownedBy(ctx context.Context, r *request) bool {
	if !r.keyed {
		return true
	}
	caller, ok := openai.CallerKey(ctx)
	return ok && caller == r.owner
}

// listFor returns the requests the caller of ctx may see, oldest first.
// The admin listener's /debug/requests uses list, which shows all.
func (t *inflight) listFor(ctx context.Context) []*batonv1.RequestInfo {
	t.mu.Lock()
	rs := make([]*request, 0, len(t.reqs))
	for _, r := range t.reqs {
		if ownedBy(ctx, r) {
			rs = append(rs, r)
		}
	}
	t.mu.Unlock()
	slices.SortFunc(rs, func(a, b *request) int { return a.start.Compare(b.start) })
	now := time.Now()
	out := make([]*batonv1.RequestInfo, len(rs))
	for i, r := range rs {
		out[i] = r.info(now)
	}
	return out
}
