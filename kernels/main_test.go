package kernels

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if a CPU backend's worker goroutines
// outlive them: every backend a test makes must be closed.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
