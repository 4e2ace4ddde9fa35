package device

import (
	"errors"
	"strings"
	"testing"

	"github.com/baton-serving/baton/kernels/cuda"
)

func TestParse(t *testing.T) {
	for in, want := range map[string]Spec{
		"auto": {Kind: Auto}, "": {Kind: Auto}, "cpu": {Kind: CPU}, "CPU": {Kind: CPU},
		"cuda": {Kind: CUDA}, "gpu": {Kind: CUDA}, "cuda:0": {Kind: CUDA}, "cuda:3": {Kind: CUDA, Index: 3},
	} {
		got, err := Parse(in)
		if err != nil || got != want {
			t.Errorf("Parse(%q) = %+v, %v; want %+v", in, got, err, want)
		}
		if again, err := Parse(got.String()); err != nil || again != got {
			t.Errorf("Parse(%q.String() = %q) = %+v, %v", in, got.String(), again, err)
		}
	}
	for _, in := range []string{"tpu", "cuda:", "cuda:-1", "cuda:x", "cuda:1024", "cuda:0:1", "cpu:0"} {
		if _, err := Parse(in); err == nil || !strings.Contains(err.Error(), in) {
			t.Errorf("Parse(%q) = %v, want an error quoting it", in, err)
		}
	}
}

// TestOpenWithoutCUDA runs in the default build (no cuda tag): auto falls
// back to the CPU and says why; a GPU asked for by name is refused.
func TestOpenWithoutCUDA(t *testing.T) {
	if _, err := cuda.New(cuda.Options{}); !errors.Is(err, cuda.ErrNotBuilt) {
		t.Skipf("this build has CUDA (%v): the cuda-tagged tests cover it", err)
	}
	c, err := Open(Spec{Kind: Auto}, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Backend.Close()
	if c.Kind != CPU || c.Index != -1 || c.Label() != "cpu" || !strings.Contains(c.Reason, "without CUDA") || c.UUID != "" {
		t.Errorf("auto = %+v (%s), want the CPU because the build has no CUDA", c, c)
	}
	if !strings.HasPrefix(c.String(), "cpu (") {
		t.Errorf("String() = %q, want the CPU backend's name", c)
	}
	cpu, err := Open(Spec{Kind: CPU}, 1)
	if err != nil || cpu.Kind != CPU || cpu.Reason != "requested" {
		t.Errorf("cpu = %+v, %v", cpu, err)
	}
	cpu.Backend.Close()
	for _, s := range []Spec{{Kind: CUDA}, {Kind: CUDA, Index: 7}} {
		c, err := Open(s, 1)
		if !errors.Is(err, ErrUnavailable) || !errors.Is(err, cuda.ErrNotBuilt) || c.Backend != nil {
			t.Errorf("Open(%s) = %+v, %v; want ErrUnavailable wrapping ErrNotBuilt", s, c, err)
		}
	}
}
