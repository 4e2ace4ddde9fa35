package prefill

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a test leaves goroutines behind: every
// worker, stream, transfer and scheduler a test starts must be gone.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
