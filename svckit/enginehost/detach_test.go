package enginehost

import (
	"context"
	"errors"
	"testing"
	"time"
)

type key struct{}

// TestDetach: the detached context keeps the parent's values, outlives its
// cancellation and deadline, and ends with the cause its own cancel gives.
func TestDetach(t *testing.T) {
	parent, cancelParent := context.WithTimeout(context.WithValue(context.Background(), key{}, "v"), time.Hour)
	ctx, cancel := Detach(parent)
	cancelParent()
	if ctx.Value(key{}) != "v" {
		t.Error("the detached context lost the parent's value")
	}
	if _, ok := ctx.Deadline(); ok || ctx.Err() != nil {
		t.Errorf("the detached context has a deadline or ended with its parent: %v", ctx.Err())
	}
	why := errors.New("transfer over")
	cancel(why)
	if !errors.Is(ctx.Err(), context.Canceled) || context.Cause(ctx) != why {
		t.Errorf("after cancel: err %v, cause %v; want Canceled, %v", ctx.Err(), context.Cause(ctx), why)
	}
}
