//go:build !cgo || !linux

package gpu

import "errors"

// noNVML stands in for NVML in builds that cannot load it (go-nvml needs
// cgo and Linux): the gauges say baton_gpu_available 0.
type noNVML struct{}

func newNVML() source { return noNVML{} }

func (noNVML) open() error {
	return errors.New("NVML needs a cgo build on Linux; this binary has none")
}
func (noNVML) read() ([]reading, error) { return nil, errors.New("no NVML") }
func (noNVML) close()                   {}
