package model

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if a model's backend outlives them:
// Close must stop every worker goroutine the model started.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
