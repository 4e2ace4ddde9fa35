//go:build cgo && linux

package gpu

import (
	"fmt"
	"math"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// nvmlSource reads GPUs through an NVML library (the real one, or a mock
// in tests). ok gates every call but Init: see the package doc.
type nvmlSource struct {
	lib nvml.Interface
	ok  bool
}

func newNVML() source { return &nvmlSource{lib: nvml.New()} }

func (s *nvmlSource) open() error {
	if ret := s.lib.Init(); ret != nvml.SUCCESS {
		return fmt.Errorf("NVML: %s", ret.Error())
	}
	s.ok = true
	return nil
}

func (s *nvmlSource) close() {
	if s.ok {
		s.ok = false
		_ = s.lib.Shutdown()
	}
}

func (s *nvmlSource) read() ([]reading, error) {
	if !s.ok {
		return nil, fmt.Errorf("NVML is not initialized")
	}
	n, ret := s.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("NVML device count: %s", ret.Error())
	}
	out := make([]reading, 0, n)
	for i := range n {
		d, ret := s.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("NVML device %d: %s", i, ret.Error())
		}
		out = append(out, readDevice(i, d))
	}
	return out, nil
}

// readDevice reads one device; what it does not support stays NaN.
func readDevice(i int, d nvml.Device) reading {
	nan := math.NaN()
	r := reading{index: i, utilization: nan, memUsed: nan, memTotal: nan, power: nan, temperature: nan}
	if v, ret := d.GetName(); ret == nvml.SUCCESS {
		r.name = v
	}
	if v, ret := d.GetUUID(); ret == nvml.SUCCESS {
		r.uuid = v
	}
	if u, ret := d.GetUtilizationRates(); ret == nvml.SUCCESS {
		r.utilization = float64(u.Gpu) / 100
	}
	if m, ret := d.GetMemoryInfo(); ret == nvml.SUCCESS {
		r.memUsed, r.memTotal = float64(m.Used), float64(m.Total)
	}
	if mw, ret := d.GetPowerUsage(); ret == nvml.SUCCESS {
		r.power = float64(mw) / 1000
	}
	if c, ret := d.GetTemperature(nvml.TEMPERATURE_GPU); ret == nvml.SUCCESS {
		r.temperature = float64(c)
	}
	return r
}
