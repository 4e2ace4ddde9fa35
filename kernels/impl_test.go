package kernels

import (
	"testing"

	"github.com/baton-serving/baton/kernels/vec"
)

// forEachVecImpl runs f once for every implementation of kernels/vec this
// CPU has (avx512, avx2, purego on a machine with AVX-512), each in a
// subtest with that implementation forced, so that the backend's tests
// cover the kernels other CPUs pick as well as the preferred one. The
// tests that use it must not run in parallel with others: the
// implementation is package state of vec.
func forEachVecImpl(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	for _, name := range vec.Implementations() {
		t.Run(name, func(t *testing.T) {
			restore, err := vec.SetImplementation(name)
			if err != nil {
				t.Fatal(err)
			}
			defer restore()
			f(t)
		})
	}
}

// TestForEachVecImpl checks that the hook really switches the kernels the
// backend runs.
func TestForEachVecImpl(t *testing.T) {
	var seen []string
	forEachVecImpl(t, func(t *testing.T) {
		c := newTestCPU(t, 1)
		seen = append(seen, c.Name())
	})
	if len(seen) != len(vec.Implementations()) {
		t.Fatalf("ran %d implementations, the CPU has %v", len(seen), vec.Implementations())
	}
	for i, name := range vec.Implementations() {
		if want := "cpu (" + name + ", 1 threads)"; seen[i] != want {
			t.Errorf("implementation %d: backend %q, want %q", i, seen[i], want)
		}
	}
}
