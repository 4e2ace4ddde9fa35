package router

// Which requests a caller may see: with API keys on, a client sees (lists,
// aborts) only the requests its own key made.

import (
	"context"

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
	return t.listWhere(func(r *request) bool { return ownedBy(ctx, r) })
}
