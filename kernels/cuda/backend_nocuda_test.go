//go:build !cuda

package cuda

import (
	"errors"
	"strings"
	"testing"
)

func TestNewWithoutCUDA(t *testing.T) {
	b, err := New(Options{})
	if b != nil || !errors.Is(err, ErrNotBuilt) {
		t.Fatalf("New = %v, %v; want nil, ErrNotBuilt", b, err)
	}
	if !strings.Contains(err.Error(), "built without CUDA (build tag cuda)") {
		t.Errorf("error %q does not say how to get CUDA", err)
	}
}
