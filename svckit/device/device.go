// Package device chooses what a worker computes on: the --device flag of
// prefill-svc, decode-svc, batonctl run and batonctl bench-engine.
//
//	auto     CUDA GPU 0 when the binary was built with CUDA (build tag
//	         cuda) and the driver sees a GPU, else the CPU (the default)
//	cpu      the CPU backend, whatever the binary has
//	cuda     GPU 0; an error when there is none or no CUDA in the binary
//	cuda:N   GPU N
//
// Open returns the backend with what was chosen and why, for the start-up
// log, /debug/workers and the GPU gauges.
package device

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/baton-serving/baton/kernels"
	"github.com/baton-serving/baton/kernels/cuda"
)

// ErrUnavailable reports a device that was asked for by name and cannot
// be used: no CUDA in the binary, no driver, no such GPU.
var ErrUnavailable = errors.New("device unavailable")

// Kind is a kind of device.
type Kind int

const (
	// Auto picks CUDA where it can, else the CPU.
	Auto Kind = iota
	CPU
	CUDA
)

// Spec is a parsed --device value.
type Spec struct {
	Kind Kind
	// Index is the GPU ordinal for CUDA (0 unless cuda:N).
	Index int
}

// FlagHelp is the --device flag's usage text.
const FlagHelp = "what to compute on: auto (a CUDA GPU when the binary has CUDA and the driver sees one, else the CPU), cpu, cuda (GPU 0) or cuda:N"

// Parse reads a --device value.
func Parse(s string) (Spec, error) {
	switch v := strings.ToLower(strings.TrimSpace(s)); {
	case v == "auto" || v == "":
		return Spec{Kind: Auto}, nil
	case v == "cpu":
		return Spec{Kind: CPU}, nil
	case v == "cuda" || v == "gpu":
		return Spec{Kind: CUDA}, nil
	case strings.HasPrefix(v, "cuda:"):
		n, err := strconv.Atoi(strings.TrimPrefix(v, "cuda:"))
		if err != nil || n < 0 || n > 1023 {
			return Spec{}, fmt.Errorf("%q: want cuda:N with N a GPU ordinal (0, 1, …)", s)
		}
		return Spec{Kind: CUDA, Index: n}, nil
	}
	return Spec{}, fmt.Errorf("%q: want auto, cpu, cuda or cuda:N", s)
}

// String is the canonical spelling of s, as Parse reads it.
func (s Spec) String() string {
	switch s.Kind {
	case CPU:
		return "cpu"
	case CUDA:
		return "cuda:" + strconv.Itoa(s.Index)
	}
	return "auto"
}

// Set implements flag.Value.
func (s *Spec) Set(v string) error {
	p, err := Parse(v)
	if err != nil {
		return err
	}
	*s = p
	return nil
}

// Choice is the device Open chose.
type Choice struct {
	Backend kernels.Backend
	// Kind is CPU or CUDA; Index the GPU ordinal (-1 on the CPU).
	Kind  Kind
	Index int
	// Reason says why auto chose it ("requested" when named).
	Reason string
	// UUID is the GPU's, as the driver reports it ("" on the CPU): NVML
	// numbers GPUs differently from CUDA, the UUID matches them.
	UUID string
}

// String is what /debug/workers and the logs show: "cpu" or "cuda:N",
// with the backend's own description.
func (c Choice) String() string {
	if c.Kind == CUDA {
		return fmt.Sprintf("cuda:%d (%s)", c.Index, c.Backend.Name())
	}
	return c.Backend.Name()
}

// Label is the short name: "cpu" or "cuda:N".
func (c Choice) Label() string {
	if c.Kind == CUDA {
		return "cuda:" + strconv.Itoa(c.Index)
	}
	return "cpu"
}

// Open opens the backend s names; threads sizes the CPU backend (0: the
// usable cores). A device named explicitly that cannot be used is an error
// wrapping ErrUnavailable that says why; auto falls back to the CPU and
// says why in Reason. The caller closes Choice.Backend.
func Open(s Spec, threads int) (Choice, error) {
	cpu := func(reason string) Choice {
		return Choice{Backend: kernels.NewCPU(threads), Kind: CPU, Index: -1, Reason: reason}
	}
	switch s.Kind {
	case CPU:
		return cpu("requested"), nil
	case CUDA:
		b, err := cuda.New(cuda.Options{Device: s.Index})
		if err != nil {
			return Choice{}, fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		return gpu(b, s.Index, "requested"), nil
	}
	b, err := cuda.New(cuda.Options{})
	switch {
	case err == nil:
		return gpu(b, 0, "the binary has CUDA and the driver sees a GPU"), nil
	case errors.Is(err, cuda.ErrNotBuilt):
		return cpu("this binary was built without CUDA (build tag cuda)"), nil
	default:
		return cpu("no usable GPU: " + err.Error()), nil
	}
}

func gpu(b kernels.Backend, index int, reason string) Choice {
	c := Choice{Backend: b, Kind: CUDA, Index: index, Reason: reason}
	if u, ok := b.(interface{ UUID() string }); ok {
		c.UUID = u.UUID()
	}
	return c
}
